"""The OpenAI-compatible routes: `/v1/models`, `/v1/completions` and `/v1/chat/completions` (streaming included).

A stream sends text as the engine draws tokens: the engine calls back on its own thread for each token, the event
loop turns tokens into text deltas (holding back what a stop string still forming could cut), and the final chunk of
each choice carries what is left and its finish reason. With `--sampler vllm` the tokens arrive when vLLM answers.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from trainer_backend.api.caller import BearerOwner, FutureWaiters, parse
from trainer_backend.errors import BackendError, ServerError, UserInputError
from trainer_backend.ledger import FutureState
from trainer_backend.openai_service import Generated, OpenAIInference, PendingGeneration
from trainer_backend.service import TrainingService
from trainer_backend.wire import openai as oa


class TokenFeed:
    """Tokens from the engine's thread into the event loop, in order."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[int, int]] = asyncio.Queue()

    def put(self, sample: int, token: int) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (sample, token))


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
        return inference.generated(pending)

    async def streamed(
        owner: str,
        pending: PendingGeneration,
        feed: TokenFeed,
        chunk: Callable[[int, str, str | None], dict],
        choices: int,
    ) -> AsyncIterator[str]:
        """Text deltas as tokens come, then each choice's rest and finish reason; an error after the first byte
        becomes an error event (the status line is already sent)."""
        texts = [inference.incremental_text(pending.stop_strings) for _ in range(choices)]
        result = asyncio.ensure_future(finished(owner, pending))
        try:
            while not (result.done() and feed.queue.empty()):
                next_token = asyncio.ensure_future(feed.queue.get())
                await asyncio.wait({next_token, result}, return_when=asyncio.FIRST_COMPLETED)
                if not next_token.done():
                    next_token.cancel()
                    continue
                sample, token = next_token.result()
                delta = texts[sample].add(token)
                if delta:
                    yield _event(chunk(sample, delta, None))
            for index, choice in enumerate(result.result()):
                rest = texts[index].rest(choice.text)
                if rest:
                    yield _event(chunk(index, rest, None))
                yield _event(chunk(index, "", choice.finish_reason))
        except BackendError as error:
            yield _event({"error": {"message": str(error), "type": "server_error", "code": error.status_code}})
        finally:
            result.cancel()
        yield "data: [DONE]\n\n"

    @app.get("/v1/models")
    async def models(who: BearerOwner) -> dict:
        return inference.models(who).model_dump(mode="json")

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request, who: BearerOwner) -> dict | StreamingResponse:
        raw = await request.body()
        body = parse(oa.CompletionRequest, raw)
        if body.stream:
            feed = TokenFeed()
            pending = inference.submit_completion(who, body, raw, on_token=feed.put)

            def text(index: int, delta: str, finish_reason: str | None) -> dict:
                return inference.completion_chunk(pending, index, delta, finish_reason)

            return _event_stream(streamed(who, pending, feed, text, body.n))
        pending = inference.submit_completion(who, body, raw)
        choices = await finished(who, pending)
        return inference.completion(pending, choices, want_logprobs=body.logprobs is not None).model_dump(mode="json")

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request, who: BearerOwner) -> dict | StreamingResponse:
        raw = await request.body()
        body = parse(oa.ChatCompletionRequest, raw)
        if body.stream:
            feed = TokenFeed()
            pending = inference.submit_chat(who, body, raw, on_token=feed.put)

            def content(index: int, delta: str, finish_reason: str | None) -> dict:
                return inference.chat_chunk(pending, index, oa.Delta(content=delta or None), finish_reason)

            async def with_role() -> AsyncIterator[str]:
                for index in range(body.n):
                    yield _event(inference.chat_chunk(pending, index, oa.Delta(role="assistant", content=""), None))
                async for event in streamed(who, pending, feed, content, body.n):
                    yield event

            return _event_stream(with_role())
        pending = inference.submit_chat(who, body, raw)
        choices = await finished(who, pending)
        return inference.chat_completion(pending, choices, want_logprobs=body.logprobs).model_dump(mode="json")


def _event(data: dict) -> str:
    return f"data: {json.dumps(data)}\n\n"


def _event_stream(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream")
