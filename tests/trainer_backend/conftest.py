"""A real training server on a loopback port, serving the tiny model, and helpers to drive it with the SDK."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import tinker
from tinker import types

from trainer_backend.config import ServerConfig
from trainer_backend.server import RunningServer, running_server

os.environ.setdefault("TINKER_TELEMETRY", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY = "tiny-gemma3"


def tiny_config(storage_root: Path, **overrides: object) -> ServerConfig:
    settings = {
        "base_model": TINY,
        "device": "cpu",
        "storage_root": storage_root,
        "port": 0,
        "long_poll_s": 5.0,
        **overrides,
    }
    return ServerConfig(**settings)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tiny_config(tmp_path_factory.mktemp("backend"))) as running:
        yield running


@pytest.fixture
def service_client(server: RunningServer) -> Iterator[tinker.ServiceClient]:
    with tinker.ServiceClient(base_url=server.url, api_key="tml-tests") as client:
        yield client


def datum_for(tokenizer, text: str) -> types.Datum:
    """Next-token prediction on `text`, every position weighted 1."""
    ids = tokenizer.encode(text)
    return types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
    )
