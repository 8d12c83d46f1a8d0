"""Why a trial's held-out answers are wrong: each wrong text-to-SQL answer of a logged evaluation run again in the
task's sandbox and counted by kind, so a learning curve says which mistakes RL removed and which it left.

Run: python -m benchmarks.answer_errors [NAME=]RUN_DIR[@STEP] [NAME=]RUN_DIR[@STEP] ...

The arguments name evaluations as `benchmarks.paired_trials` does (the last one of a run without `@STEP`). A run's
`config.yaml` says which data its questions come from (a Spider release's path, or the bundled data); each wrong
answer runs on the question's primary database, and its result is set beside the gold query's. The kinds:
- `unknown column`, `unknown table`: the query names a column or table the schema lacks (the model read the schema
  wrong);
- `GROUP BY`: a column outside GROUP BY and any aggregate (SQLite allows it, DuckDB does not);
- `other error`, `blocked`, `timed out`: any other failure to run;
- `empty`, `other columns`, `other rows`, `other values`: it ran, and its result is empty where the gold one is not,
  or has another number of columns, another number of rows, or the same shape with other values.
The last line is the counts as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

from rich.console import Console
from rich.table import Table

from autoresearch.trials.config import TrialConfig, load_trial_config
from autoresearch.trials.run_dir import RunDirectory
from benchmarks import command_line
from benchmarks.paired_trials import EvaluationNotFoundError, LoggedEvaluation, load_evaluation
from tasks.registry import open_task
from tasks.text2sql.prompts import parse_completion
from tasks.text2sql.reward.scoring import Scorer
from tasks.text2sql.sql.sandbox import ExecutionResult, ExecutionStatus
from tasks.text2sql.task import Text2SqlTask

KINDS = (
    "right",
    "unknown column",
    "unknown table",
    "GROUP BY",
    "other error",
    "blocked",
    "timed out",
    "empty",
    "other columns",
    "other rows",
    "other values",
)
# Phrases of DuckDB's binder errors, by the kind they mean.
_ERROR_KINDS = (
    ("GROUP BY", ("must appear in the GROUP BY clause",)),
    ("unknown column", ("not found in FROM clause", "does not have a column", "Referenced column")),
    ("unknown table", ("Table with name", "Referenced table")),
)


def error_kind(result: ExecutionResult) -> str | None:
    """The kind of a query that did not run; None for one that ran."""
    if result.status is ExecutionStatus.OK:
        return None
    if result.status is ExecutionStatus.BLOCKED:
        return "blocked"
    if result.status is ExecutionStatus.TIMED_OUT:
        return "timed out"
    message = result.error or ""
    return next((kind for kind, phrases in _ERROR_KINDS if any(p in message for p in phrases)), "other error")


def result_kind(predicted: ExecutionResult, gold: ExecutionResult) -> str:
    """How a wrong answer's result differs from the gold one's."""
    kind = error_kind(predicted)
    if kind is not None:
        return kind
    if not predicted.rows and gold.rows:
        return "empty"
    if len(predicted.columns) != len(gold.columns):
        return "other columns"
    if len(predicted.rows) != len(gold.rows):
        return "other rows"
    return "other values"


def count_kinds(evaluation: LoggedEvaluation, task: Text2SqlTask, scorer: Scorer) -> Counter[str]:
    """The evaluation's answers counted by kind (`KINDS`)."""
    examples = {e.id: e for e in task.dataset.split(evaluation.report.split)}
    wrong = [answer for answer in evaluation.report.answers if not answer.correct]
    queries = [
        (task.dataset.database(examples[a.example_id].db_id).path, parse_completion(a.completion).sql, None)
        for a in wrong
    ]
    counts = Counter({"right": len(evaluation.report.answers) - len(wrong)})
    for answer, predicted in zip(wrong, scorer.sandbox.execute_many(queries), strict=True):
        gold = scorer.gold_results(examples[answer.example_id])[0]
        counts[result_kind(predicted, gold)] += 1
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("evaluations", nargs="+", metavar="[NAME=]RUN_DIR[@STEP]")
    args = parser.parse_args(argv)
    console = Console(width=160)
    try:
        evaluations = [load_evaluation(argument) for argument in args.evaluations]
    except EvaluationNotFoundError as error:
        console.print(f"[red]error:[/red] {error}")
        return 2
    # Evaluations of one data source (several steps of one run, or runs on one release) share its task and sandbox:
    # opening a release's task loads every database and gold query.
    by_source: dict[str, list[LoggedEvaluation]] = {}
    configs: dict[str, TrialConfig] = {}
    for evaluation in evaluations:
        config = load_trial_config(RunDirectory(evaluation.run_dir).config_path)
        key = f"{config.task}:{config.data.model_dump_json()}"
        configs.setdefault(key, config)
        by_source.setdefault(key, []).append(evaluation)
    counted: dict[str, Counter[str]] = {}
    for key, group in by_source.items():
        with open_task(configs[key].task, configs[key].data) as task, Scorer(task.dataset) as scorer:
            counted.update((evaluation.name, count_kinds(evaluation, task, scorer)) for evaluation in group)
    counts = {evaluation.name: counted[evaluation.name] for evaluation in evaluations}
    table = Table(title="held-out answers by kind")
    table.add_column("kind")
    for name in counts:
        table.add_column(name, justify="right")
    for kind in KINDS:
        table.add_row(kind, *(str(counts[name][kind]) for name in counts))
    console.print(table)
    console.print(json.dumps({name: {k: c[k] for k in KINDS} for name, c in counts.items()}), soft_wrap=True)
    console.print(command_line("benchmarks.answer_errors", argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
