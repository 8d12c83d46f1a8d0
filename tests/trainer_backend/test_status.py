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
from trainer_backend.server import RunningServer


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


def test_the_status_shows_the_callers_futures_with_their_age_and_the_device_busy(server: RunningServer) -> None:
    with tinker.ServiceClient(base_url=server.url, api_key="tml-status-owner") as client:
        sampler = client.create_sampling_client(base_model=TINY)
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
