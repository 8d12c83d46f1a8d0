"""The OpenAI-compatible routes: `/v1/models`, `/v1/completions` and `/v1/chat/completions` (streaming included).

A stream sends text as the engine draws tokens: the engine calls back on its own thread for each token, the event
loop turns tokens into text deltas (holding back what a stop string still forming could cut), and the final chunk of
each choice carries what is left and its finish reason. With `--sampler vllm` the tokens arrive when vLLM answers.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from trainer_backend.api.caller import BearerOwner, FutureWaiters, parse
from trainer_backend.errors import BackendError, ServerError, UserInputError
from trainer_backend.ledger import FutureState
from trainer_backend.openai_service import Endpoint, Generated, OpenAIInference, PendingGeneration
from trainer_backend.service import TrainingService


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

    async def streamed(owner: str, pending: PendingGeneration, feed: TokenFeed) -> AsyncIterator[str]:
        """Text deltas as tokens come, then each choice's rest and finish reason; an error after the first byte
        becomes an error event (the status line is already sent)."""
        for opening in inference.opening_chunks(pending):
            yield _event(opening)
        texts = [inference.incremental_text(pending.stop_strings) for _ in range(pending.num_samples)]
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
                    yield _event(inference.chunk(pending, sample, delta, None))
            for index, choice in enumerate(result.result()):
                rest = texts[index].rest(choice.text)
                if rest:
                    yield _event(inference.chunk(pending, index, rest, None))
                yield _event(inference.chunk(pending, index, "", choice.finish_reason))
        except BackendError as error:
            yield _event({"error": {"message": str(error), "type": "server_error", "code": error.status_code}})
        finally:
            result.cancel()
        yield "data: [DONE]\n\n"

    def add_generation_route(path: str, name: str, endpoint: Endpoint) -> None:
        """POST `path`: `endpoint`'s request, answered whole or streamed as its choices are drawn."""

        async def generate(request: Request, who: BearerOwner) -> dict | StreamingResponse:
            raw = await request.body()
            body = parse(endpoint.request_type, raw)
            if body.stream:
                feed = TokenFeed()
                pending = inference.submit(endpoint, who, body, raw, on_token=feed.put)
                return _event_stream(streamed(who, pending, feed))
            pending = inference.submit(endpoint, who, body, raw)
            return inference.answer(pending, await finished(who, pending)).model_dump(mode="json")

        app.post(path, response_model=None, name=name)(generate)

    @app.get("/v1/models")
    async def models(who: BearerOwner) -> dict:
        return inference.models(who).model_dump(mode="json")

    add_generation_route("/v1/completions", "completions", inference.completions)
    add_generation_route("/v1/chat/completions", "chat_completions", inference.chat)


def _event(data: dict) -> str:
    return f"data: {json.dumps(data)}\n\n"


def _event_stream(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream")
