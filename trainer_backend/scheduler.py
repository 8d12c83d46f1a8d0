"""The device worker: one thread runs every device operation, in each training client's seq_id order.

Requests arrive on the HTTP loop and become `Operation`s. For a training client, operation n+1 never runs
before operation n (the SDK numbers them and relies on it; chunks of one batch may even arrive out of order). A
gap that stays open longer than `gap_timeout_s` fails the waiting operations with a message, instead of leaving
their futures hanging. Across tenants the worker serves the least recently served one first, so a tenant with
a deep queue cannot starve the others. Busy time is measured around each operation.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from trainer_backend.errors import BackendError, ConflictError, OverloadedError
from trainer_backend.ledger import Ledger, ResultFormat

log = logging.getLogger(__name__)

# What an operation returns: the result bytes and how they are encoded.
Work = Callable[[], tuple[bytes, ResultFormat]]


@dataclass
class Operation:
    request_id: str
    kind: str
    # The tenant whose order and fairness this operation counts toward: a model id or a sampling session.
    lane: str
    work: Work
    # Position in the lane's order; None for operations that need no ordering (sampling).
    seq_id: int | None = None
    enqueued_at: float = field(default_factory=time.monotonic)


@dataclass
class _Lane:
    next_seq: int = 1
    waiting: dict[int, Operation] = field(default_factory=dict)
    # seq_ids of requests refused before they were queued: nothing runs for them, and nothing waits for them.
    skipped: set[int] = field(default_factory=set)
    unordered: deque[Operation] = field(default_factory=deque)
    last_served: float = 0.0
    gap_since: float | None = None

    def ready(self) -> Operation | None:
        if self.next_seq in self.waiting:
            return self.waiting[self.next_seq]
        return self.unordered[0] if self.unordered else None

    def pop(self, operation: Operation) -> None:
        if operation.seq_id is None:
            self.unordered.popleft()
        else:
            del self.waiting[operation.seq_id]
            self.advance_to(operation.seq_id + 1)

    def advance_to(self, next_seq: int) -> None:
        self.next_seq = next_seq
        while self.next_seq in self.skipped:
            self.next_seq += 1
        self.skipped = {seq for seq in self.skipped if seq > self.next_seq}

    def taken(self, seq_id: int) -> bool:
        return seq_id < self.next_seq or seq_id in self.waiting or seq_id in self.skipped

    def __len__(self) -> int:
        return len(self.waiting) + len(self.unordered)


@dataclass(frozen=True)
class SchedulerStats:
    queued: int
    queued_by_lane: dict[str, int]
    busy_seconds: float
    operations_by_kind: dict[str, int]
    running: str | None


class Scheduler:
    """Runs operations on one worker thread; `submit` is safe from any thread."""

    def __init__(self, ledger: Ledger, max_queued: int = 1024, gap_timeout_s: float = 60.0) -> None:
        self.ledger = ledger
        self.max_queued = max_queued
        self.gap_timeout_s = gap_timeout_s
        self._lanes: dict[str, _Lane] = {}
        self._condition = threading.Condition()
        self._stopping = False
        self._busy_seconds = 0.0
        self._operations_by_kind: dict[str, int] = {}
        self._running: str | None = None
        self._busy_listeners: list[Callable[[float, float], None]] = []
        self._thread = threading.Thread(target=self._run, name="device-worker", daemon=True)
        self._thread.start()

    def on_busy(self, listener: Callable[[float, float], None]) -> None:
        """Called with (start, end) monotonic times after each operation, for duty-cycle accounting."""
        self._busy_listeners.append(listener)

    def submit(self, operation: Operation) -> None:
        """Queue an operation; raises OverloadedError when the queues are full (the client backs off)."""
        with self._condition:
            if self._queued() >= self.max_queued:
                raise OverloadedError(f"the server has {self.max_queued} operations queued; retry shortly")
            lane = self._lanes.setdefault(operation.lane, _Lane())
            if operation.seq_id is None:
                lane.unordered.append(operation)
            else:
                if lane.taken(operation.seq_id):
                    # The ledger answers retries before they get here; this is a client numbering bug.
                    raise ConflictError(f"seq_id {operation.seq_id} of {operation.lane} was already scheduled")
                lane.waiting[operation.seq_id] = operation
            self._condition.notify()

    def expect_sequence(self, lane: str, next_seq: int) -> None:
        """Start a new lane's numbering somewhere other than 1; a lane that exists already keeps its place.

        A model's creation is its seq 0 and may be retried after it ran: rewinding the lane then would make the
        model's next request wait for a seq_id that already ran.
        """
        with self._condition:
            self._lanes.setdefault(lane, _Lane(next_seq=next_seq))

    def skip(self, lane: str, seq_id: int) -> None:
        """Count `seq_id` as done without running anything: its request was refused before it was queued.

        The SDK numbers a training client's requests before sending them, so a refused one leaves a gap that its
        next requests would otherwise wait on until `gap_timeout_s`. A seq_id already queued or run is left alone.
        """
        with self._condition:
            state = self._lanes.setdefault(lane, _Lane())
            if not state.taken(seq_id):
                state.skipped.add(seq_id)
                state.advance_to(state.next_seq)
                self._condition.notify()

    def queued(self, lane: str) -> int:
        """Operations of one lane waiting to run (cheap: every training request asks)."""
        with self._condition:
            found = self._lanes.get(lane)
            return len(found) if found is not None else 0

    def stats(self) -> SchedulerStats:
        with self._condition:
            return SchedulerStats(
                queued=self._queued(),
                queued_by_lane={name: len(lane) for name, lane in self._lanes.items() if len(lane)},
                busy_seconds=self._busy_seconds,
                operations_by_kind=dict(self._operations_by_kind),
                running=self._running,
            )

    def stop(self) -> None:
        """Finish the running operation and start no other: what is left stays queued in the ledger, which fails it
        with a reason at the next start. A stop must not wait for the whole queue (the ledger closes after it)."""
        with self._condition:
            self._stopping = True
            self._condition.notify_all()
        self._thread.join(timeout=30)

    def _queued(self) -> int:
        return sum(len(lane) for lane in self._lanes.values())

    def _next(self) -> Operation | None:
        """The ready operation of the least recently served lane; expires operations stuck behind a gap."""
        now = time.monotonic()
        candidates = []
        for name, lane in self._lanes.items():
            operation = lane.ready()
            if operation is not None:
                lane.gap_since = None
                candidates.append((lane.last_served, name, operation))
            elif lane.waiting:
                lane.gap_since = lane.gap_since or now
                if now - lane.gap_since > self.gap_timeout_s:
                    self._expire_gap(name, lane)
        if not candidates:
            return None
        _, name, operation = min(candidates, key=lambda c: c[0])
        lane = self._lanes[name]
        lane.pop(operation)
        lane.last_served = now
        return operation

    def _expire_gap(self, name: str, lane: _Lane) -> None:
        missing = lane.next_seq
        for operation in lane.waiting.values():
            self.ledger.fail(
                operation.request_id,
                f"request seq_id {operation.seq_id} of {name} waited {self.gap_timeout_s:.0f} s for seq_id {missing}, "
                "which never arrived; requests of one training client run in order",
                "user",
            )
        lane.advance_to(max(lane.waiting) + 1)
        lane.waiting.clear()
        lane.gap_since = None

    def _run(self) -> None:
        while True:
            with self._condition:
                operation = None if self._stopping else self._next()
                while operation is None and not self._stopping:
                    # Wake up now and then to expire gaps even when nothing new arrives.
                    self._condition.wait(timeout=1.0)
                    operation = None if self._stopping else self._next()
                if operation is None:
                    return
                self._running = operation.request_id
            self._execute(operation)
            with self._condition:
                self._running = None

    def _execute(self, operation: Operation) -> None:
        self.ledger.mark_running(operation.request_id)
        start = time.monotonic()
        outcome = "done"
        try:
            result, result_format = operation.work()
        except BackendError as error:
            outcome = f"failed ({error.category})"
            self.ledger.fail(operation.request_id, str(error), error.category)
        except Exception as error:  # the worker must survive anything one request provokes
            outcome = "failed (server)"
            log.exception("operation %s (%s) failed", operation.request_id, operation.kind)
            self.ledger.fail(operation.request_id, f"internal error in {operation.kind}: {error}", "server")
        else:
            self.ledger.complete(operation.request_id, result, result_format)
        finally:
            end = time.monotonic()
            log.info(
                "operation %s",
                outcome,
                extra={
                    "request_id": operation.request_id,
                    "kind": operation.kind,
                    "lane": operation.lane,
                    "seq_id": operation.seq_id,
                    "queued_s": round(start - operation.enqueued_at, 4),
                    "run_s": round(end - start, 4),
                },
            )
            with self._condition:
                self._busy_seconds += end - start
                self._operations_by_kind[operation.kind] = self._operations_by_kind.get(operation.kind, 0) + 1
            for listener in self._busy_listeners:
                listener(start, end)
