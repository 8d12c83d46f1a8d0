"""Text-to-SQL reward components written as code: what the function receives, and the gate that admits it.

The function (`SIGNATURE` says it to the LLM and to users) gets the completion, the example and the execution
result as plain values (str, int, float, bool, None, lists and dicts of them), so that they cross to its sandboxed
worker as JSON. The gate runs it on a probe batch from the training split: for each of a few questions its gold
answer, another question's gold SQL over the same database, and the gold SQL cut to no rows; wrong answers that
happen to be right (a question whose gold result is empty) are left out. Right answers must score above wrong ones
on average, and every value must be a number in [-1, 1], or the function is refused with the numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from tasks.reward_code.admission import VALUE_RANGE, Verdict, judge
from tasks.reward_code.sandbox import CodeLimits, CodeSandbox
from tasks.reward_code.static_check import ALLOWED_MODULES
from tasks.text2sql.dataset import Example
from tasks.text2sql.rewards import DEFAULT_REWARD_SPEC
from tasks.text2sql.sandbox import ExecutionResult

if TYPE_CHECKING:
    from tasks.text2sql.task import Text2SqlTask

# Rows of a result the function is shown, its own and the gold one's.
SHOWN_ROWS = 20
# Questions of the training split the gate probes, each with its right answer and up to two wrong ones.
PROBE_QUESTIONS = 8
PROBE_SPLIT = "train"

_LIMITS = CodeLimits()
SIGNATURE = f"""def reward(completion, example, execution) -> float
- completion (str): the model's text after the prompt: the SQL, perhaps followed by ';' and more.
- example (dict): "question", "db_id", "gold_sql", "difficulty" (easy, medium, hard, extra), all str.
- execution (dict): "sql" (str, the SQL taken from the completion, "" if none), "status" ("ok", "error", "blocked" or
  "timed_out"), "error" (str or None), "columns" (list of str), "rows" (its first {SHOWN_ROWS} rows, lists of values),
  "row_count" (int: rows fetched, at most the gold result's count + 1), "gold_columns", "gold_rows" (first
  {SHOWN_ROWS}), "gold_row_count", and "correct" (bool: the result matches the gold result on the database).
Return a float in [{VALUE_RANGE[0]:g}, {VALUE_RANGE[1]:g}]. Only {", ".join(sorted(ALLOWED_MODULES))} may be imported; \
no I/O, no names or attributes starting with '_', no open/eval/exec/getattr. Each call may take {_LIMITS.cpu_s} s of \
CPU time, {_LIMITS.wall_s:g} s of wall-clock time and {_LIMITS.memory_mb} MiB of memory. It is added to execution \
match at the weight given, and must score right answers above wrong ones on a probe batch of training questions, or \
it is refused."""

_Kind = Literal["right", "another question's gold SQL", "the gold SQL cut to no rows"]


def code_inputs(
    completion: str,
    example: Example,
    sql: str,
    result: ExecutionResult,
    gold: ExecutionResult,
    correct: bool,
) -> tuple[str, dict[str, object], dict[str, object]]:
    """The arguments of a reward function for one scored completion, as `SIGNATURE` describes them."""
    facts = {"question": example.question, "db_id": example.db_id, "gold_sql": example.gold_sql}
    execution = {
        "sql": sql,
        "status": str(result.status),
        "error": result.error,
        "columns": list(result.columns),
        "rows": _rows(result.rows),
        "row_count": len(result.rows),
        "gold_columns": list(gold.columns),
        "gold_rows": _rows(gold.rows),
        "gold_row_count": len(gold.rows),
        "correct": correct,
    }
    return completion, {**facts, "difficulty": str(example.difficulty)}, execution


def _rows(rows: Sequence[Sequence[object]]) -> list[list[object]]:
    return [[_plain(value) for value in row] for row in rows[:SHOWN_ROWS]]


def _plain(value: object) -> object:
    """A value as JSON carries it: numbers, text, booleans and None as they are, anything else (a date, a decimal)
    as its text."""
    return value if value is None or isinstance(value, bool | int | float | str) else str(value)


@dataclass(frozen=True)
class Probe:
    example: Example
    completion: str
    kind: _Kind


def probe_batch(task: Text2SqlTask) -> list[Probe]:
    """Right and known-wrong answers to `PROBE_QUESTIONS` questions spread over the training split."""
    examples = task.split(PROBE_SPLIT)
    chosen = examples[:: max(1, len(examples) // PROBE_QUESTIONS)][:PROBE_QUESTIONS]
    probes = []
    for example in chosen:
        probes.append(Probe(example, task.gold_completion(example), "right"))
        other = next((o for o in examples if o.db_id == example.db_id and o.gold_sql != example.gold_sql), None)
        if other is not None:
            probes.append(Probe(example, f" {other.gold_sql};", "another question's gold SQL"))
        cut = f" SELECT * FROM ({example.gold_sql}) AS probe LIMIT 0;"
        probes.append(Probe(example, cut, "the gold SQL cut to no rows"))
    return probes


def gate(task: Text2SqlTask, sandbox: CodeSandbox) -> Verdict:
    """Run the function in `sandbox` on the probe batch and judge it: every value a number in range, and right
    answers above wrong ones on average."""
    probes = probe_batch(task)
    evidence = task.scorer.evidence_many([(p.example, p.completion) for p in probes], DEFAULT_REWARD_SPEC)
    # A wrong answer that happens to be right (its question's gold result is empty too) probes nothing.
    kept = [(p, e) for p, e in zip(probes, evidence, strict=True) if (p.kind == "right") == e.correct_all]
    outcomes = sandbox.call_many([e.code_inputs() for _, e in kept], stop_at_error=True)
    low, high = VALUE_RANGE
    for (probe, _), outcome in zip(kept, outcomes, strict=False):
        where = f"on {probe.example.id} ({probe.kind})"
        if outcome.value is None:
            return Verdict("sandbox", f"{where}: {outcome.error}")
        if not low <= outcome.value <= high:
            return Verdict("sandbox", f"{where}: it returned {outcome.value:g}, outside [{low:g}, {high:g}]")
    right = [o.value for (p, _), o in zip(kept, outcomes, strict=True) if p.kind == "right"]
    wrong = [o.value for (p, _), o in zip(kept, outcomes, strict=True) if p.kind != "right"]
    return judge(right, wrong)
