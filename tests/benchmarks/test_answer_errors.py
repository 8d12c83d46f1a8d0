"""benchmarks.answer_errors: a logged evaluation's wrong answers, run again in the sandbox, counted by kind."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from benchmarks.answer_errors import KINDS, count_kinds
from benchmarks.paired_trials import LoggedEvaluation
from tasks.report import HeldOutAnswer, HeldOutReport
from tasks.text2sql.reward.scoring import Scorer
from tasks.text2sql.task import Text2SqlTask


def test_each_kind_of_wrong_answer_is_told_apart(text2sql: Text2SqlTask, scorer: Scorer) -> None:
    # A question whose gold answer is one count, so every kind of mistake can be written against it.
    example = next(e for e in text2sql.dataset.split("dev") if e.gold_sql.upper().startswith("SELECT COUNT(*) FROM"))
    gold = example.gold_sql
    written = {
        "unknown column": "SELECT nope FROM (SELECT 1 AS x)",
        "unknown table": "SELECT * FROM no_such_table",
        "GROUP BY": "SELECT x, count(*) FROM (SELECT 1 AS x, 2 AS y) GROUP BY y",
        "other error": "SELECT CAST('x' AS INTEGER)",
        "empty": f"SELECT * FROM ({gold}) AS g WHERE 1 = 0",
        "other columns": f"SELECT *, 1 FROM ({gold}) AS g",
        "other rows": f"SELECT * FROM ({gold}) AS g UNION ALL SELECT * FROM ({gold}) AS h",
        "other values": f"SELECT -1 - ({gold})",
    }
    answers = [HeldOutAnswer(example_id=example.id, difficulty="easy", completion=gold, correct=True)]
    answers += [
        HeldOutAnswer(example_id=example.id, difficulty="easy", completion=sql + ";", correct=False)
        for sql in written.values()
    ]
    evaluation = LoggedEvaluation("made", HeldOutReport.of(answers, "dev", ["easy"]), Path("written-here"))
    counts = count_kinds(evaluation, text2sql, scorer)
    assert counts == Counter({"right": 1, **dict.fromkeys(written, 1)})
    assert set(counts) <= set(KINDS)
