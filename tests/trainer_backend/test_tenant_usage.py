"""The accounting behind the per-tenant metrics and the status's usage: how a device call's time is split among its
operations, how tenants are labelled and ranked, and how a run's share of the device is weighted."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable

import pytest

from trainer_backend.ledger import Ledger, ResultFormat
from trainer_backend.operations import BatchKind, Operation
from trainer_backend.scheduler import Scheduler
from trainer_backend.tenant_usage import (
    OTHER_TENANTS,
    RUN_LISTED_S,
    OnDevice,
    TenantTotals,
    TenantUsage,
    tenant_label,
    tenant_series,
)


def _operation(ledger: Ledger, owner: str, seconds: float = 0.0, gate: threading.Event | None = None) -> Operation:
    """An operation of `owner`'s own lane whose work takes `seconds` (after `gate` is set, when given)."""
    record, _ = ledger.submit(owner, "op", f"{owner}-{time.monotonic_ns()}")

    def work() -> tuple[bytes, ResultFormat]:
        if gate is not None:
            gate.wait(5)
        time.sleep(seconds)
        return b"{}", ResultFormat.JSON

    return Operation(record.request_id, "op", f"lane-{owner}", work, owner=owner)


def _sample(ledger: Ledger, kind: BatchKind, owner: str, tokens: int) -> Operation:
    """A batched operation of `kind` whose runner will say it processed `tokens`."""
    record, _ = ledger.submit(owner, "sample", f"{owner}-{time.monotonic_ns()}")
    return Operation(record.request_id, "sample", f"lane-{owner}", None, batch_kind=kind, payload=tokens, owner=owner)


def _runs_then_pauses_once(started: threading.Event) -> Callable:
    """A generation runner that sets `started`, runs 0.1 s of its own, then pauses once (other tenants' work that may
    run meanwhile runs) and ends."""

    def generation(operations, pause):
        started.set()
        time.sleep(0.1)
        pause()
        return [(b"{}", ResultFormat.JSON) for _ in operations]

    return generation


def _device_seconds(scheduler: Scheduler, owners: int) -> tuple[dict[str, float], threading.Event]:
    """Device seconds by owner as the scheduler reports them, and an event set once `owners` owners have some."""
    seconds: dict[str, float] = {}
    reported = threading.Event()

    def listener(operation: Operation, share: float) -> None:
        seconds[operation.owner] = seconds.get(operation.owner, 0.0) + share
        if len(seconds) == owners:
            reported.set()

    scheduler.on_device_time(listener)
    return seconds, reported


def test_a_batch_splits_its_device_time_in_proportion_to_each_operations_tokens(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    def generation(operations, _pause):
        for operation in operations:
            operation.processed_tokens = operation.payload
        time.sleep(0.2)
        return [(b"{}", ResultFormat.JSON) for _ in operations]

    kind = BatchKind("sample", generation)
    scheduler = start_scheduler(kind)
    seconds, reported = _device_seconds(scheduler, owners=3)
    gate = threading.Event()
    scheduler.submit(_operation(ledger, "holder", gate=gate))
    # Queued while the device is held, so they run as one batch.
    scheduler.submit(_sample(ledger, kind, "alice", 300))
    scheduler.submit(_sample(ledger, kind, "bob", 100))
    gate.set()
    assert reported.wait(10), seconds
    # Stopped before the totals are read, so that none moves under the assertions.
    scheduler.stop()
    assert scheduler.stats().batches == 1
    assert seconds["alice"] + seconds["bob"] >= 0.2
    assert seconds["alice"] == pytest.approx(3 * seconds["bob"])


def test_an_operation_run_while_a_batch_pauses_takes_its_time_out_of_the_batchs(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    started = threading.Event()

    kind = BatchKind("sample", _runs_then_pauses_once(started))
    scheduler = start_scheduler(kind)
    seconds, reported = _device_seconds(scheduler, owners=2)
    scheduler.submit(_sample(ledger, kind, "alice", 10))
    started.wait(5)
    step = _operation(ledger, "bob", seconds=0.3)
    step.interleaves = True
    scheduler.submit(step)
    assert reported.wait(10), seconds
    # Stopped before the totals are read, so that none moves under the assertions.
    scheduler.stop()
    # The generation ran about 0.1 s of its own; the 0.3 s step inside its pause is the step's.
    assert seconds["bob"] >= 0.3
    assert 0.1 <= seconds["alice"] < 0.3


def _running_by_owner(scheduler: Scheduler) -> dict[str, float]:
    running: dict[str, float] = {}
    for operation, seconds in scheduler.running_device_time():
        running[operation.owner] = running.get(operation.owner, 0.0) + seconds
    return running


def test_tenants_in_a_long_call_are_shown_working_before_it_ends_and_their_totals_never_fall(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    """A generation's device seconds count as they accrue, not only when its requests end: the window in which one of
    two evaluators sharing a generation showed no device time at all (docs/reliability.md) cannot happen."""
    steps = 6

    def generation(operations, pause):
        for operation in operations:
            operation.processed_tokens = operation.payload
        for _ in range(steps):
            time.sleep(0.1)
            pause()
        return [(b"{}", ResultFormat.JSON) for _ in operations]

    kind = BatchKind("sample", generation)
    scheduler = start_scheduler(kind)
    usage = TenantUsage()
    scheduler.on_device_time(lambda operation, seconds: usage.add_device_time(operation.owner, None, seconds))
    gate = threading.Event()
    scheduler.submit(_operation(ledger, "holder", gate=gate))
    # Queued while the device is held, so they run as one call.
    scheduler.submit(_sample(ledger, kind, "alice", 100))
    scheduler.submit(_sample(ledger, kind, "bob", 100))
    gate.set()
    readings: list[dict[str, float]] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        running = [OnDevice(op.owner, None, seconds) for op, seconds in scheduler.running_device_time()]
        readings.append({owner: totals.device_seconds for owner, totals in usage.tenants(running=running).items()})
        if scheduler.stats().batches == 1 and not running:
            break
        time.sleep(0.01)
    mid_call = [r for r in readings if 0.2 <= r.get("alice", 0.0) <= 0.4]
    assert mid_call, readings
    # Halfway through the call both tenants show about half of their shares, though neither request has ended.
    assert all(r["bob"] == pytest.approx(r["alice"], abs=0.02) for r in mid_call)
    for owner in ("alice", "bob"):
        shown = [r.get(owner, 0.0) for r in readings]
        assert shown == sorted(shown)
    final = usage.tenants()
    assert final["alice"].device_seconds == pytest.approx(readings[-1]["alice"], abs=0.02)
    assert final["alice"].device_seconds + final["bob"].device_seconds >= steps * 0.1


def test_work_run_in_a_pause_accrues_to_its_own_tenant_while_the_paused_calls_tenant_waits(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    started, in_pause = threading.Event(), threading.Event()

    kind = BatchKind("sample", _runs_then_pauses_once(started))
    scheduler = start_scheduler(kind)
    scheduler.submit(_sample(ledger, kind, "alice", 10))
    started.wait(5)
    step = _operation(ledger, "bob", seconds=0.4, gate=in_pause)
    step.interleaves = True
    scheduler.submit(step)
    while "bob" not in _running_by_owner(scheduler):
        time.sleep(0.005)
    in_pause.set()
    time.sleep(0.3)
    running = _running_by_owner(scheduler)
    # Bob's step has run about 0.3 s of its 0.4; alice's generation stopped accruing when it paused, at about 0.1 s.
    assert running["bob"] >= 0.25
    assert 0.05 <= running["alice"] < 0.2


def test_a_tenant_label_is_a_short_stable_hash_that_shows_neither_key_nor_owner() -> None:
    owner = "key-0123456789abcdef0123456789abcdef"
    label = tenant_label(owner)
    assert label == tenant_label(owner) and label != tenant_label(owner + "0")
    assert re.fullmatch(r"t-[0-9a-f]{12}", label)
    assert label[2:] not in owner


def test_the_busiest_tenants_are_named_and_the_rest_summed_as_other() -> None:
    totals = {
        f"owner-{n}": TenantTotals(
            device_seconds=10.0 * n, tokens_sampled=n, tokens_trained=2 * n, recent_device_seconds=n
        )
        for n in range(1, 6)
    }
    # An owner known only by its storage or queue still counts, into "other" here.
    series = tenant_series(totals, queued={"owner-1": 3, "idle": 1}, storage_bytes={"owner-5": 7, "idle": 5}, top=2)
    assert [s.tenant for s in series] == [tenant_label("owner-5"), tenant_label("owner-4"), OTHER_TENANTS]
    other = series[-1]
    assert other.device_seconds == 10.0 + 20 + 30
    assert (other.tokens_sampled, other.tokens_trained) == (6, 12)
    assert (other.queued, other.storage_bytes) == (4, 5)
    assert series[0].storage_bytes == 7


def test_recent_device_time_ranks_a_tenant_that_works_now_above_one_that_worked_long_ago() -> None:
    usage = TenantUsage()
    usage.add_device_time("early", None, 100.0, now=0.0)
    usage.add_device_time("now", None, 20.0, now=3600.0)
    totals = usage.tenants(now=3600.0)
    assert totals["early"].device_seconds == 100.0
    named, _other = tenant_series(totals, {}, {}, top=1)
    assert named.tenant == tenant_label("now")


def test_a_run_busy_since_it_began_has_the_whole_device_though_its_sum_is_still_warming() -> None:
    usage = TenantUsage()
    for end in range(1, 21):
        usage.add_device_time("alice", "run", 1.0, now=float(end))
    [run] = usage.runs_of("alice", now=20.0)
    assert run.device_seconds == 20.0 and run.device_share_1m == pytest.approx(1.0, abs=0.03)


def test_a_runs_share_follows_its_last_minute_and_an_idle_run_drops_off_the_list() -> None:
    usage = TenantUsage()
    for end in range(1, 21):
        usage.add_device_time("alice", "earlier", 1.0, now=float(end))
    for end in range(2, 121, 2):
        usage.add_device_time("alice", "half-busy", 1.0, now=float(end))
    runs = {run.model_id: run for run in usage.runs_of("alice", now=120.0)}
    assert runs["half-busy"].device_share_1m == pytest.approx(0.5, abs=0.03)
    assert runs["earlier"].device_seconds == 20.0 and runs["earlier"].device_share_1m < 0.1
    assert usage.runs_of("bob", now=120.0) == []
    # A run idle for longer than the status looks back is no longer listed.
    assert [run.model_id for run in usage.runs_of("alice", now=21.0 + RUN_LISTED_S)] == ["half-busy"]


def test_a_run_in_a_long_call_shows_its_share_as_it_runs_and_its_seconds_never_fall() -> None:
    usage = TenantUsage()
    # 30 s into a generation that is the run's first device call: nothing has ended, yet the run has the device.
    [run] = usage.runs_of("alice", now=30.0, running=[OnDevice("alice", "run", 30.0), OnDevice("bob", "run", 30.0)])
    assert run.model_id == "run" and run.device_seconds == 30.0
    assert run.device_share_1m == pytest.approx(1.0, abs=0.01)
    # The call ends and its final split (by tokens) gives the run less than its running count said.
    usage.add_device_time("alice", "run", 28.0, now=31.0)
    [run] = usage.runs_of("alice", now=31.0)
    assert run.device_seconds == 30.0 and run.device_share_1m > 0.9
    usage.add_device_time("alice", "run", 5.0, now=40.0)
    [run] = usage.runs_of("alice", now=40.0)
    assert run.device_seconds == 33.0
    # Idle for a minute after: its share falls.
    [run] = usage.runs_of("alice", now=100.0)
    assert run.device_share_1m < 0.5
