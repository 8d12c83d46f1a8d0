"""What a text-to-SQL reward function written as code receives: `SIGNATURE` says it to the LLM and to users, and
`code_inputs` builds it for one scored completion, as plain values (str, int, float, bool, None, lists and dicts of
them), so that they cross to the function's sandboxed worker as JSON."""

from __future__ import annotations

from collections.abc import Sequence

from tasks.reward_code.admission import VALUE_RANGE
from tasks.reward_code.sandbox import CodeLimits
from tasks.reward_code.static_check import ALLOWED_MODULES
from tasks.text2sql.dataset import Example
from tasks.text2sql.sql.sandbox import ExecutionResult

# Rows of a result the function is shown, its own and the gold one's.
SHOWN_ROWS = 20
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
