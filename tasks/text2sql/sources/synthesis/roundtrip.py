"""One query through the LLM: it writes the question, answers that question with SQL from the schema of the tables the
query reads, and the pair is kept only when the answer's result matches the query's on every variant of the
database."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import sqlglot
from sqlglot import exp

from tasks.text2sql.dataset import Database, Example
from tasks.text2sql.prompts import parse_completion, render_prompt, tables_used
from tasks.text2sql.sources.synthesis.cache import CachedItem, Verdict
from tasks.text2sql.sources.synthesis.llm import ChatClient, PromptTooLongError
from tasks.text2sql.sources.synthesis.questions import parse_question
from tasks.text2sql.sources.synthesis.sampling import SampledQuery
from tasks.text2sql.sql.matching import gold_is_ordered, match_on_databases
from tasks.text2sql.sql.sandbox import QueryRunner


@dataclass(frozen=True)
class PendingQuery:
    """A kept query with everything the LLM pass needs for it."""

    query: SampledQuery
    files: Database
    evidence: str | None
    writer_messages: list[dict[str, str]]
    key: str


def is_sql_query(sql: str) -> bool:
    """Whether text parses as one SQL query (a SELECT, a set operation, a WITH)."""
    if not sql.strip():
        return False
    try:
        statements = sqlglot.parse(sql, read="duckdb")
    except sqlglot.errors.SqlglotError:
        return False
    return len(statements) == 1 and isinstance(statements[0], exp.Query)


async def round_trip(
    item: PendingQuery, client: ChatClient, trusted: QueryRunner, untrusted: QueryRunner
) -> CachedItem:
    """Ask for the question and its SQL, and judge the pair; LlmUnavailableError when the endpoint fails.

    SQL that fails to run goes back to the LLM with the database's error, `repairs` times at most: the error says
    nothing of the expected result, so a repaired answer still comes from the schema and the question alone.
    """
    try:
        return await _round_trip(item, client, trusted, untrusted)
    except PromptTooLongError as error:
        common = {"key": item.key, "db_id": item.query.db_id, "sql": item.query.sql, "model": client.model}
        return CachedItem(**common, verdict=Verdict.TOO_LONG, detail=str(error))


async def _round_trip(
    item: PendingQuery, client: ChatClient, trusted: QueryRunner, untrusted: QueryRunner
) -> CachedItem:
    config = client.config
    query = item.query
    common = {"key": item.key, "db_id": query.db_id, "sql": query.sql, "model": client.model}
    reply = await client.chat(item.writer_messages, config.question_tokens)
    question = parse_question(reply)
    if question is None:
        return CachedItem(**common, verdict=Verdict.NO_QUESTION, question_reply=reply)
    example = Example(
        id="round-trip",
        db_id=query.db_id,
        question=question,
        gold_sql=query.sql,
        difficulty=query.difficulty,
        evidence=item.evidence,
    )
    # The tables the query reads, not the whole schema: the round trip asks whether the question pins down the query's
    # result, not whether a small model finds its tables among up to twelve; and the prompt is the pass's main cost.
    prompt = render_prompt(example, item.files.path, tables=tables_used(query.sql))
    messages = [{"role": "user", "content": prompt}]
    paths = item.files.all_paths
    gold = await asyncio.to_thread(lambda: [trusted.execute(path, query.sql) for path in paths])
    for attempt in range(config.repairs + 1):
        answer_reply = await client.chat(messages, config.sql_tokens)
        answer = parse_completion(answer_reply).sql
        seen = {**common, "question": question, "question_reply": reply, "answer_reply": answer_reply}
        seen["attempts"] = attempt + 1
        if not is_sql_query(answer):
            return CachedItem(**seen, verdict=Verdict.NO_SQL)
        predicted = await asyncio.to_thread(lambda sql=answer: [untrusted.execute(path, sql) for path in paths])
        failed = next((result for result in predicted if not result.ok), None)
        if failed is None:
            break
        error = (failed.error or "").splitlines()[0][:300]
        messages += [
            {"role": "assistant", "content": answer_reply},
            {
                "role": "user",
                "content": f"That query fails: {error}\nWrite the corrected query. End it with a semicolon.",
            },
        ]
    else:
        return CachedItem(**seen, answer_sql=answer, verdict=Verdict.SQL_FAILED, detail=failed.error or "")
    outcome = match_on_databases(gold, predicted, gold_is_ordered(query.sql))
    verdict = Verdict.KEPT if outcome.correct else Verdict.MISMATCH
    detail = "" if outcome.correct else f"matched {outcome.matched} of {outcome.compared} databases"
    return CachedItem(**seen, answer_sql=answer, verdict=verdict, detail=detail)
