"""uvicorn's HTTP/1.1 protocol, with its own refusals in the server's JSON error shape.

Some requests never reach the app: a malformed request line, or headers past h11's 16 KiB buffer (a 1 MB header).
uvicorn answers those itself with a plain-text 400; here they get the `{"error", "category"}` body every other
refusal has, so a client reads every error the same way.
"""

from __future__ import annotations

import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

UNREADABLE_REQUEST = {
    "error": "malformed HTTP request, or its request line and headers are larger than the server's 16 KiB",
    "category": "user",
}


class JsonErrorH11Protocol(H11Protocol):
    """The protocol class to give uvicorn (`http=`): named outright, so that installing httptools changes nothing."""

    def send_400_response(self, msg: str) -> None:
        body = json.dumps(UNREADABLE_REQUEST).encode()
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        for event in (h11.Response(status_code=400, headers=headers), h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()
