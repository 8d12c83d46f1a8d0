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


# How long a refused connection still reads (and drops) what its client sends before it closes.
LINGER_S = 2.0


class JsonErrorH11Protocol(H11Protocol):
    """The protocol class to give uvicorn (`http=`): named outright, so that installing httptools changes nothing."""

    _refused = False

    def send_400_response(self, msg: str) -> None:
        body = json.dumps(UNREADABLE_REQUEST).encode()
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        for event in (h11.Response(status_code=400, headers=headers), h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        # A lingering close: closing with the rest of a large request unread makes the kernel reset the connection,
        # and a client still sending loses the answer it had not read yet (seen on a loaded machine). So the answer
        # goes out with the end of what the server sends, and what the client sends is read and dropped until it
        # closes its side or LINGER_S passes.
        self._refused = True
        self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)

    def data_received(self, data: bytes) -> None:
        if not self._refused:
            super().data_received(data)
