"""Test servers on loopback: a free port, and an ASGI app served by uvicorn on a background thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI

from autoresearch.trials.backend import free_port

__all__ = ["free_port", "serving"]


@contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """Serve `app` on a free loopback port; yields its base URL, stops it after."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(5)
