"""What every route needs: who calls (from the API key), its body parsed, and a wait on a future that wakes when the
device worker finishes it."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from contextlib import suppress
from typing import Annotated, TypeVar

from fastapi import Depends, Header, Request
from pydantic import BaseModel, ValidationError

from trainer_backend.errors import UserInputError
from trainer_backend.ledger import FutureRecord
from trainer_backend.service import TrainingService
from validation_errors import describe_validation_error

Model = TypeVar("Model", bound=BaseModel)


class FutureWaiters:
    """Wakes long-polls when the device worker finishes a future (the worker calls `notify` from its thread)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._events: dict[str, set[asyncio.Event]] = defaultdict(set)

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def notify(self, record: FutureRecord) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wake, record.request_id)

    def _wake(self, request_id: str) -> None:
        for event in self._events.pop(request_id, ()):
            event.set()

    async def wait(self, service: TrainingService, owner: str, request_id: str, timeout: float) -> FutureRecord:
        event = asyncio.Event()
        self._events[request_id].add(event)
        try:
            # Checked after registering, so a completion between the two cannot be missed.
            record = service.future(owner, request_id)
            if not record.finished:
                with suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), timeout)
                record = service.future(owner, request_id)
            return record
        finally:
            waiting = self._events.get(request_id)
            if waiting is not None:
                waiting.discard(event)
                if not waiting:
                    del self._events[request_id]


def parse(model: type[Model], body: bytes) -> Model:
    """Validate a JSON body; the error names every bad field."""
    try:
        return model.model_validate_json(body or b"{}")
    except ValidationError as error:
        raise UserInputError(
            f"invalid {model.__name__}: {describe_validation_error(error, model, root='body')}"
        ) from None


def _owner(request: Request, x_api_key: Annotated[str | None, Header()] = None) -> str:
    return request.app.state.policy.owner(x_api_key)


# The owner a request acts for (from its X-API-Key), and the SDK's idempotency key.
Owner = Annotated[str, Depends(_owner)]
IdempotencyKey = Annotated[str | None, Header(alias="X-Idempotency-Key")]


def _bearer_owner(
    request: Request,
    x_api_key: Annotated[str | None, Header()] = None,
    authorization: Annotated[str | None, Header()] = None,
) -> str:
    """OpenAI clients send the key as `Authorization: Bearer …`; X-API-Key works too."""
    scheme, _, token = (authorization or "").partition(" ")
    key = x_api_key or (token.strip() if scheme.lower() == "bearer" and token.strip() else None)
    return request.app.state.policy.owner(key)


# The owner of an OpenAI-compatible request.
BearerOwner = Annotated[str, Depends(_bearer_owner)]
