"""The device worker keeps each client's order, batches what can share a device call, and serves tenants fairly."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest
import tinker
from support.backends import TINY
from support.scheduling import finished, running, sample_operation, wait_for
from support.trainer import next_token_datum, status_of
from tinker import types

from trainer_backend import scheduler as scheduler_module
from trainer_backend.errors import OverloadedError, UserInputError
from trainer_backend.ledger import FutureState, Ledger, ResultFormat
from trainer_backend.operations import BatchBudget, BatchKind, Operation
from trainer_backend.scheduler import Scheduler
from trainer_backend.server import RunningServer


def _operation(ledger: Ledger, lane: str, seq_id: int | None, log: list, work=None) -> Operation:
    record, _ = ledger.submit("alice", "op", f"{lane}-{seq_id}-{time.monotonic_ns()}", lane, seq_id)

    def default_work() -> tuple[bytes, ResultFormat]:
        log.append((lane, seq_id))
        return b"{}", ResultFormat.JSON

    return Operation(record.request_id, "op", lane, work or default_work, seq_id)


def _held_until(gate: threading.Event, log: list | None = None) -> Callable[[], tuple[bytes, ResultFormat]]:
    """Work that keeps the device busy until `gate` is set (at most 5 s), noting "blocker" in `log` when given."""

    def work() -> tuple[bytes, ResultFormat]:
        gate.wait(5)
        if log is not None:
            log.append("blocker")
        return b"{}", ResultFormat.JSON

    return work


def _queued_while_busy(scheduler: Scheduler, ledger: Ledger, kind: BatchKind, lane: str, count: int) -> list[Operation]:
    """`count` samples of `lane` (payloads "<lane>-<i>"), queued while the device runs other work, so that all of them
    are ready when the next call forms; the device is then let go."""
    gate = threading.Event()
    scheduler.submit(_operation(ledger, "holder", 1, [], _held_until(gate)))
    operations = [sample_operation(ledger, kind, lane, f"{lane}-{i}") for i in range(count)]
    for operation in operations:
        scheduler.submit(operation)
    gate.set()
    return operations


def test_operations_of_one_client_run_in_seq_id_order_whatever_the_arrival(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    scheduler = start_scheduler()
    log: list = []
    operations = {seq: _operation(ledger, "m1", seq, log) for seq in (1, 2, 3, 4)}
    for seq in (3, 4, 2):
        scheduler.submit(operations[seq])
    time.sleep(0.2)
    assert log == []  # seq 1 has not arrived: nothing may run
    scheduler.submit(operations[1])
    wait_for(lambda: len(log) == 4)
    assert log == [("m1", 1), ("m1", 2), ("m1", 3), ("m1", 4)]


def test_a_gap_that_never_fills_fails_the_waiting_operations(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    scheduler = start_scheduler(gap_timeout_s=0.3)
    log: list = []
    record = finished(scheduler, ledger, _operation(ledger, "m1", 2, log))
    assert record.state is FutureState.FAILED
    assert "waited" in record.error and "seq_id 1" in record.error
    finished(scheduler, ledger, _operation(ledger, "m1", 3, log))
    assert log == [("m1", 3)]


def test_tenants_take_turns_instead_of_first_come_first_served(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    scheduler = start_scheduler()
    log: list = []
    gate = threading.Event()
    blocked = _held_until(gate)

    scheduler.submit(_operation(ledger, "blocker", None, log, blocked))
    for seq in range(1, 6):
        scheduler.submit(_operation(ledger, "busy", seq, log))
    for seq in range(1, 3):
        scheduler.submit(_operation(ledger, "quiet", seq, log))
    gate.set()
    wait_for(lambda: len(log) == 7)
    # The quiet tenant's two operations are not left behind the busy tenant's five.
    assert log.index(("quiet", 2)) < log.index(("busy", 4))


def test_a_runs_new_sampling_sessions_do_not_put_it_ahead_of_another_run(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    """An RL trial samples each step through a new sampling session of its run's latest weights: a lane never served
    before. Runs take turns as tenants do, whichever sessions their requests come through, all under one key."""
    scheduler = start_scheduler()
    log: list = []
    gate = threading.Event()
    scheduler.submit(_operation(ledger, "blocker", None, log, _held_until(gate)))
    busy = [_operation(ledger, f"busy-session-{step}", None, log) for step in range(5)]
    quiet = [_operation(ledger, "quiet-session", None, log) for _ in range(2)]
    for operation in busy:
        operation.run = "busy-run"
    for operation in quiet:
        operation.run = "quiet-run"
    for operation in [*busy, *quiet]:
        scheduler.submit(operation)
    gate.set()
    wait_for(lambda: len(log) == 7)

    order = [lane for lane, _ in log]
    quiet_turns = [index for index, lane in enumerate(order) if lane == "quiet-session"]
    # The quiet run goes first or second, and both its operations run before the busy run's fourth session.
    assert len(quiet_turns) == 2 and quiet_turns[0] <= 1 and quiet_turns[1] < order.index("busy-session-3"), order


def test_the_stats_count_each_runs_requests_queued_or_running_until_they_finish(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    """What a benchmark reads to tell whether two runs both have work on the device (issue 48's fairness windows)."""
    scheduler = start_scheduler()
    gate = threading.Event()
    blocker = _operation(ledger, "training-a", 1, [], _held_until(gate))
    queued = [_operation(ledger, "training-a", 2, []), _operation(ledger, "session-b", None, [])]
    base_sample = _operation(ledger, "session-base", None, [])  # no run: counts toward none
    for operation, run in zip([blocker, *queued], ["run-a", "run-a", "run-b"], strict=True):
        operation.owner, operation.run = "alice", run
    base_sample.owner = "alice"
    running(scheduler, blocker)
    for operation in [*queued, base_sample]:
        scheduler.submit(operation)

    assert scheduler.stats().open_by_run == {("alice", "run-a"): 2, ("alice", "run-b"): 1}
    gate.set()
    wait_for(lambda: all(ledger.get(op.request_id).finished for op in [blocker, *queued, base_sample]))
    assert scheduler.stats().open_by_run == {}


def test_failures_are_recorded_and_the_worker_keeps_serving(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler], caplog: pytest.LogCaptureFixture
) -> None:
    scheduler = start_scheduler()
    log: list = []

    def bad_input() -> tuple[bytes, ResultFormat]:
        raise UserInputError("token id 999999 is outside the vocabulary")

    def crash() -> tuple[bytes, ResultFormat]:
        raise RuntimeError("boom")

    first = _operation(ledger, "m1", 1, log, bad_input)
    second = _operation(ledger, "m1", 2, log, crash)
    third = _operation(ledger, "m1", 3, log)
    for operation in (first, second, third):
        scheduler.submit(operation)
    wait_for(lambda: ledger.get(third.request_id).finished)
    assert ledger.get(first.request_id).category == "user"
    assert "outside the vocabulary" in ledger.get(first.request_id).error
    assert ledger.get(second.request_id).category == "server"
    # The exception's text goes to the server's log only: it may name server paths.
    assert ledger.get(second.request_id).error == (
        f"internal error in op; the server's log has the details of request {second.request_id}"
    )
    assert "boom" in caplog.text and second.request_id in caplog.text
    assert ledger.get(third.request_id).state is FutureState.DONE
    assert scheduler.stats().busy_seconds > 0


def test_full_queues_push_back(ledger: Ledger, start_scheduler: Callable[..., Scheduler]) -> None:
    scheduler = start_scheduler(max_queued=2)
    log: list = []
    gate = threading.Event()
    blocked = _held_until(gate)

    scheduler.submit(_operation(ledger, "a", None, log, blocked))
    wait_for(lambda: scheduler.stats().running)
    scheduler.submit(_operation(ledger, "b", None, log))
    scheduler.submit(_operation(ledger, "c", None, log))
    with pytest.raises(OverloadedError, match="retry"):
        scheduler.submit(_operation(ledger, "d", None, log))
    gate.set()


def test_ready_operations_of_a_batch_kind_from_all_tenants_run_in_one_call(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    calls: list[list[str]] = []

    def run_samples(operations, pause):
        calls.append([op.payload for op in operations])
        return [
            UserInputError(f"bad {op.payload}") if op.payload == "bad" else (op.payload.encode(), ResultFormat.JSON)
            for op in operations
        ]

    kind = BatchKind("sample", run_samples)
    scheduler = start_scheduler(kind)
    log: list = []
    gate = threading.Event()
    blocked = _held_until(gate, log)

    scheduler.submit(_operation(ledger, "trainer", 1, log, blocked))
    wait_for(lambda: scheduler.stats().running)
    samples = [
        sample_operation(ledger, kind, lane, payload) for lane, payload in [("s1", "a"), ("s2", "bad"), ("s1", "c")]
    ]
    for operation in samples:
        scheduler.submit(operation)
    trainer_next = _operation(ledger, "trainer", 2, log)
    scheduler.submit(trainer_next)
    gate.set()
    wait_for(lambda: all(ledger.get(op.request_id).finished for op in [*samples, trainer_next]))

    # One device call for the three samples of two tenants, each answered with its own outcome.
    assert len(calls) == 1 and sorted(calls[0]) == ["a", "bad", "c"]
    assert [ledger.get(op.request_id).result for op in samples] == [b"a", None, b"c"]
    failed = ledger.get(samples[1].request_id)
    assert failed.state is FutureState.FAILED and failed.error == "bad bad" and failed.category == "user"
    stats = scheduler.stats()
    assert stats.batches == 1 and stats.batched_operations == 3 and stats.operations_by_kind["sample"] == 3


def test_a_tenant_with_a_deep_queue_gets_a_share_of_each_budgeted_batch_and_no_request_starves(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    """A's 40 one-row requests and B's 4 requests of 4 rows queue behind a busy device; a batch holds 16 rows. B's
    requests share the next batch with A's, and A's queue drains over the following ones; an oversized request runs,
    alone."""
    calls: list[list[str]] = []

    def run_samples(operations, pause):
        calls.append([op.payload for op in operations])
        return [(op.payload.encode(), ResultFormat.JSON) for op in operations]

    rows = {"a": 1, "b": 4, "huge": 40}
    budget = BatchBudget(share=lambda payload: rows[payload.split("-")[0]] / 16)
    kind = BatchKind("sample", run_samples, budget=budget)
    scheduler = start_scheduler(kind)
    gate = threading.Event()
    scheduler.submit(_operation(ledger, "trainer", 1, [], _held_until(gate)))
    wait_for(lambda: scheduler.stats().running)
    operations = [sample_operation(ledger, kind, "lane-a", f"a-{i}") for i in range(40)]
    operations += [sample_operation(ledger, kind, "lane-b", f"b-{i}") for i in range(4)]
    operations += [sample_operation(ledger, kind, "lane-c", "huge-0")]
    for operation in operations:
        scheduler.submit(operation)
    gate.set()
    wait_for(lambda: all(ledger.get(op.request_id).finished for op in operations))

    assert sorted(payload for call in calls for payload in call) == sorted(op.payload for op in operations)
    assert all(sum(rows[p.split("-")[0]] for p in call) <= 16 for call in calls if call != ["huge-0"])
    assert ["huge-0"] in calls  # larger than a whole batch: it still ran, on its own
    # B's requests were all served before A's queue drained, in the first batches after the device freed up.
    last_b = max(i for i, call in enumerate(calls) if any(p.startswith("b-") for p in call))
    last_a = max(i for i, call in enumerate(calls) if any(p.startswith("a-") for p in call))
    assert last_b < 3 < last_a, calls
    # The tenants take turns within a batch: B is not left with what A's queue leaves over.
    mixed = next(call for call in calls if any(p.startswith("b-") for p in call))
    assert sum(rows["b"] for p in mixed if p.startswith("b-")) >= 16 / 2, mixed


def test_a_batch_runner_that_breaks_fails_its_operations_and_the_worker_goes_on(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    def broken(operations, pause):
        raise RuntimeError("engine fell over in /srv/secret/path")

    kind = BatchKind("sample", broken)
    scheduler = start_scheduler(kind)
    record = finished(scheduler, ledger, sample_operation(ledger, kind, "s1", "a"))
    assert record.state is FutureState.FAILED and record.error.startswith("internal error in sample")
    assert "/srv/secret/path" not in record.error
    log: list = []
    finished(scheduler, ledger, _operation(ledger, "m1", 1, log))
    assert log == [("m1", 1)]


def test_an_operation_needs_work_or_a_registered_batch_kind_and_its_payload(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    kind = BatchKind("sample", lambda operations, pause: [])
    scheduler = start_scheduler()
    with pytest.raises(ValueError, match="needs either work or a batch kind"):
        scheduler.submit(sample_operation(ledger, kind, "s1", "a"))
    scheduler = start_scheduler(kind)
    # A kind of the same name that the scheduler was not given is not its own.
    with pytest.raises(ValueError, match="needs either work or a batch kind"):
        scheduler.submit(sample_operation(ledger, BatchKind("sample", lambda operations, pause: []), "s1", "a"))
    without_payload = sample_operation(ledger, kind, "s1", "a")
    without_payload.payload = None
    with pytest.raises(ValueError, match="a batch kind with a runner and payload"):
        scheduler.submit(without_payload)


def test_a_batch_kind_registers_once(start_scheduler: Callable[..., Scheduler]) -> None:
    def runner(operations, call):
        return []

    kind = BatchKind("sample", runner)
    scheduler = start_scheduler(kind)
    # A second component serving the same kind would take the first one's operations without a word.
    with pytest.raises(ValueError, match="batch kind 'sample' is registered already"):
        scheduler.register(BatchKind("sample", runner, nests=True))
    with pytest.raises(ValueError, match="batch kind 'pass' is registered already"):
        start_scheduler(BatchKind("pass", runner), BatchKind("pass", runner))


def test_the_next_ordered_operations_of_several_clients_batch_and_later_ones_wait(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    calls: list[list[tuple[str, int]]] = []
    log: list = []

    def run_passes(operations, pause):
        calls.append([(op.lane, op.seq_id) for op in operations])
        log.extend((op.lane, op.seq_id) for op in operations)
        return [(b"{}", ResultFormat.JSON) for _ in operations]

    kind = BatchKind("pass", run_passes)
    scheduler = start_scheduler(kind)
    gate = threading.Event()
    blocked = _held_until(gate)

    def training_pass(lane: str, seq_id: int) -> Operation:
        record, _ = ledger.submit("alice", "forward_backward", f"{lane}-{seq_id}", lane, seq_id)
        return Operation(
            record.request_id, "forward_backward", lane, None, seq_id, batch_kind=kind, payload=(lane, seq_id)
        )

    scheduler.submit(_operation(ledger, "blocker", None, log, blocked))
    wait_for(lambda: scheduler.stats().running)
    submitted = [training_pass("m1", 1), _operation(ledger, "m1", 2, log), training_pass("m1", 3)]
    submitted += [training_pass("m2", 1), training_pass("m2", 2)]
    for operation in submitted:
        scheduler.submit(operation)
    gate.set()
    wait_for(lambda: all(ledger.get(op.request_id).finished for op in submitted))

    # Each client's first pass runs in one call; m1's optimizer step runs before its second pass, and no call
    # holds two operations of one client.
    assert sorted(calls[0]) == [("m1", 1), ("m2", 1)]
    assert log.index(("m1", 1)) < log.index(("m1", 2)) < log.index(("m1", 3))
    assert all(len({lane for lane, _ in call}) == len(call) for call in calls)
    assert sorted(op for call in calls for op in call) == [("m1", 1), ("m1", 3), ("m2", 1), ("m2", 2)]


def test_a_long_batch_pauses_for_other_tenants_short_operations_but_not_for_others(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    log: list = []
    started = threading.Event()
    proceed = threading.Event()

    def long_generation(operations, pause):
        log.append("generation starts")
        started.set()
        proceed.wait(5)
        for _ in range(3):
            # Its own time between pauses, so that the share others may take in its pauses (PAUSE_SHARE_LIMIT times
            # its own) never refuses a pause on a loaded machine, where running one trivial operation took longer.
            time.sleep(0.2)
            pause()
        log.append("generation ends")
        return [(b"{}", ResultFormat.JSON) for _ in operations]

    kind = BatchKind("sample", long_generation)
    scheduler = start_scheduler(kind)
    busy_before = scheduler.stats().busy_seconds
    scheduler.submit(sample_operation(ledger, kind, "sampler", "long"))
    started.wait(5)
    step = _operation(ledger, "trainer", 1, log)
    step.interleaves = True
    later_step = _operation(ledger, "trainer", 2, log)
    later_step.interleaves = True
    creation = _operation(ledger, "other", 1, log)  # adds an adapter: must not run inside a generation
    for operation in (step, later_step, creation):
        scheduler.submit(operation)
    proceed.set()
    wait_for(lambda: all(ledger.get(op.request_id).finished for op in (step, later_step, creation)))

    # Each pause runs one ready operation of another lane, in that lane's order; the creation waits.
    assert log == ["generation starts", ("trainer", 1), ("trainer", 2), "generation ends", ("other", 1)]
    stats = scheduler.stats()
    assert stats.operations_by_kind["op"] == 3 and stats.busy_seconds > busy_before


def test_a_training_pass_nested_in_a_pause_runs_a_micro_batch_per_pause_and_the_paused_batch_steps_between(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    """A nested training pass used to hold the device to its end, and the paused generation with it. It parks between
    its micro-batches instead; what is left of it when the generation ends runs before anything else, its lane's next
    request after it; the time it waited parked is not its device time."""
    log: list = []
    started = threading.Event()
    proceed = threading.Event()
    pass_compute_s: list[float] = []
    device_seconds: dict[str, float] = {}

    def generation(operations, pause):
        started.set()
        proceed.wait(5)
        for step in range(4):
            log.append(f"generation step {step}")
            time.sleep(0.1)
            pause()
        return [(b"{}", ResultFormat.JSON) for _ in operations]

    def training_pass(operations, pause):
        for step in range(6):
            if step:
                pause()
            begun = time.monotonic()
            log.append(f"pass step {step}")
            time.sleep(0.02)
            pass_compute_s.append(time.monotonic() - begun)
        return [(b"{}", ResultFormat.JSON) for _ in operations]

    sampling = BatchKind("sample", generation, nests=True)
    passes = BatchKind("pass", training_pass, parks=True)
    scheduler = start_scheduler(sampling, passes)
    scheduler.on_device_time(lambda operation, seconds: device_seconds.update({operation.request_id: seconds}))
    scheduler.submit(sample_operation(ledger, sampling, "sampler", "long"))
    assert started.wait(5)
    record, _ = ledger.submit("alice", "forward_backward", "trainer-1", "trainer", 1)
    training = Operation(
        record.request_id, "forward_backward", "trainer", None, 1, batch_kind=passes, payload="pass", interleaves=True
    )
    optimizer_step = _operation(ledger, "trainer", 2, log)
    optimizer_step.interleaves = True
    creation = _operation(ledger, "other", 1, log)  # adds an adapter: runs only between calls
    for operation in (training, optimizer_step, creation):
        scheduler.submit(operation)
    proceed.set()
    wait_for(lambda: all(ledger.get(op.request_id).finished for op in (training, optimizer_step, creation)))

    assert log[:10] == [
        "generation step 0",
        "pass step 0",
        "generation step 1",
        "pass step 1",
        "generation step 2",
        "pass step 2",
        "generation step 3",
        "pass step 3",
        "pass step 4",
        "pass step 5",
    ]
    assert sorted(log[10:]) == [("other", 1), ("trainer", 2)]
    # Parked through three of the generation's steps (0.3 s or more), none of which counts as the pass's.
    assert device_seconds[training.request_id] < sum(pass_compute_s) + 0.15


def test_a_training_pass_pauses_for_another_runs_work_but_not_for_its_own_clients_next_request(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    """A training pass pauses between its micro-batches: another run's optimizer step may run then, but not its own
    client's, which is ready as soon as the pass is taken to run and must see the pass's gradients."""
    log: list = []
    started = threading.Event()
    proceed = threading.Event()

    def training_pass(operations, pause):
        started.set()
        proceed.wait(5)
        for step in range(3):
            if step:
                pause()
            log.append(f"pass step {step}")
            time.sleep(0.1)
        return [(b"{}", ResultFormat.JSON) for _ in operations]

    passes = BatchKind("pass", training_pass, parks=True)
    scheduler = start_scheduler(passes)
    record, _ = ledger.submit("alice", "forward_backward", "trainer-1", "trainer", 1)
    scheduler.submit(
        Operation(record.request_id, "forward_backward", "trainer", None, 1, batch_kind=passes, payload="pass")
    )
    assert started.wait(5)
    own_step, other_step = _operation(ledger, "trainer", 2, log), _operation(ledger, "other", 1, log)
    for operation in (own_step, other_step):
        operation.interleaves = True
        scheduler.submit(operation)
    proceed.set()
    wait_for(lambda: all(ledger.get(op.request_id).finished for op in (own_step, other_step)))

    assert log == ["pass step 0", ("other", 1), "pass step 1", "pass step 2", ("trainer", 2)]


def test_another_tenants_gathered_batch_nests_in_a_long_batchs_pause_but_the_same_tenants_waits(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    log: list = []
    window_s = 0.3
    heavy_started = threading.Event()
    proceed = threading.Event()
    nested_at: list[float] = []

    def generation(operations, pause):
        payloads = [op.payload for op in operations]
        if payloads == ["heavy"]:
            log.append("heavy starts")
            heavy_started.set()
            proceed.wait(5)
            # Pauses every few tokens until the light tenant's request has run (10 s at most).
            deadline = time.monotonic() + 10
            while not ledger.get(light.request_id).finished and time.monotonic() < deadline:
                pause()
                time.sleep(0.02)
            log.append("heavy ends")
        else:
            nested_at.append(time.monotonic())
            log.append(payloads)
        return [(b"{}", ResultFormat.JSON) for _ in operations]

    scheduler = start_scheduler()
    kind = BatchKind("sample", generation, window_s=window_s, nests=True)
    scheduler.register(kind)
    light = sample_operation(ledger, kind, "light", "light")
    heavy = sample_operation(ledger, kind, "heavy", "heavy")
    scheduler.submit(heavy)
    assert heavy_started.wait(5)
    more_of_heavy = sample_operation(ledger, kind, "heavy", "heavy-2")
    for operation in (more_of_heavy, light):
        scheduler.submit(operation)
    proceed.set()
    wait_for(lambda: all(ledger.get(op.request_id).finished for op in (heavy, more_of_heavy, light)))

    # The light tenant's request ran inside the heavy generation, once its window had passed; the heavy tenant's own
    # next request waited for its generation to end.
    assert log == ["heavy starts", ["light"], "heavy ends", ["heavy-2"]]
    assert nested_at[0] >= light.enqueued_at + window_s


def test_a_batch_nested_in_a_pause_is_small_so_the_paused_batch_steps_between_nested_ones(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    """A nested batch does not pause: the paused batch waits for all of it. So it holds at most NESTED_BATCH_SHARE
    of a batch, and another tenant's queue runs as several small nested batches, the long batch going on between."""
    log: list = []

    def generation(operations, pause):
        payloads = [op.payload for op in operations]
        if payloads == ["heavy"]:
            deadline = time.monotonic() + 10
            while not all(ledger.get(op.request_id).finished for op in light) and time.monotonic() < deadline:
                log.append("heavy step")
                time.sleep(0.02)
                pause()
        else:
            log.append(payloads)
            time.sleep(0.02)
        return [(b"{}", ResultFormat.JSON) for _ in operations]

    scheduler = start_scheduler()
    # Each light request is a tenth of a batch.
    budget = BatchBudget(lambda payload: 1.0 if payload == "heavy" else 0.1)
    kind = BatchKind("sample", generation, window_s=0.05, budget=budget, nests=True)
    scheduler.register(kind)
    light = [sample_operation(ledger, kind, "light", f"light-{i}") for i in range(6)]
    heavy = running(scheduler, sample_operation(ledger, kind, "heavy", "heavy"))
    for operation in light:
        scheduler.submit(operation)
    wait_for(lambda: all(ledger.get(op.request_id).finished for op in [heavy, *light]), timeout_s=20)

    nested = [entry for entry in log if isinstance(entry, list)]
    assert sorted(p for batch in nested for p in batch) == [f"light-{i}" for i in range(6)]
    assert max(len(batch) for batch in nested) <= 2 < len(nested), nested
    first, last = log.index(nested[0]), log.index(nested[-1])
    assert "heavy step" in log[first:last], "the heavy batch took steps between the nested ones"


def _stepping_generation(
    steps: int, admitted: list, refuse: str | None = None, pause_first: bool = False, lifetime: int = 2
):
    """A batch runner that runs `steps` steps, taking other lanes' operations in before each (all but payload
    `refuse`) and finishing each operation `lifetime` steps after it joined; those it was given run to the end. Each
    step pauses after its finished operations are answered, or before with `pause_first`."""

    def generation(operations, call):
        running = list(operations)
        joined_at: dict[str, int] = {}
        for step in range(steps):
            taken = call.admit(lambda op: op.payload != refuse)
            admitted.append([op.payload for op in taken])
            running += taken
            joined_at.update((op.request_id, step) for op in taken)
            if pause_first:
                call()
            for op in running:
                if joined_at.get(op.request_id, steps) + lifetime == step:
                    call.finish(op, (op.payload.encode(), ResultFormat.JSON))
            if not pause_first:
                call()
            time.sleep(0.02)
        return [(op.payload.encode(), ResultFormat.JSON) for op in running]

    return generation


def test_a_running_batch_takes_in_gathered_operations_of_any_tenant_and_answers_them_early(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    admitted: list[list[str]] = []
    scheduler = start_scheduler()
    kind = BatchKind("sample", _stepping_generation(40, admitted), window_s=0.05, nests=True)
    scheduler.register(kind)
    heavy = running(scheduler, sample_operation(ledger, kind, "heavy", "heavy"))
    more_of_heavy, light, light_2 = (
        sample_operation(ledger, kind, lane, payload)
        for lane, payload in (("heavy", "heavy-2"), ("light", "light"), ("light", "light-2"))
    )
    for operation in (more_of_heavy, light, light_2):
        scheduler.submit(operation)
    wait_for(lambda: ledger.get(light.request_id).finished)

    # The other tenant's two requests joined once gathered, and were answered while the batch still ran; so did the
    # batch's own tenant's next request (a step's requests past one batch's budget do not wait for its end): the
    # tenants take turns, the other tenant first, one request each at a step.
    assert [taken for taken in admitted if taken][:2] == [["light", "heavy-2"], ["light-2"]]
    assert ledger.get(heavy.request_id).state != FutureState.DONE
    wait_for(lambda: ledger.get(heavy.request_id).finished)
    for joined in (more_of_heavy, light_2):
        assert ledger.get(joined.request_id).updated_at < ledger.get(heavy.request_id).updated_at
    stats = scheduler.stats()
    assert stats.batches >= 1 and stats.batched_operations >= 3


def test_by_the_rule_before_a_running_batch_took_in_no_more_of_its_own_tenants_operations(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scheduler_module, "JOIN_OWN_PARTY", False)  # the variant join-new-parties-only
    admitted: list[list[str]] = []
    scheduler = start_scheduler()
    kind = BatchKind("sample", _stepping_generation(40, admitted), window_s=0.05, nests=True)
    scheduler.register(kind)
    heavy = running(scheduler, sample_operation(ledger, kind, "heavy", "heavy"))
    more_of_heavy, light = (sample_operation(ledger, kind, lane, lane + "-2") for lane in ("heavy", "light"))
    for operation in (more_of_heavy, light):
        scheduler.submit(operation)
    wait_for(lambda: ledger.get(more_of_heavy.request_id).finished)

    assert ["light-2"] in admitted and all("heavy-2" not in taken for taken in admitted)
    assert ledger.get(more_of_heavy.request_id).updated_at >= ledger.get(heavy.request_id).updated_at


def test_a_run_created_while_an_evaluation_feeds_a_batch_waits_for_that_batch_to_drain_not_for_the_evaluation(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    """An evaluation's requests keep joining the batch its first ones started; another run's creation (it adds an
    adapter: it may run neither in a pause nor in the batch) stops the batch taking more in, runs once its rows are
    done, and the evaluation's next requests run after it."""
    admitted: list[list[str]] = []
    log: list = []
    scheduler = start_scheduler()
    kind = BatchKind("sample", _stepping_generation(200, admitted), window_s=0.01, nests=True)
    scheduler.register(kind)
    evaluation = [sample_operation(ledger, kind, "evaluation", f"question-{i}", run="eval-run") for i in range(60)]
    running(scheduler, evaluation[0])
    for operation in evaluation[1:20]:
        scheduler.submit(operation)
    wait_for(lambda: any(admitted))
    creation = _operation(ledger, "new-trial", 1, log)
    scheduler.submit(creation)
    for operation in evaluation[20:]:
        scheduler.submit(operation)
    wait_for(lambda: ledger.get(creation.request_id).finished, timeout_s=20)

    taken_in = {payload for step in admitted for payload in step}
    assert not any(f"question-{i}" in taken_in for i in range(20, 60)), "the batch took more in while it waited"
    assert not ledger.get(evaluation[-1].request_id).finished
    wait_for(lambda: all(ledger.get(op.request_id).finished for op in evaluation))


def test_what_a_running_batch_does_not_take_in_runs_nested_in_its_pause(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    admitted: list[list[str]] = []
    scheduler = start_scheduler()
    kind = BatchKind("sample", _stepping_generation(40, admitted, refuse="scored"), window_s=0.05, nests=True)
    scheduler.register(kind)
    heavy = running(scheduler, sample_operation(ledger, kind, "heavy", "heavy"))
    scored = sample_operation(ledger, kind, "light", "scored")
    finished(scheduler, ledger, scored)

    assert all("scored" not in taken for taken in admitted)
    assert not ledger.get(heavy.request_id).finished, "it ran in the heavy batch's pause, not after it"


def test_a_run_flooding_through_two_sessions_holds_one_runs_share_of_a_running_batch(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    """The batch is full; past its budget a tenant joins up to its even share among the batch's tenants. A run's
    requests through two sampling sessions are one tenant's: they take as much as the other run's through one."""
    admitted: list[list[str]] = []
    scheduler = start_scheduler()
    budget = BatchBudget(lambda payload: 1.0 if payload == "heavy" else 0.25)
    kind = BatchKind(
        "sample", _stepping_generation(40, admitted, lifetime=30), window_s=0.05, budget=budget, nests=True
    )
    scheduler.register(kind)
    running(scheduler, sample_operation(ledger, kind, "heavy", "heavy", run="heavy-run"))
    flood = [sample_operation(ledger, kind, f"flood-session-{i % 2}", f"flood-{i}", run="flood-run") for i in range(4)]
    other = [sample_operation(ledger, kind, "other-session", f"other-{i}", run="other-run") for i in range(2)]
    for operation in [*flood, *other]:
        scheduler.submit(operation)
    wait_for(lambda: len(admitted) >= 10)

    # Three tenants share twice the budget: each joining run holds two thirds of one, two requests, however many
    # sessions its requests come through (a tenant per session would give the flooding run three, the other one).
    # None has ended yet (each runs 30 steps).
    joined = Counter(payload.split("-")[0] for taken in admitted[:10] for payload in taken)
    assert joined == {"flood": 2, "other": 2}


def test_a_request_the_running_batch_refuses_is_not_held_behind_a_run_that_keeps_feeding_it(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    """A batch that is full past its budget keeps taking in a run's next requests as the last ones finish (two
    sessions of one run, one after the other); another run's request that it cannot take in (a prompt scored, a cache
    too small) may run nested only once the batch holds no more than its budget. Once it refuses that request, the
    batch takes nothing more in, so the request runs in one of its next pauses, not after the batch's last step."""
    admitted: list[list[str]] = []
    scheduler = start_scheduler()
    shares = {"heavy": 1.0, "light": 0.25, "scored": 0.25}
    budget = BatchBudget(lambda payload: shares[payload.split("-")[0]])
    kind = BatchKind(
        "sample",
        _stepping_generation(60, admitted, refuse="scored-0", pause_first=True),
        window_s=0.05,
        budget=budget,
        nests=True,
    )
    scheduler.register(kind)
    heavy = running(scheduler, sample_operation(ledger, kind, "heavy", "heavy-0", run="heavy-run"))
    light = [sample_operation(ledger, kind, f"light-session-{i % 2}", f"light-{i}", run="light-run") for i in range(60)]
    for operation in light:
        scheduler.submit(operation)
    wait_for(lambda: any(admitted))
    scored = sample_operation(ledger, kind, "scored-session", "scored-0", run="scored-run")
    finished(scheduler, ledger, scored, timeout_s=20)

    assert not ledger.get(heavy.request_id).finished, "it ran in the batch's pause, not after it"


def test_a_tenant_joins_past_the_budget_only_up_to_its_even_share(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    admitted: list[list[str]] = []
    scheduler = start_scheduler()
    # Each request takes a quarter of a batch: the heavy tenant's four fill one.
    budget = BatchBudget(lambda payload: 0.25)
    kind = BatchKind(
        "sample", _stepping_generation(40, admitted, lifetime=30), window_s=0.05, budget=budget, nests=True
    )
    scheduler.register(kind)
    heavy = _queued_while_busy(scheduler, ledger, kind, "heavy", 4)
    wait_for(lambda: heavy[0].request_id in scheduler.stats().running)
    light = [sample_operation(ledger, kind, "light", f"light-{i}") for i in range(6)]
    for operation in light:
        scheduler.submit(operation)
    wait_for(lambda: len(admitted) >= 10)

    # The batch is full, so the light tenant takes in its even share of twice the budget among the two tenants, as
    # much as the heavy one holds: four requests (one a step), the others once those are done (past twice the
    # budget, the batch's memory would grow past what a batch and a batch nested in its pause held).
    assert [payload for taken in admitted[:10] for payload in taken] == [f"light-{i}" for i in range(4)]


def test_a_generation_takes_at_most_its_pass_share_in_its_first_batch_and_in_each_admission(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    first_batches: list[list[str]] = []
    admitted: list[list[str]] = []
    stepping = _stepping_generation(20, admitted, lifetime=30)

    def generation(operations, call):
        first_batches.append([op.payload for op in operations])
        return stepping(operations, call)

    scheduler = start_scheduler()
    # Each request takes a tenth of a batch; a pass may prefill a quarter.
    kind = BatchKind(
        "sample", generation, window_s=0.05, budget=BatchBudget(lambda payload: 0.1), nests=True, pass_share=0.25
    )
    scheduler.register(kind)
    evaluation = _queued_while_busy(scheduler, ledger, kind, "eval", 8)
    wait_for(lambda: all(ledger.get(op.request_id).finished for op in evaluation))

    # All eight were ready when the call formed, and fit its budget; it started with two and took in two a step (a
    # pass that prefills cannot pause: every other tenant would wait for all eight prompts).
    assert first_batches == [["eval-0", "eval-1"]]
    assert [taken for taken in admitted if taken] == [[f"eval-{i}", f"eval-{i + 1}"] for i in (2, 4, 6)]


@pytest.mark.parametrize("same_pass", [True, False])
def test_beside_another_run_a_lanes_requests_that_cost_little_together_join_in_one_pass(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler], same_pass: bool
) -> None:
    """Beside another run a run's requests join one at a time, except a lane's run of requests the kind says cost
    little prefilled together (a KL penalty's reference scores: one prompt's completions), up to the pass share."""
    admitted: list[list[str]] = []
    scheduler = start_scheduler()
    kind = BatchKind(
        "sample",
        _stepping_generation(40, admitted, lifetime=1),
        window_s=0.05,
        budget=BatchBudget(lambda payload: 0.1, same_pass=lambda a, b: same_pass and a[:2] == b[:2]),
        nests=True,
        pass_share=0.3,
    )
    scheduler.register(kind)
    rl = running(scheduler, sample_operation(ledger, kind, "rl", "rows", run="rl"))
    # Two prompts' completions: p0 four of them, p1 two.
    scores = ["p0-a", "p0-b", "p0-c", "p0-d", "p1-a", "p1-b"]
    for payload in scores:
        scheduler.submit(sample_operation(ledger, kind, "reference", payload, run="kl"))
    wait_for(lambda: ledger.get(rl.request_id).finished)

    taken = [batch for batch in admitted if batch]
    assert [payload for batch in taken for payload in batch] == scores
    if same_pass:
        # Three of p0 fill the pass share; p1's first cannot go with p0's last.
        assert taken == [["p0-a", "p0-b", "p0-c"], ["p0-d"], ["p1-a", "p1-b"]]
    else:
        assert all(len(batch) == 1 for batch in taken)


def test_a_joined_operation_counts_the_device_time_from_when_it_joined(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    admitted: list[list[str]] = []
    seconds: dict[str, float] = {}
    scheduler = start_scheduler()
    scheduler.on_device_time(lambda operation, share: seconds.__setitem__(operation.payload, share))
    kind = BatchKind("sample", _stepping_generation(40, admitted), window_s=0.05, nests=True)
    scheduler.register(kind)
    heavy = running(scheduler, sample_operation(ledger, kind, "heavy", "heavy"))
    scheduler.submit(sample_operation(ledger, kind, "light", "light"))
    wait_for(lambda: ledger.get(heavy.request_id).finished)

    # The light request shared two of about forty steps of 20 ms, half each: a small part of the call's time, all of
    # which the two requests share between them.
    assert 0 < seconds["light"] < 0.2 * seconds["heavy"]
    assert seconds["light"] + seconds["heavy"] == pytest.approx(scheduler.stats().busy_seconds, rel=0.05)


def test_the_prefill_of_a_joined_operation_counts_to_it_alone(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    prefill_s = 0.4
    seconds: dict[str, float] = {}

    def generation(operations, call):
        running = list(operations)
        light_done = False
        for _ in range(30):
            taken = call.admit(lambda op: True)
            if taken:
                time.sleep(prefill_s)  # the joined request's prompt, while the running rows wait
                call.prefilled()
                running += taken
            elif len(running) > 1 and not light_done:
                call.finish(running[1], (b"{}", ResultFormat.JSON))
                light_done = True
            time.sleep(0.01)
        return [(op.payload.encode(), ResultFormat.JSON) for op in running]

    scheduler = start_scheduler()
    scheduler.on_device_time(lambda operation, share: seconds.__setitem__(operation.payload, share))
    kind = BatchKind("sample", generation, window_s=0.05, nests=True)
    scheduler.register(kind)
    heavy = running(scheduler, sample_operation(ledger, kind, "heavy", "heavy"))
    scheduler.submit(sample_operation(ledger, kind, "light", "light"))
    wait_for(lambda: ledger.get(heavy.request_id).finished)

    # The light request's prefill and half of the one step it shared; the heavy one's steps, none of that prefill.
    assert prefill_s <= seconds["light"] < prefill_s + 0.1
    assert seconds["heavy"] < scheduler.stats().busy_seconds - prefill_s + 0.01


@pytest.mark.parametrize("within_recent_share", [True, False])
def test_an_evaluation_whose_requests_cost_more_to_take_in_gets_no_more_of_the_call_than_the_run_beside_it(
    ledger: Ledger,
    start_scheduler: Callable[..., Scheduler],
    monkeypatch: pytest.MonkeyPatch,
    within_recent_share: bool,
) -> None:
    """An RL run's rows decode for the whole call; an evaluation's requests (a long prompt, a short answer) join it,
    each prefilled for 50 ms while every row waits, and answered two steps of 10 ms later. Held to its recent share,
    the evaluation takes in no more than keeps its time level with the RL run's; else (the variant) it takes most."""
    monkeypatch.setattr(scheduler_module, "JOIN_WITHIN_RECENT_SHARE", within_recent_share)
    seconds: dict[str, float] = {}

    def generation(operations, call):
        running, joined_at = list(operations), {}
        for step in range(60):
            taken = call.admit(lambda op: True)
            if taken:
                time.sleep(0.05 * len(taken))
                call.prefilled()
                running += taken
                joined_at.update((op.request_id, step) for op in taken)
            for op in running:
                if joined_at.get(op.request_id) == step - 2:
                    call.finish(op, (b"{}", ResultFormat.JSON))
            time.sleep(0.01)
        return [(op.payload.encode(), ResultFormat.JSON) for op in running]

    scheduler = start_scheduler()
    scheduler.on_device_time(
        lambda operation, share: seconds.__setitem__(operation.run, seconds.get(operation.run, 0.0) + share)
    )
    kind = BatchKind("sample", generation, window_s=0.01, nests=True)
    scheduler.register(kind)
    rl = running(scheduler, sample_operation(ledger, kind, "rl-step", "rows", run="rl"))
    for i in range(100):
        scheduler.submit(sample_operation(ledger, kind, "evaluation", f"question-{i}", run="eval"))
    wait_for(lambda: ledger.get(rl.request_id).finished, timeout_s=60)

    if within_recent_share:
        assert seconds["eval"] < 1.5 * seconds["rl"]
    else:
        assert seconds["eval"] > 3 * seconds["rl"]


def test_a_long_batch_yields_at_most_its_share_of_the_device_to_other_tenants(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    share_limit = 2.0
    monkeypatch.setattr(scheduler_module, "PAUSE_SHARE_LIMIT", share_limit)
    other_work_s = 1.0
    spans: dict[int, tuple[float, float]] = {}
    generation_started: list[float] = []

    def slow_step(seq_id: int) -> Callable[[], tuple[bytes, ResultFormat]]:
        def work() -> tuple[bytes, ResultFormat]:
            started = time.monotonic()
            time.sleep(other_work_s)
            spans[seq_id] = (started, time.monotonic())
            return b"{}", ResultFormat.JSON

        return work

    steps = [_operation(ledger, "trainer", seq, [], slow_step(seq)) for seq in (1, 2)]

    def long_generation(operations, pause):
        generation_started.append(time.monotonic())
        for operation in steps:
            operation.interleaves = True
            scheduler.submit(operation)
        deadline = time.monotonic() + 20
        while len(spans) < 2 and time.monotonic() < deadline:
            pause()
            time.sleep(0.005)
        return [(b"{}", ResultFormat.JSON) for _ in operations]

    kind = BatchKind("sample", long_generation)
    scheduler = start_scheduler(kind)
    generation = sample_operation(ledger, kind, "sampler", "long")
    finished(scheduler, ledger, generation)

    assert set(spans) == {1, 2}, "both steps run inside the generation"
    # The second step was ready at once (the next pause comes 5 ms later), but may start only once the generation's
    # own time is half the time it paused for (a limit of 2): 1.5 times the first step's time after the generation
    # began. Without the limit it would start right after the first step, about 1.0 times it. The margin covers the
    # moments between the scheduler's start of the batch and the generation's first line, however loaded the machine.
    first_start, first_end = spans[1]
    second_start = spans[2][0]
    assert second_start - generation_started[0] >= 1.35 * (first_end - first_start)


def test_a_long_batch_yields_its_share_of_recent_time_not_of_its_whole_life(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A generation that ran alone for a while owes others no long run of pauses for it: once others' work queues, it
    yields them PAUSE_SHARE_LIMIT times its own time over the last PAUSE_SHARE_WINDOW_S, so it keeps a third of the
    device while they have work, instead of next to none for twice its age."""
    monkeypatch.setattr(scheduler_module, "PAUSE_SHARE_LIMIT", 2.0)
    monkeypatch.setattr(scheduler_module, "PAUSE_SHARE_WINDOW_S", 0.5)
    alone_s, own_step_s, other_step_s = 1.5, 0.02, 0.2
    spans: list[tuple[float, float]] = []

    def slow_step() -> tuple[bytes, ResultFormat]:
        started = time.monotonic()
        time.sleep(other_step_s)
        spans.append((started, time.monotonic()))
        return b"{}", ResultFormat.JSON

    steps = [_operation(ledger, "trainer", seq, [], slow_step) for seq in range(1, 9)]

    def long_generation(operations, pause):
        deadline = time.monotonic() + alone_s
        while time.monotonic() < deadline:  # alone: nothing else is queued
            pause()
            time.sleep(own_step_s)
        for operation in steps:
            operation.interleaves = True
            scheduler.submit(operation)
        deadline = time.monotonic() + 30
        while len(spans) < len(steps) and time.monotonic() < deadline:
            pause()
            time.sleep(own_step_s)
        return [(b"{}", ResultFormat.JSON) for _ in operations]

    kind = BatchKind("sample", long_generation)
    scheduler = start_scheduler(kind)
    generation = sample_operation(ledger, kind, "sampler", "long")
    finished(scheduler, ledger, generation, timeout_s=40)

    assert len(spans) == len(steps), "all the steps ran inside the generation"
    # While the steps had work queued, the generation's own share of the time: over its life (1.5 s alone, which
    # would leave them 3 s) it would get a step of 20 ms per step of theirs of 200 ms, 9%; over the last 0.5 s, a third.
    while_queued = spans[-1][1] - spans[0][0]
    own_share = 1 - sum(end - start for start, end in spans) / while_queued
    assert own_share > 0.25, own_share


@pytest.mark.parametrize("by_party", [True, False])
def test_a_party_whose_rows_ran_in_a_batch_gets_of_its_pauses_only_what_makes_its_time_even(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler], monkeypatch: pytest.MonkeyPatch, by_party: bool
) -> None:
    """Two trials share a generation (an evaluation's rows and an RL step's), then the RL trial's training pass runs in
    its pauses. Counting the call's own time as the host's would give the RL trial its rows' half and pauses as long
    as the whole call besides; counted by party (`Scheduler._owed_pause`), the evaluation keeps half of the device
    while the pass runs (issue 48)."""
    monkeypatch.setattr(scheduler_module, "PAUSE_SHARE_BY_PARTY", by_party)
    together_s, own_step_s, pass_step_s = 1.5, 0.02, 0.1
    own_steps: list[tuple[float, float]] = []
    pass_steps: list[tuple[float, float]] = []

    def pass_step() -> tuple[bytes, ResultFormat]:
        started = time.monotonic()
        time.sleep(pass_step_s)
        pass_steps.append((started, time.monotonic()))
        return b"{}", ResultFormat.JSON

    training = [_operation(ledger, "rl-trainer", seq, [], pass_step) for seq in range(1, 9)]
    for operation in training:
        operation.run, operation.interleaves = "rl", True

    def step() -> None:
        started = time.monotonic()
        time.sleep(own_step_s)
        own_steps.append((started, time.monotonic()))

    def generation(operations, call):
        assert {op.party for op in operations} == {"eval", "rl"}, "both trials' rows in one call"
        deadline = time.monotonic() + together_s
        while time.monotonic() < deadline:
            step()
            call()
        call.finish(next(op for op in operations if op.party == "rl"), (b"{}", ResultFormat.JSON))
        own_steps.clear()
        for operation in training:
            scheduler.submit(operation)
        deadline = time.monotonic() + 30
        while len(pass_steps) < len(training) and time.monotonic() < deadline:
            step()
            call()
        return [(b"{}", ResultFormat.JSON) for _ in operations]

    kind = BatchKind("sample", generation, window_s=0.05, budget=BatchBudget(lambda payload: 0.5))
    scheduler = start_scheduler(kind)
    gate = threading.Event()
    scheduler.submit(_operation(ledger, "holder", 1, [], _held_until(gate)))
    rows = [sample_operation(ledger, kind, name, name, run=name) for name in ("eval", "rl")]
    for operation in rows:
        scheduler.submit(operation)
    gate.set()
    wait_for(lambda: all(ledger.get(op.request_id).finished for op in rows), timeout_s=40)

    assert len(pass_steps) == len(training), "the whole pass ran in the generation's pauses"
    start, end = pass_steps[0][0], pass_steps[-1][1]
    own = sum(min(e, end) - max(s, start) for s, e in own_steps if e > start and s < end)
    # By party, a step of the pass once the generation has had as long; counted apart, a step in every pause (the
    # generation's own share about a sixth) for as long as the call had run.
    if by_party:
        assert own / (end - start) > 0.35, own / (end - start)
    else:
        assert own / (end - start) < 0.25, own / (end - start)


def test_a_batch_kind_that_does_not_nest_waits_for_the_long_batch(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    log: list = []
    started = threading.Event()
    proceed = threading.Event()

    def generation(operations, pause):
        payloads = [op.payload for op in operations]
        log.append(payloads)
        if payloads == ["heavy"]:
            started.set()
            proceed.wait(5)
            for _ in range(3):
                pause()
        return [(b"{}", ResultFormat.JSON) for _ in operations]

    kind = BatchKind("sample", generation)
    scheduler = start_scheduler(kind)
    heavy, light = sample_operation(ledger, kind, "heavy", "heavy"), sample_operation(ledger, kind, "light", "light")
    scheduler.submit(heavy)
    assert started.wait(5)
    scheduler.submit(light)
    proceed.set()
    wait_for(lambda: all(ledger.get(op.request_id).finished for op in (heavy, light)))
    assert log == [["heavy"], ["light"]]


def test_the_fifo_policy_serves_in_arrival_order_across_tenants(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    scheduler = start_scheduler(policy="fifo")
    log: list = []
    gate = threading.Event()
    blocked = _held_until(gate)

    scheduler.submit(_operation(ledger, "blocker", None, log, blocked))
    wait_for(lambda: scheduler.stats().running)
    for seq in range(1, 4):
        scheduler.submit(_operation(ledger, "busy", seq, log))
    scheduler.submit(_operation(ledger, "quiet", 1, log))
    gate.set()
    wait_for(lambda: len(log) == 4)
    # Unlike the default policy, the quiet tenant waits behind everything that arrived before it.
    assert log == [("busy", 1), ("busy", 2), ("busy", 3), ("quiet", 1)]


def test_requests_of_a_batch_kind_sent_moments_apart_gather_into_one_batch(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    calls: list[list[str]] = []

    def run_samples(operations, pause):
        calls.append([op.payload for op in operations])
        return [(op.payload.encode(), ResultFormat.JSON) for op in operations]

    # A wide window against a short gap, so that a slow machine cannot make the gap outlast the window.
    kind = BatchKind("sample", run_samples, window_s=0.5)
    scheduler = start_scheduler(kind)
    samples = [sample_operation(ledger, kind, "s1", payload) for payload in "abc"]
    for operation in samples:
        scheduler.submit(operation)
        time.sleep(0.02)
    wait_for(lambda: all(ledger.get(op.request_id).finished for op in samples))
    assert calls == [["a", "b", "c"]]


def test_without_a_window_the_first_request_runs_at_once(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    calls: list[list[str]] = []
    first_started = threading.Event()
    release = threading.Event()

    def run_samples(operations, pause):
        calls.append([op.payload for op in operations])
        first_started.set()
        release.wait(5)
        return [(op.payload.encode(), ResultFormat.JSON) for op in operations]

    kind = BatchKind("sample", run_samples)
    scheduler = start_scheduler(kind)
    samples = [sample_operation(ledger, kind, "s1", payload) for payload in "abc"]
    scheduler.submit(samples[0])
    assert first_started.wait(5)
    for operation in samples[1:]:
        scheduler.submit(operation)
    release.set()
    wait_for(lambda: all(ledger.get(op.request_id).finished for op in samples))
    assert calls == [["a"], ["b", "c"]]


# --- through the server ---------------------------------------------------------------------------------------


def test_another_clients_training_step_runs_while_a_long_generation_is_under_way(server: RunningServer) -> None:
    key = "tml-interleaving"
    with tinker.ServiceClient(base_url=server.url, api_key=key) as client:
        training = client.create_lora_training_client(base_model=TINY, rank=4).result()
        tokenizer = training.get_tokenizer()
        sampler = client.create_sampling_client(base_model=TINY).result()
        long_generation = sampler.sample(
            prompt=types.ModelInput.from_ints([3, 5, 7]),
            num_samples=1,
            sampling_params=types.SamplingParams(max_tokens=400, temperature=1.0, stop=[]),
        )
        deadline = time.monotonic() + 30
        while "sample" not in status_of(server, key)["device"]["running_kinds"] and time.monotonic() < deadline:
            time.sleep(0.02)

        datum = next_token_datum(tokenizer.encode("select 1"))
        training.forward_backward([datum], "cross_entropy").result()
        training.optim_step(types.AdamParams(learning_rate=1e-3)).result()

        # The step finished inside the generation's pauses: the generation is still running.
        still = [f for f in status_of(server, key)["in_flight"] if f["kind"] == "sample"]
        assert still and still[0]["state"] == "running"
        assert len(long_generation.result().sequences[0].tokens) == 400
