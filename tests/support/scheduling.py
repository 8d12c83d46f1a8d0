"""Operations for tests of the device scheduler, and the waits that follow one through it."""

from __future__ import annotations

import time
from collections.abc import Callable

from trainer_backend.ledger import FutureRecord, Ledger
from trainer_backend.operations import BatchKind, Operation
from trainer_backend.scheduler import Scheduler


def wait_for(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Return once `condition` holds; fail the test if it still does not after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def sample_operation(
    ledger: Ledger, kind: BatchKind, lane: str, payload: str, run: str | None = None, alone: bool = False
) -> Operation:
    """A sample of `lane` (a sampling session) of batch kind `kind`, reading the weights of training run `run` when
    given; with `alone`, one that runs as a device call of its own."""
    record, _ = ledger.submit("alice", "sample", f"{lane}-{payload}-{time.monotonic_ns()}")
    return Operation(record.request_id, "sample", lane, None, batch_kind=kind, payload=payload, run=run, alone=alone)


def running(scheduler: Scheduler, operation: Operation) -> Operation:
    """`operation`, submitted, once the device runs it."""
    scheduler.submit(operation)
    wait_for(lambda: operation.request_id in scheduler.stats().running)
    return operation


def finished(scheduler: Scheduler, ledger: Ledger, operation: Operation, timeout_s: float = 30.0) -> FutureRecord:
    """The record of `operation`, submitted, once it has finished."""
    scheduler.submit(operation)
    wait_for(lambda: ledger.get(operation.request_id).finished, timeout_s)
    return ledger.get(operation.request_id)
