"""The device's duty cycle and the status endpoint: what is running, what waits and for how long."""

from __future__ import annotations

import time

import httpx
import pytest
import tinker
from support.backends import TINY
from support.trainer import status_of
from tinker import types

from trainer_backend.duty_cycle import DutyCycle
from trainer_backend.engine.weights_proof import WeightCheckCounts
from trainer_backend.ledger import FutureRecord, FutureState
from trainer_backend.scheduler import SchedulerStats
from trainer_backend.server import RunningServer
from trainer_backend.server_state import AdapterCounts, ServerState
from trainer_backend.status_view import server_status
from trainer_backend.tenant_usage import TenantTotals
from trainer_backend.wire.status import KeyUsage


def test_busy_fraction_counts_recorded_calls_in_the_window_and_the_running_one() -> None:
    cycle = DutyCycle(keep_s=100.0)
    cycle.record(0.0, 2.0)
    cycle.record(5.0, 6.0)
    cycle.record(8.0, 9.5)
    assert cycle.busy_fraction(10.0, now=10.0) == pytest.approx(4.5 / 10)
    # The window cuts the first call in half.
    assert cycle.busy_fraction(9.0, now=10.0) == pytest.approx(3.5 / 9)
    # A call running since 9.5 counts up to now.
    assert cycle.busy_fraction(10.0, running_since=9.5, now=10.0) == pytest.approx(5.0 / 10)
    assert cycle.intervals(since=4.0, running_since=9.5, now=10.0) == [(5.0, 6.0), (8.0, 9.5), (9.5, 10.0)]


def test_old_intervals_are_forgotten() -> None:
    cycle = DutyCycle(keep_s=10.0)
    cycle.record(0.0, 1.0)
    cycle.record(50.0, 51.0)
    assert cycle.intervals(since=-1.0, now=52.0) == [(50.0, 51.0)]


def _future(request_id: str, owner: str, kind: str, state: FutureState, created_at: float) -> FutureRecord:
    model_id = None if kind == "sample" else "run-1"
    return FutureRecord(request_id, owner, kind, model_id, 0, state, None, None, None, None, created_at, created_at)


def test_the_status_is_the_callers_part_of_one_reading_of_the_server() -> None:
    in_flight = (
        _future("a", "me", "sample", FutureState.RUNNING, 90.0),
        _future("b", "them", "forward_backward", FutureState.RUNNING, 95.0),
        _future("c", "me", "optim_step", FutureState.QUEUED, 99.0),
        _future("d", "me", "sample", FutureState.QUEUED, 99.5),
    )
    device = SchedulerStats(
        queued=2,
        queued_by_lane={},
        queued_by_owner={"me": 2},
        busy_seconds=7.0,
        operations_by_kind={},
        batches=1,
        batched_operations=2,
        running=("a", "b"),
        running_since=1000.0,
    )
    state = ServerState(
        base_model="tiny",
        read_at=1002.5,
        read_at_wall=100.0,
        device=device,
        busy_fraction={10.0: 0.25, 60.0: 0.123456},
        in_flight=in_flight,
        futures_by_state={FutureState.QUEUED: 2, FutureState.RUNNING: 2},
        adapters=AdapterCounts(loaded=1, spilled=0),
        tokens_by_phase={},
        sampler=None,
        weight_checks=WeightCheckCounts({}, {}, {}),
        on_device=(),
        tenants={"me": TenantTotals(device_seconds=3.0)},
    )
    usage = KeyUsage(
        tenant="t-me",
        queued=2,
        max_queued=None,
        storage_bytes=0,
        max_storage_bytes=None,
        device_seconds=3.0,
        tokens_sampled=0,
        tokens_trained=0,
    )

    status = server_status("me", state, usage, [])

    assert [(f.request_id, f.state, f.age_s) for f in status.in_flight] == [
        ("a", "running", 10.0),
        ("c", "queued", 1.0),
        ("d", "queued", 0.5),
    ]
    assert status.other_tenants_in_flight == 1
    assert status.queued == {"run-1": 1, "sampling": 1}
    assert status.device.running_kinds == ["forward_backward", "sample"]
    assert status.device.running_for_s == 2.5
    assert (status.device.busy_fraction_10s, status.device.busy_fraction_1m) == (0.25, 0.1235)
    assert state.oldest_future_age_s() == 10.0
    assert state.tenant("nobody") == TenantTotals()


def test_the_status_shows_the_callers_futures_with_their_age_and_the_device_busy(server: RunningServer) -> None:
    with tinker.ServiceClient(base_url=server.url, api_key="tml-status-owner") as client:
        sampler = client.create_sampling_client(base_model=TINY).result()
        prompt = types.ModelInput.from_ints([3, 5, 7])
        # Long enough to be seen running; stop=[] so that no EOS ends it early.
        params = types.SamplingParams(max_tokens=300, temperature=1.0, stop=[])
        futures = [sampler.sample(prompt=prompt, num_samples=2, sampling_params=params) for _ in range(2)]
        deadline = time.monotonic() + 30
        mine = status_of(server, "tml-status-owner")
        while not any(f["state"] == "running" for f in mine["in_flight"]) and time.monotonic() < deadline:
            time.sleep(0.02)
            mine = status_of(server, "tml-status-owner")
        running = [f for f in mine["in_flight"] if f["state"] == "running"]
        assert running and all(f["kind"] == "sample" and f["age_s"] >= 0 for f in running)
        assert "sample" in mine["device"]["running_kinds"] and mine["device"]["running_for_s"] >= 0
        assert mine["base_model"] == TINY

        # Another key sees the work only as a count.
        theirs = status_of(server, "tml-status-other")
        assert theirs["in_flight"] == [] and theirs["queued"] == {}
        assert theirs["other_tenants_in_flight"] >= 1

        for future in futures:
            future.result()
    after = status_of(server, "tml-status-owner")
    assert after["in_flight"] == []
    assert after["device"]["busy_fraction_1m"] > 0


def test_metrics_expose_the_busy_fraction_and_the_oldest_future(server: RunningServer) -> None:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    assert 'trainer_device_busy_fraction{window="60s"}' in text
    assert "trainer_oldest_future_age_seconds" in text
    assert "trainer_batched_operations_total" in text
    assert 'trainer_training_adapters{state="spilled"}' in text
