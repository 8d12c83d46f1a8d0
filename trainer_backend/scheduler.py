"""The device worker: one thread runs every device operation, in each training client's seq_id order.

Requests arrive on the HTTP loop and become `Operation`s. For a training client, operation n+1 never runs
before operation n (the SDK numbers them and relies on it; chunks of one batch may even arrive out of order). A
gap that stays open longer than `gap_timeout_s` fails the waiting operations with a message, instead of leaving
their futures hanging. Across tenants the worker serves the least recently served one first, so a tenant with
a deep queue cannot starve the others. Operations of a kind that has a batch runner (sampling, training passes) run
together: the worker takes ready ones of that kind from all tenants (for a training client only its next in order)
into one device call, one tenant at a time in turn, least recently served first, while the kind's budget has room (a
generation batch's rows and tokens), so a tenant with hundreds of queued requests gets a share of each call, not the
whole of it, and others' requests join the next call. A batch kind may have a gathering window: its oldest ready
operation waits until it is that old before the batch is formed, so that requests a client sends together (an RL
step's prompts, a few milliseconds apart) run as one batch instead of the first alone and the rest behind it. A long
call may pause between its steps to let other tenants' short operations run, and a batch kind may nest: another
tenant's gathered operations of that kind run then as a batch of their own (a light tenant's generation does not wait
for a heavy tenant's to end). Busy time is measured around each device call.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from trainer_backend.errors import BackendError, ConflictError, OverloadedError, ServerError
from trainer_backend.ledger import Ledger, ResultFormat
from trainer_backend.request_kinds import RequestKind

log = logging.getLogger(__name__)

# What an operation returns: the result bytes and how they are encoded.
Work = Callable[[], tuple[bytes, ResultFormat]]
# One operation's outcome in a batch: its result, or the error that failed it.
Outcome = tuple[bytes, ResultFormat] | BackendError
# Runs several operations of one batch kind in one device call; one outcome per operation, in order. A long call
# may call the pause callback between its steps: the scheduler then runs other tenants' ready operations that may
# interleave (their results do not depend on the long call) before the call goes on.
PauseCallback = Callable[[], None]
BatchRunner = Callable[[Sequence["Operation[Any]"], PauseCallback], Sequence[Outcome]]
# Which tenant's ready operation runs next: the least recently served tenant's (the server's policy), or the one that
# arrived first (kept to measure what the policy buys: benchmarks/fairness.py).
SchedulingPolicy = Literal["least_recently_served", "fifo"]
# Operations handed to a batch runner at once; the runner may still split them by its own limits.
MAX_BATCH_OPERATIONS = 64
# A running batch lets other tenants' work run in its pauses while that work has taken at most this many times the
# batch's own device time, so a long generation keeps a third of the device however busy the others are. Measured
# with Gemma 3 270M (benchmarks.fairness --engine, docs/performance.md): with no bound, a tenant's RL steps beside
# another tenant's 332-prompt evaluation ran about as fast as alone and the evaluation's batches took 9 times as long;
# at 2, the RL steps took 1.20 times as long as alone and the evaluation no longer than before nested batches.
PAUSE_SHARE_LIMIT = 2.0


@dataclass(frozen=True)
class BatchBudget:
    """How much of one device call an operation of a batch kind takes (its payload's share, e.g. the larger of its
    rows and its tokens as fractions of a generation batch's limits) and how much one call may hold. An operation
    larger than the whole capacity still runs, alone."""

    share: Callable[[Any], float]
    capacity: float = 1.0


PayloadT = TypeVar("PayloadT")


@dataclass
class Operation(Generic[PayloadT]):
    """One queued request; a batch kind's operations carry a payload of that kind's type for its runner."""

    request_id: str
    kind: RequestKind
    # The tenant whose order and fairness this operation counts toward: a model id or a sampling session.
    lane: str
    # What to run; None for an operation of a batch kind, which its batch runner runs from `payload`.
    work: Work | None
    # Position in the lane's order; None for operations that need no ordering (sampling).
    seq_id: int | None = None
    batch_kind: str | None = None
    # What the batch kind's runner runs (a ForwardBackwardCall, a SampleJob); None with `work`.
    payload: PayloadT | None = None
    # May run while a long batch pauses (a training step may run inside a long generation; nothing that adds or
    # removes adapters may).
    interleaves: bool = False
    # The API key's owner whose open work this operation counts toward (`max_queued_per_owner`).
    owner: str | None = None
    # The training run (model id) whose device time this counts toward: a training client's own, or the run whose
    # sampler weights a sample reads; None for the base model.
    run: str | None = None
    # The checkpoint folder the operation reads (sampler weights it samples, a state it loads): nothing removes a
    # checkpoint that a queued or running operation still needs.
    reads: Path | None = None
    enqueued_at: float = field(default_factory=time.monotonic)
    # Tokens the device processed for this operation, set by its batch runner: a batch's device time is split among
    # its operations in proportion to them (a token costs about the same whoever sent it), evenly where none are set.
    processed_tokens: int = 0


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

    def next_of_kind(self, batch_kind: str) -> Operation | None:
        """The operation of `batch_kind` that may run next: the lane's next one in seq_id order if it is of that
        kind (never a later one: it depends on what runs before it), else its oldest unordered one of that kind."""
        ordered = self.waiting.get(self.next_seq)
        if ordered is not None and ordered.batch_kind == batch_kind:
            return ordered
        return next((op for op in self.unordered if op.batch_kind == batch_kind), None)

    def pop(self, operation: Operation) -> None:
        if operation.seq_id is None:
            self.unordered.remove(operation)
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

    def operations(self) -> list[Operation]:
        return [*self.waiting.values(), *self.unordered]


@dataclass(frozen=True)
class SchedulerStats:
    queued: int
    queued_by_lane: dict[str, int]
    queued_by_owner: dict[str, int]
    busy_seconds: float
    operations_by_kind: dict[str, int]
    # Device calls that ran more than one operation, and the operations they ran.
    batches: int
    batched_operations: int
    running: tuple[str, ...]
    # When the device call running now started (monotonic); None when the device is idle.
    running_since: float | None


class Scheduler:
    """Runs operations on one worker thread; `submit` is safe from any thread."""

    def __init__(
        self,
        ledger: Ledger,
        max_queued: int = 1024,
        gap_timeout_s: float = 60.0,
        batch_runners: dict[str, BatchRunner] | None = None,
        policy: SchedulingPolicy = "least_recently_served",
        batch_windows_s: dict[str, float] | None = None,
        max_queued_per_owner: int | None = None,
        batch_budgets: dict[str, BatchBudget] | None = None,
    ) -> None:
        """`batch_windows_s`: per batch kind, how old its oldest ready operation must be before its batch forms.
        `max_queued_per_owner`: queued operations one owner may have (None: only `max_queued` bounds them).
        `batch_budgets`: per batch kind, what one device call may hold (None: up to MAX_BATCH_OPERATIONS)."""
        self.ledger = ledger
        self.policy = policy
        self.max_queued = max_queued
        self.max_queued_per_owner = max_queued_per_owner
        self.gap_timeout_s = gap_timeout_s
        self._batch_runners = dict(batch_runners or {})
        self._batch_windows_s = dict(batch_windows_s or {})
        self._batch_budgets = dict(batch_budgets or {})
        self._nesting_kinds: set[str] = set()
        # When the batch the worker waits to gather may form (monotonic); None when it waits for nothing.
        self._gathering_until: float | None = None
        self._batches = 0
        self._batched_operations = 0
        self._lanes: dict[str, _Lane] = {}
        self._condition = threading.Condition()
        self._stopping = False
        self._busy_seconds = 0.0
        self._operations_by_kind: dict[str, int] = {}
        self._running: tuple[str, ...] = ()
        self._running_operations: list[Operation] = []
        self._running_since: float | None = None
        self._busy_listeners: list[Callable[[float, float], None]] = []
        self._device_time_listeners: list[Callable[[Operation, float], None]] = []
        # Device seconds that other tenants' operations ran while the running batch paused (the batch's own time is
        # its busy interval less these).
        self._paused_seconds = 0.0
        self._thread = threading.Thread(target=self._run, name="device-worker", daemon=True)
        self._thread.start()

    def on_busy(self, listener: Callable[[float, float], None]) -> None:
        """Called with (start, end) monotonic times after each operation, for duty-cycle accounting."""
        self._busy_listeners.append(listener)

    def on_device_time(self, listener: Callable[[Operation, float], None]) -> None:
        """Called after each device call with each of its operations and the device seconds that were its share."""
        self._device_time_listeners.append(listener)

    def add_batch_kind(
        self,
        kind: str,
        runner: BatchRunner,
        window_s: float = 0.0,
        budget: BatchBudget | None = None,
        nests: bool = False,
    ) -> None:
        """Serve operations of batch kind `kind` with `runner` (as `batch_runners`, `batch_windows_s` and
        `batch_budgets` do at construction), for a component built after the scheduler that queues its own work.

        `nests`: while a batch pauses, operations of this kind from lanes that have none in it (gathered for the
        kind's window) may run as a batch of their own, which does not pause; the runner must leave what the paused
        batch uses alone."""
        with self._condition:
            self._batch_runners[kind] = runner
            self._batch_windows_s[kind] = window_s
            if budget is not None:
                self._batch_budgets[kind] = budget
            if nests:
                self._nesting_kinds.add(kind)

    def submit(self, operation: Operation[Any]) -> None:
        """Queue an operation; raises OverloadedError when the queues are full (the client backs off)."""
        batched = operation.batch_kind is not None
        runnable = operation.payload is not None and operation.batch_kind in self._batch_runners
        if (operation.work is None) != batched or (batched and not runnable):
            raise ValueError(f"operation {operation.kind} needs either work or a batch kind with a runner and payload")
        with self._condition:
            if self._queued() >= self.max_queued:
                raise OverloadedError(f"the server has {self.max_queued} operations queued; retry shortly")
            limit = self.max_queued_per_owner
            if limit is not None and operation.owner is not None and self._queued_by(operation.owner) >= limit:
                raise OverloadedError(
                    f"this API key has {limit} operations queued, the server's limit per key (--max-queued-per-key); "
                    "retry when some have run"
                )
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

    def queued_by(self, owner: str) -> int:
        """Operations of one owner waiting to run."""
        with self._condition:
            return self._queued_by(owner)

    def folders_in_use(self) -> set[Path]:
        """Checkpoint folders that queued or running operations read."""
        with self._condition:
            operations = [op for lane in self._lanes.values() for op in lane.operations()]
            return {op.reads for op in [*operations, *self._running_operations] if op.reads is not None}

    def stats(self) -> SchedulerStats:
        with self._condition:
            return SchedulerStats(
                queued=self._queued(),
                queued_by_lane={name: len(lane) for name, lane in self._lanes.items() if len(lane)},
                queued_by_owner=dict(self._queued_by_owner()),
                busy_seconds=self._busy_seconds,
                operations_by_kind=dict(self._operations_by_kind),
                batches=self._batches,
                batched_operations=self._batched_operations,
                running=self._running,
                running_since=self._running_since,
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

    def _queued_by_owner(self) -> Counter[str]:
        return Counter(op.owner for lane in self._lanes.values() for op in lane.operations() if op.owner is not None)

    def _queued_by(self, owner: str) -> int:
        return self._queued_by_owner()[owner]

    def _next(self, only_interleaving: bool = False) -> list[Operation]:
        """The ready operation of the least recently served lane, with every ready operation it can batch with.

        Also expires operations stuck behind a gap. Empty when nothing is ready. `only_interleaving` considers
        only operations that may run while a long batch pauses.
        """
        now = time.monotonic()
        # Set again below while the chosen batch still gathers; never left over from an earlier look.
        self._gathering_until = None
        paused_lanes = {op.lane for op in self._running_operations} if only_interleaving else set()
        candidates = []
        for name, lane in self._lanes.items():
            operation = lane.ready()
            if operation is not None and only_interleaving and not self._runs_in_pause(operation, paused_lanes, now):
                continue
            if operation is not None:
                lane.gap_since = None
                candidates.append((lane.last_served, name, operation))
            elif lane.waiting:
                lane.gap_since = lane.gap_since or now
                if now - lane.gap_since > self.gap_timeout_s:
                    self._expire_gap(name, lane)
        if not candidates:
            return []
        if self.policy == "fifo":
            candidates.sort(key=lambda c: c[2].enqueued_at)
        else:
            candidates.sort(key=lambda c: c[0])
        _, name, first = candidates[0]
        window_s = self._batch_windows_s.get(first.batch_kind, 0.0) if first.batch_kind is not None else 0.0
        if not only_interleaving and now < first.enqueued_at + window_s:
            self._gathering_until = first.enqueued_at + window_s
            return []
        lane = self._lanes[name]
        lane.pop(first)
        lane.last_served = now
        if first.batch_kind is None:
            return [first]
        # A nested batch takes nothing from the lanes of the batch it runs in.
        mate_lanes = [name for _, name, _ in candidates if name not in paused_lanes]
        return [first, *self._batch_mates(first, mate_lanes, now)]

    def _runs_in_pause(self, operation: Operation, paused_lanes: set[str], now: float) -> bool:
        """Whether `operation` may run while the batch of `paused_lanes` pauses: it interleaves, or it nests (its
        kind nests, its lane has nothing in the paused batch, and its batch has gathered)."""
        if operation.interleaves:
            return True
        kind = operation.batch_kind
        return (
            kind in self._nesting_kinds
            and operation.lane not in paused_lanes
            and now >= operation.enqueued_at + self._batch_windows_s.get(kind, 0.0)
        )

    def _batch_mates(self, first: Operation, lane_names: list[str], now: float) -> list[Operation]:
        """Ready operations of `first`'s batch kind to run with it: one lane at a time in turn (in `lane_names`'
        order, least recently served first), while the kind's budget has room."""
        budget = self._batch_budgets.get(first.batch_kind)
        used = budget.share(first.payload) if budget is not None else 0.0
        # The other lanes take their turns before `first`'s lane takes a second one. A training client's next ordered
        # operation depends on the one taken before it: one per lane and batch.
        turns = [name for name in lane_names if name != first.lane] + ([first.lane] if first.seq_id is None else [])
        mates: list[Operation] = []
        while turns:
            for name in list(turns):
                if 1 + len(mates) >= MAX_BATCH_OPERATIONS:
                    return mates
                lane = self._lanes[name]
                operation = lane.next_of_kind(first.batch_kind)
                share = budget.share(operation.payload) if budget is not None and operation is not None else 0.0
                if operation is None or (budget is not None and used + share > budget.capacity):
                    turns.remove(name)
                    continue
                lane.pop(operation)
                lane.last_served = now
                used += share
                mates.append(operation)
                if operation.seq_id is not None:
                    turns.remove(name)
        return mates

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
                batch = [] if self._stopping else self._next()
                while not batch and not self._stopping:
                    # Wake up now and then to expire gaps even when nothing new arrives, and when a batch has gathered.
                    gathering = self._gathering_until
                    self._condition.wait(timeout=1.0 if gathering is None else max(0.0, gathering - time.monotonic()))
                    batch = [] if self._stopping else self._next()
                if not batch:
                    return
                self._running = tuple(op.request_id for op in batch)
                self._running_operations = list(batch)
                self._running_since = time.monotonic()
            self._execute(batch)
            with self._condition:
                self._running = ()
                self._running_operations = []
                self._running_since = None

    def _pause(self) -> None:
        """A long batch pauses: run one batch of other tenants' ready operations that interleave or nest, if any, unless
        they have had their share of this batch's time (PAUSE_SHARE_LIMIT)."""
        with self._condition:
            running_s = time.monotonic() - (self._running_since or time.monotonic())
            if self._stopping or self._paused_seconds > PAUSE_SHARE_LIMIT * (running_s - self._paused_seconds):
                return
            batch = self._next(only_interleaving=True)
            if not batch:
                return
            paused, paused_operations = self._running, self._running_operations
            self._running = paused + tuple(op.request_id for op in batch)
            self._running_operations = paused_operations + batch
        # Inside the paused batch's busy interval, which already counts this time.
        started = time.monotonic()
        self._execute(batch, nested=True)
        self._paused_seconds += time.monotonic() - started
        with self._condition:
            self._running, self._running_operations = paused, paused_operations

    def _execute(self, batch: list[Operation], nested: bool = False) -> None:
        for operation in batch:
            self.ledger.mark_running(operation.request_id)
        if not nested:
            self._paused_seconds = 0.0
        start = time.monotonic()
        outcomes = self._outcomes(batch, pause=(lambda: None) if nested else self._pause)
        end = time.monotonic()
        # Counted before the futures resolve, so a client that reads its usage after a result finds it there.
        own_seconds = end - start - (0.0 if nested else self._paused_seconds)
        for operation, seconds in zip(batch, _shares(batch, own_seconds), strict=True):
            for time_listener in self._device_time_listeners:
                time_listener(operation, seconds)
        for operation, outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, BackendError):
                result_text = f"failed ({outcome.category})"
                self.ledger.fail(operation.request_id, str(outcome), outcome.category)
            else:
                result_text = "done"
                self.ledger.complete(operation.request_id, *outcome)
            log.info(
                "operation %s",
                result_text,
                extra={
                    "request_id": operation.request_id,
                    "kind": operation.kind,
                    "lane": operation.lane,
                    "seq_id": operation.seq_id,
                    "queued_s": round(start - operation.enqueued_at, 4),
                    "run_s": round(end - start, 4),
                    "batch": len(batch),
                },
            )
        with self._condition:
            if not nested:
                self._busy_seconds += end - start
            for operation in batch:
                self._operations_by_kind[operation.kind] = self._operations_by_kind.get(operation.kind, 0) + 1
            if len(batch) > 1:
                self._batches += 1
                self._batched_operations += len(batch)
        if not nested:
            for listener in self._busy_listeners:
                listener(start, end)

    def _outcomes(self, batch: list[Operation], pause: PauseCallback) -> list[Outcome]:
        """Run one operation or one batch; whatever it raises fails its operations, never the worker."""
        first = batch[0]
        try:
            if first.batch_kind is None:
                return [first.work()]
            outcomes = list(self._batch_runners[first.batch_kind](batch, pause))
            if len(outcomes) != len(batch):
                raise RuntimeError(f"the {first.batch_kind} runner returned {len(outcomes)} outcomes for {len(batch)}")
            return outcomes
        except BackendError as error:
            return [error] * len(batch)
        except Exception:  # the worker must survive anything one request provokes
            log.exception("operation(s) %s (%s) failed", ", ".join(op.request_id for op in batch), first.kind)
            # The exception's text stays in the log: it may name server paths or, in a batch, other tenants' ids.
            return [
                ServerError(f"internal error in {op.kind}; the server's log has the details of request {op.request_id}")
                for op in batch
            ]


def _shares(batch: Sequence[Operation], seconds: float) -> list[float]:
    """A batch's device seconds split in proportion to its operations' processed tokens, evenly without them."""
    tokens = sum(op.processed_tokens for op in batch)
    if tokens <= 0:
        return [seconds / len(batch)] * len(batch)
    return [seconds * op.processed_tokens / tokens for op in batch]
