"""The agentic episode as a conversation with a chat model: its opening user turn, how a reply is read, and what the
task answers in its next user turn.

A chat model (an instruct coder model above all) answers a question with one query and stops, so the conversation is
built around that habit rather than against it: every query the model writes is run and its result shown, whatever
words surround it (bare SQL, a ```sql block, or after `Explore:`), and the model then either writes a corrected query
or confirms with `Answer: <query>`. A reply with no query accepts the last one, and so does running out of replies:
the episode's answer is always the last query the model wrote. The first reply is the model's best attempt, not an
exploration, so the loop costs a model that is right at once nothing but the confirmation.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from tasks.text2sql.agentic.turns import ANSWER, ObservationLimits, ParsedTurn, TurnKind, parse_turn, render_result
from tasks.text2sql.dataset import Example
from tasks.text2sql.prompts import parse_completion, render_prompt, schema_block, tables_used
from tasks.text2sql.sql.sandbox import QueryRunner

# A keyword at the start of a line of the reply (after any markdown the model dresses it in).
_KEYWORD = re.compile(r"(?:^|\n)[ \t>*_`#]*(?=(?:explore|answer)\s*:)", re.IGNORECASE)
# Where a query starts in prose: a line that opens with SELECT or WITH.
_QUERY_LINE = re.compile(r"(?:^|\n)[ \t]*(?=(?:select|with)\b)", re.IGNORECASE)
_QUERY = re.compile(r"\s*\(?\s*(?:select|with)\b", re.IGNORECASE)

REVISE = (
    f"If this result answers the question, reply `{ANSWER}` followed by the final query. Otherwise write a corrected "
    "query, and I run it again."
)
FIX = "Write a corrected query."
LAST_REPLY = f"This is your last reply: write `{ANSWER}` followed by your final query."


def render_chat_prompt(example: Example, db_path: Path, demonstrations: Sequence[str]) -> str:
    """The user turn that opens an episode: any solved conversations, then the single-turn prompt itself, so the first
    reply is the model's one-turn answer. What the loop allows comes with the first result (`reply_observation`):
    Qwen2.5-Coder-0.5B-Instruct, told up front how results would look, wrote made-up results instead of a query (1 of
    100 dev episodes ran a query, against 45 of 100 right in one turn; `python -m benchmarks.agentic_loop`)."""
    parts = []
    for shown in demonstrations:
        parts += ["Solved example:", shown, ""]
    return "\n".join([*parts, render_prompt(example, db_path)])


def chat_demonstration(
    shot: Example, db_path: Path, sandbox: QueryRunner, rows_fetched: int, limits: ObservationLimits
) -> str:
    """A solved example as the conversation goes: the gold query, its real result as an episode shows it (its first
    `rows_fetched` rows fetched), the answer."""
    result = sandbox.execute(db_path, shot.gold_sql, max_rows=rows_fetched)
    return "\n".join(
        [
            "Schema:",
            schema_block(db_path, set(tables_used(shot.gold_sql))),
            f"Question: {shot.question}",
            f"You: {shot.gold_sql};",
            f"Me: {render_result(result, limits)}",
            f"You: {ANSWER} {shot.gold_sql};",
        ]
    )


def parse_reply(text: str) -> ParsedTurn:
    """What one reply asks for: `Answer:` and a query is the final answer; any other query (bare, in a ```sql block,
    after `Explore:`) is run and shown (EXPLORE); a reply with no query is MALFORMED, which accepts the last query."""
    keyword = _KEYWORD.search(text)
    if keyword is not None:
        parsed = parse_turn(text[keyword.end() :])
        if _QUERY.match(parsed.sql):
            return parsed
    # No keyword, or one without a query after it ("Answer: the query above is right"): the query the reply holds.
    sql = parse_completion(text).sql
    if not _QUERY.match(sql):
        line = _QUERY_LINE.search(text)
        sql = parse_completion(text[line.end() :]).sql if line is not None else ""
    return ParsedTurn(TurnKind.EXPLORE, sql) if _QUERY.match(sql) else ParsedTurn(TurnKind.MALFORMED, "")


def reply_observation(result: str, ok: bool, replies_left: int) -> str:
    """The task's user turn after a query: its result (or error), then what the model may do next."""
    if replies_left == 1:
        return f"{result}\n\n{LAST_REPLY}"
    return f"{result}\n\n{REVISE if ok else FIX}"
