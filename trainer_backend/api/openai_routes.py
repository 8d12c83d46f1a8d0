"""The OpenAI-compatible routes: `/v1/models`, `/v1/completions` and `/v1/chat/completions` (streaming included).

A streamed answer is sent when its generation batch finishes (the engine does not hand out tokens as it draws them):
the same chunks and `[DONE]` a streaming client reads, without the earlier first token.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from trainer_backend.api.caller import BearerOwner, FutureWaiters, parse
from trainer_backend.errors import ServerError, UserInputError
from trainer_backend.ledger import FutureState
from trainer_backend.openai_service import Generated, OpenAIInference, PendingGeneration
from trainer_backend.service import TrainingService
from trainer_backend.wire import openai as oa


def add_openai_routes(
    app: FastAPI, service: TrainingService, inference: OpenAIInference, waiters: FutureWaiters, long_poll_s: float
) -> None:
    async def finished(owner: str, pending: PendingGeneration) -> list[Generated]:
        request_id = pending.submitted.record.request_id
        record = await waiters.wait(service, owner, request_id, long_poll_s)
        while not record.finished:
            record = await waiters.wait(service, owner, request_id, long_poll_s)
        if record.state is FutureState.FAILED:
            raise (UserInputError if record.category == "user" else ServerError)(record.error or "sampling failed")
        return inference.generated(pending, record.result or b"")

    @app.get("/v1/models")
    async def models(who: BearerOwner) -> dict:
        return inference.models(who).model_dump(mode="json")

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request, who: BearerOwner) -> dict | StreamingResponse:
        raw = await request.body()
        body = parse(oa.CompletionRequest, raw)
        pending = inference.submit_completion(who, body, raw)
        choices = await finished(who, pending)
        if body.stream:
            return _event_stream(inference.completion_chunks(pending, choices))
        return inference.completion(pending, choices, want_logprobs=body.logprobs is not None).model_dump(mode="json")

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request, who: BearerOwner) -> dict | StreamingResponse:
        raw = await request.body()
        body = parse(oa.ChatCompletionRequest, raw)
        pending = inference.submit_chat(who, body, raw)
        choices = await finished(who, pending)
        if body.stream:
            return _event_stream(inference.chat_chunks(pending, choices))
        return inference.chat_completion(pending, choices, want_logprobs=body.logprobs).model_dump(mode="json")


def _event_stream(chunks: Iterator[dict]) -> StreamingResponse:
    async def events() -> AsyncIterator[str]:
        for chunk in chunks:
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")
