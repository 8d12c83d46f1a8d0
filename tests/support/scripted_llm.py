"""A local OpenAI-compatible chat server that answers from a script: tests cannot reach a real LLM, so this stands
in for one at the boundary (a real HTTP server on loopback, spoken to by the real `ChatOpenAI` client)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from support.loopback import serving


@dataclass
class ScriptedLlm:
    """Replies in order: a str is the assistant's message content; an int is an HTTP error status (a 400 to a request
    for structured output says the server does not support it); a (status, message) pair is that error.

    Once the script is used up, requests for structured output (a proposal) get `default_proposal` and others
    (an analysis) `default_analysis`; without defaults they get HTTP 500.
    """

    replies: list[str | int | tuple[int, str]] = field(default_factory=list)
    requests: list[dict] = field(default_factory=list)
    url: str = ""
    default_proposal: str | None = None
    default_analysis: str | None = None

    def say(self, *replies: str | int | tuple[int, str] | dict) -> None:
        self.replies += [json.dumps(r) if isinstance(r, dict) else r for r in replies]


def _app(script: ScriptedLlm) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def complete(request: Request) -> JSONResponse:
        body = await request.json()
        script.requests.append(body)
        default = script.default_proposal if "response_format" in body else script.default_analysis
        reply = script.replies.pop(0) if script.replies else (default if default is not None else 500)
        if isinstance(reply, tuple):
            status, message = reply
            return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}}, status_code=status)
        if isinstance(reply, int):
            message = f"scripted error {reply}"
            if reply == 400 and "response_format" in body:
                # What a server without structured output answers (the proposer then asks in JSON mode).
                message += f": response_format {body['response_format']['type']} is not supported"
            return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}}, status_code=reply)
        return JSONResponse(
            {
                "id": f"chatcmpl-{len(script.requests)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "scripted"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    return app


@contextmanager
def scripted_llm() -> Iterator[ScriptedLlm]:
    script = ScriptedLlm()
    with serving(_app(script)) as url:
        script.url = f"{url}/v1"
        yield script
