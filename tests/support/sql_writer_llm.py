"""A deterministic stand-in for the question-writing LLM, on loopback: tests cannot run a real instruct model for
hundreds of requests, so this OpenAI-compatible server answers at the boundary instead.

Asked to write a question for a query, it names the query by its hash; asked to answer a question with SQL, it looks
the query up and answers by its `policy`, given the query and how many answers it gave before in the conversation:
the same query (a round trip that matches), a different one (a mismatch), SQL that fails, prose, or nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from support.loopback import serving

MODEL = "stand-in/sql-writer"


def matching(sql: str, attempt: int) -> str:
    return sql + ";"


@dataclass
class SqlWriterLlm:
    """What the stand-in does, and what it was asked."""

    # Maps the query a question was written for, and the answers given before, to the reply to "answer with SQL".
    policy: Callable[[str, int], str] = matching
    # Replaces the question the writer returns (e.g. with "" for a writer that answers nothing).
    question: Callable[[str], str] | None = None
    # An error message to answer a query's writer request with, as HTTP 400 (e.g. a prompt over the context).
    refuse: Callable[[str], str | None] | None = None
    delay_s: float = 0.0
    url: str = ""
    writer_requests: int = 0
    answer_requests: int = 0
    bodies: list[dict] = field(default_factory=list)
    _questions: dict[str, str] = field(default_factory=dict)

    def question_for(self, sql: str) -> str:
        return f"Which rows does query {hashlib.sha256(sql.encode()).hexdigest()[:10]} return?"


_WRITER_SQL = re.compile(r"\nSQL:\n(.*?)\n\nWrite the question", re.DOTALL)
_QUESTION = re.compile(r"\nQuestion: (.*?)\n")


def _app(llm: SqlWriterLlm) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "tests"}]}

    @app.post("/v1/chat/completions")
    async def complete(request: Request) -> JSONResponse:
        body = await request.json()
        llm.bodies.append(body)
        if llm.delay_s:
            await asyncio.sleep(llm.delay_s)
        messages = body["messages"]
        prompt = messages[-1]["content"]
        writer = _WRITER_SQL.search(prompt)
        if writer is not None:
            llm.writer_requests += 1
            sql = writer.group(1)
            refusal = llm.refuse(sql) if llm.refuse is not None else None
            if refusal is not None:
                return JSONResponse({"error": {"message": refusal, "type": "invalid_request_error"}}, status_code=400)
            question = llm.question_for(sql)
            content = llm.question(question) if llm.question is not None else question
            llm._questions[question] = llm._questions[content] = sql
        else:
            llm.answer_requests += 1
            asked = _QUESTION.findall(messages[0]["content"])[-1]
            attempt = sum(m["role"] == "assistant" for m in messages)
            content = llm.policy(llm._questions[asked], attempt) if asked in llm._questions else "I do not know."
        return JSONResponse(
            {
                "id": f"chatcmpl-{len(llm.bodies)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    return app


@contextmanager
def sql_writer_llm(**settings: object) -> Iterator[SqlWriterLlm]:
    llm = SqlWriterLlm(**settings)
    with serving(_app(llm)) as url:
        llm.url = f"{url}/v1"
        yield llm
