"""A real training server on a loopback port, serving the tiny model, and the SDK and raw HTTP clients that drive it
(their helpers: tests/support/trainer.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import tinker
from support.backends import TINY, tiny_server_config
from support.trainer import SQL, RawApi

from trainer_backend.ledger import Ledger
from trainer_backend.operations import BatchKind
from trainer_backend.scheduler import Scheduler
from trainer_backend.server import RunningServer, running_server


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    store = Ledger(tmp_path / "ledger.sqlite3")
    yield store
    store.close()


@pytest.fixture
def start_scheduler(ledger: Ledger) -> Iterator[Callable[..., Scheduler]]:
    """Starts schedulers on the test's ledger (with `Scheduler`'s options, serving the batch kinds given) and stops
    each at teardown, before the ledger closes: a test whose assertion fails leaves no worker thread running behind
    it."""
    started: list[Scheduler] = []

    def start(*kinds: BatchKind, **options: object) -> Scheduler:
        scheduler = Scheduler(ledger, **options)
        for kind in kinds:
            scheduler.register(kind)
        started.append(scheduler)
        return scheduler

    yield start
    for scheduler in started:
        scheduler.stop()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tiny_server_config(tmp_path_factory.mktemp("backend"))) as running:
        yield running


@pytest.fixture
def service_client(server: RunningServer) -> Iterator[tinker.ServiceClient]:
    with tinker.ServiceClient(base_url=server.url, api_key="tml-tests") as client:
        yield client


@pytest.fixture(scope="module")
def api_key() -> str:
    """The key of a module's `client` and `api`; a module whose server checks keys overrides it with one of them."""
    return "tml-tests"


@pytest.fixture(scope="module")
def client(server: RunningServer, api_key: str) -> Iterator[tinker.ServiceClient]:
    """One SDK client for a whole module (its server may be the module's own)."""
    with tinker.ServiceClient(base_url=server.url, api_key=api_key) as service_client:
        yield service_client


@pytest.fixture(scope="module")
def api(server: RunningServer, api_key: str) -> RawApi:
    return RawApi(server.url, api_key)


@pytest.fixture
def training(client: tinker.ServiceClient) -> tinker.TrainingClient:
    """A fresh rank-4 adapter for one test."""
    return client.create_lora_training_client(base_model=TINY, rank=4, seed=0).result()


@pytest.fixture(scope="module")
def ids(client: tinker.ServiceClient) -> list[int]:
    """SQL, tokenized."""
    return client.create_lora_training_client(base_model=TINY, rank=4).result().get_tokenizer().encode(SQL)
