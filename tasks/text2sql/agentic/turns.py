"""The text of an episode: what a policy turn looks like, and how a query's result or error is shown.

A turn is one line of the form `Explore: <query>;` or `Answer: <query>;` (the `;` is a stop string, so sampling
ends each turn there). The environment answers an exploration with `Result:` and a small table, or `Error:` and
DuckDB's message, each on lines of their own; the policy then writes its next turn.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from tasks.text2sql.prompts import parse_completion
from tasks.text2sql.sql.sandbox import ExecutionResult

EXPLORE = "Explore:"
ANSWER = "Answer:"
_TURN = re.compile(r"\s*(explore|answer)\s*:(.*)", re.IGNORECASE | re.DOTALL)


class TurnKind(StrEnum):
    EXPLORE = "explore"
    ANSWER = "answer"
    # Neither form, or no SQL after the keyword: the episode ends there.
    MALFORMED = "malformed"


@dataclass(frozen=True)
class ParsedTurn:
    kind: TurnKind
    # The statement the turn holds, cut at its first ';' ("" for a malformed turn).
    sql: str


def parse_turn(text: str) -> ParsedTurn:
    """What one policy turn asks for."""
    match = _TURN.match(text)
    if match is None:
        return ParsedTurn(TurnKind.MALFORMED, "")
    sql = parse_completion(match.group(2)).sql
    if not sql:
        return ParsedTurn(TurnKind.MALFORMED, "")
    return ParsedTurn(TurnKind(match.group(1).lower()), sql)


@dataclass(frozen=True)
class ObservationLimits:
    """How much of a result the policy is shown: a few rows of short cells, so observations stay a few dozen tokens."""

    rows_shown: int = 5
    cell_chars: int = 40
    error_chars: int = 200


def _cell(value: object, limit: int) -> str:
    text = "NULL" if value is None else str(value).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_result(result: ExecutionResult, limits: ObservationLimits) -> str:
    """A query's outcome as the policy reads it: a `Result:` table with a count of rows not shown, or an `Error:`."""
    if not result.ok:
        # DuckDB's message, without the caret drawing under the query that follows it.
        message = " ".join((result.error or result.status.value).split("\nLINE ")[0].split())
        return f"Error: {_cell(message, limits.error_chars)}"
    lines = ["Result:", " | ".join(_cell(c, limits.cell_chars) for c in result.columns)]
    lines += [" | ".join(_cell(v, limits.cell_chars) for v in row) for row in result.rows[: limits.rows_shown]]
    hidden = len(result.rows) - limits.rows_shown
    if result.truncated:
        lines.append(f"(more than {max(hidden, 0)} more rows)")
    elif hidden > 0:
        lines.append(f"({hidden} more rows)")
    elif not result.rows:
        lines.append("(no rows)")
    return "\n".join(lines)
