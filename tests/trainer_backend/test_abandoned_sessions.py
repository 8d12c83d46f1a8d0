"""A killed client's queued samples are failed before they run, so they do not take the device from live clients;
a live client's, and a client's that sends no heartbeats at all, are left alone.

A real server of the tiny model whose generation batch holds eight rows and which takes a session for gone after
one second without heartbeats while others send theirs (`--abandoned-session-s 1`). Sessions are driven over raw
HTTP, so the test decides when each one's heartbeats stop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from support.backends import TINY, tiny_server_config
from support.trainer import RawApi, request_id_of
from tinker import types

from trainer_backend.ledger import FutureState
from trainer_backend.server import RunningServer, running_server

PROMPT = types.ModelInput.from_ints([5, 9, 14])
# stop=[]: every row runs its full length, so the queue drains at a steady pace.
LONG = types.SamplingParams(max_tokens=64, temperature=1.0, stop=[])
ROWS_PER_BATCH = 8
QUEUED = 400
SILENT_S = 1.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    config = tiny_server_config(
        tmp_path_factory.mktemp("abandoned"),
        max_generation_batch_tokens=ROWS_PER_BATCH * (PROMPT.length + LONG.max_tokens),
        abandoned_session_s=SILENT_S,
    )
    with running_server(config) as running:
        yield running


class Client:
    """One client session over raw HTTP: it heartbeats only when told to, and samples the base model."""

    def __init__(self, server: RunningServer, key: str) -> None:
        self.api = RawApi(server.url, key)
        created = self.api.post("/create_session", {"tags": [], "sdk_version": "test"})
        self.session_id = created.json()["session_id"]
        sampler = self.api.post(
            "/create_sampling_session",
            {"session_id": self.session_id, "sampling_session_seq_id": 0, "base_model": TINY},
        )
        self.sampling_session_id = sampler.json()["sampling_session_id"]

    def heartbeat(self) -> None:
        assert self.api.post("/session_heartbeat", {"session_id": self.session_id}).status_code == 200

    def sample(self, count: int) -> list[str]:
        request = types.SampleRequest(
            num_samples=1, prompt=PROMPT, sampling_params=LONG, sampling_session_id=self.sampling_session_id
        )
        return [request_id_of(self.api.post("/asample", request)) for _ in range(count)]


def states(server: RunningServer, request_ids: list[str]) -> list[FutureState]:
    return [server.service.ledger.get(request_id).state for request_id in request_ids]


def test_a_silent_sessions_queued_samples_are_failed_and_a_live_ones_run(server: RunningServer) -> None:
    gone, live, mute = (Client(server, f"tml-abandoned-{name}") for name in ("gone", "live", "mute"))
    time.sleep(0.05)  # a heartbeat after the session's creation, as the SDK's first one is
    gone.heartbeat()
    live_heartbeats = threading.Event()

    def keep_alive() -> None:
        while not live_heartbeats.wait(0.2):
            live.heartbeat()

    beating = threading.Thread(target=keep_alive, daemon=True)
    beating.start()
    try:
        gone_requests = gone.sample(QUEUED)
        mute_requests = mute.sample(8)  # never heartbeats: not the SDK, so never taken for gone
        live_requests = live.sample(8)
        for client, request_ids in ((live, live_requests), (mute, mute_requests)):
            assert all(client.api.result(rid, timeout=120).status_code == 200 for rid in request_ids)
        deadline = time.monotonic() + 60
        while {FutureState.QUEUED, FutureState.RUNNING} & set(states(server, gone_requests)):
            assert time.monotonic() < deadline, "the silent session's queue was neither dropped nor run"
            time.sleep(0.1)
    finally:
        live_heartbeats.set()
        beating.join()
    assert set(states(server, live_requests + mute_requests)) == {FutureState.DONE}
    gone_states = states(server, gone_requests)
    failed = [rid for rid, state in zip(gone_requests, gone_states, strict=True) if state is FutureState.FAILED]
    # Most of its queue was dropped unrun; what had started finished.
    assert len(failed) >= QUEUED // 2, f"only {len(failed)} of {QUEUED} were dropped"
    assert set(gone_states) == {FutureState.DONE, FutureState.FAILED}
    error = gone.api.result(failed[0]).json()
    assert "sent no heartbeat for more than 1 s while others did" in error["error"]
    assert error["category"] == "user"
