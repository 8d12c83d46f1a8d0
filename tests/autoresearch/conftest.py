"""A real training server with the tiny model on a loopback port, and the shipped tiny trial config."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from support.backends import GEMMA_CHAT_TEMPLATE, tiny_server_config

from autoresearch.trials.config import TrialConfig, load_trial_config
from trainer_backend.server import running_server

TINY_CONFIG = Path(__file__).parents[2] / "experiments" / "trials" / "text2sql_tiny.yaml"


@pytest.fixture(scope="session")
def backend_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Only the tests start the backend in-process; the trial code reaches it through the Tinker API alone.

    One torch thread: with a pytest-xdist worker per core, torch's default of one OpenMP thread per core in every
    worker makes the workers' threads spin against each other, and the trials run 5-10 times slower. It has a chat
    template, so that its /v1 endpoint can stand in as the controller's LLM.
    """
    config = tiny_server_config(tmp_path_factory.mktemp("backend"), chat_template=GEMMA_CHAT_TEMPLATE)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with running_server(config) as server:
            yield server.url
    finally:
        torch.set_num_threads(threads)


@pytest.fixture
def tiny_trial_config() -> TrialConfig:
    return load_trial_config(TINY_CONFIG)
