"""A cap on request bodies, enforced while they arrive, so that no client can make the server hold a huge one.

A body whose Content-Length is over the cap is refused before any of it is read; one sent without a length (chunked)
is refused once the bytes received pass the cap. Either way the answer is a 413 with the server's JSON error shape.
"""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trainer_backend.errors import PayloadTooLargeError


class BodyLimit:
    """ASGI middleware: bodies of at most `max_bytes` reach the app; larger ones get 413."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _refusal(self) -> PayloadTooLargeError:
        return PayloadTooLargeError(
            f"request body is larger than this server's limit of {self.max_bytes} bytes (--max-request-bytes)"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            error = self._refusal()
            response = JSONResponse({"error": str(error), "category": error.category}, status_code=error.status_code)
            await response(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # Raised inside the route's read of the body: the app's error handler answers it.
                    raise self._refusal()
            return message

        await self.app(scope, limited, send)
