"""The agentic prompt: the instruction, solved examples that explore once and then answer, and the question.

Each solved example runs its exploration for real (the first rows of a table its gold query reads), through the
same sandbox and rendering as the policy's own explorations, so the demonstration shows exactly what the policy
will read.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tasks.text2sql.agentic.episode import EpisodeLimits
from tasks.text2sql.agentic.turns import ANSWER, EXPLORE, render_result
from tasks.text2sql.dataset import Example
from tasks.text2sql.prompts import schema_block, tables_used
from tasks.text2sql.sql.sandbox import QueryRunner


def instruction(limits: EpisodeLimits) -> str:
    return (
        "Answer the question with one DuckDB SQL query. Before answering you may run up to "
        f"{limits.max_turns - 1} exploratory queries to look at the data: write '{EXPLORE} <query>;' and read its "
        f"result. When sure, write '{ANSWER} <query>;'. Use only the tables and columns of the schema."
    )


def demonstration(shot: Example, db_path: Path, sandbox: QueryRunner, limits: EpisodeLimits) -> str:
    """A solved example: its schema, question, one exploration with its real result, and the gold answer."""
    tables = sorted(tables_used(shot.gold_sql))
    lines = ["Schema:", schema_block(db_path, set(tables)), f"Question: {shot.question}"]
    if tables:
        exploration = f"SELECT * FROM {tables[0]} LIMIT 3"
        result = sandbox.execute(db_path, exploration, max_rows=limits.rows_fetched)
        lines += [f"{EXPLORE} {exploration};", render_result(result, limits.observation)]
    lines.append(f"{ANSWER} {shot.gold_sql};")
    return "\n".join(lines)


def render_agentic_prompt(
    example: Example,
    db_path: Path,
    demonstrations: Sequence[str],
    limits: EpisodeLimits,
) -> str:
    """The prompt of an episode; the policy's first turn follows its last line."""
    parts = [instruction(limits), ""]
    for shown in demonstrations:
        parts += [shown, ""]
    parts += ["Schema:", schema_block(db_path), f"Question: {example.question}"]
    if example.evidence:
        parts.append(f"Hint: {example.evidence}")
    return "\n".join(parts) + "\n"
