"""The training server as tests run it in-process: the tiny random model on CPU, on a free loopback port."""

from __future__ import annotations

import os
from pathlib import Path

from trainer_backend.config import ServerConfig

# The SDK and transformers must not reach out: no telemetry, no Hub.
os.environ.setdefault("TINKER_TELEMETRY", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY = "tiny-gemma3"


def tiny_server_config(storage_root: Path, **overrides: object) -> ServerConfig:
    """A server of the tiny model on CPU, on a port picked when it binds, with short long-polls."""
    settings = {
        "base_model": TINY,
        "device": "cpu",
        "storage_root": storage_root,
        "port": 0,
        "long_poll_s": 5.0,
        **overrides,
    }
    return ServerConfig(**settings)
