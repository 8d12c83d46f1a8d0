"""The device worker's unit of work and how it runs: one queued request (`Operation`), the kinds of device call that
run several operations together (`BatchKind`: a runner, a gathering window, a budget, whether it nests), and a call
of it in progress (`BatchCall`), which its runner is handed.

Requests arrive on the HTTP loop and become operations: the scheduler queues them in their tenant's lane
(`lanes.py`) and runs them, alone or in their batch kind's device call. A call that runs step by step (a generation)
may pause between its steps, so that other tenants' short operations run; take in, between its steps, other
tenants' gathered operations of its kind (`BatchCall.admit`); and record each operation's outcome as soon as it is
done (`BatchCall.finish`). A call keeps the device time each of its operations accrued, for the tenants' usage.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from trainer_backend.errors import BackendError
from trainer_backend.ledger import ResultFormat
from trainer_backend.request_kinds import RequestKind

# What an operation returns: the result bytes and how they are encoded.
Work = Callable[[], tuple[bytes, ResultFormat]]
# One operation's outcome in a batch: its result, or the error that failed it.
Outcome = tuple[bytes, ResultFormat] | BackendError

PayloadT = TypeVar("PayloadT")


# How finely `BatchCall.recent_by_party` keeps the call's recent split of its time.
CREDIT_BUCKET_S = 1.0


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
    # The kind of device call it runs in (a training pass, a generation batch); None for an operation with `work`.
    batch_kind: BatchKind | None = None
    # What the batch kind's runner runs (a ForwardBackwardCall, a RecordedSamplingRequest); None with `work`.
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
    # Runs as a device call of its own, which takes nothing in and is taken into no other (it may still run nested in
    # another call's pause, as its own call): its result is what it computes alone (a batch-invariant sample).
    alone: bool = False
    enqueued_at: float = field(default_factory=time.monotonic)
    # Tokens the device processed for this operation, set by its batch runner: a batch's device time is split among
    # its operations in proportion to them (a token costs about the same whoever sent it), evenly where none are set.
    processed_tokens: int = 0

    @property
    def party(self) -> str:
        """Whose fair share of the device this operation counts toward: its training run (the run's own requests, the
        samples and evaluations that read its weights, from whichever sampling session, and the base model's samples
        of the client session that trains it), else its lane. Runs of one key share the device as runs of two keys
        do."""
        return self.run or self.lane


# A long call may call its pause callback between its steps: the scheduler then runs other tenants' ready operations
# that may interleave (their results do not depend on the long call) before the call goes on.
PauseCallback = Callable[[], None]
# Runs several operations of one batch kind in one device call, given the call (`BatchCall`, which is its pause
# callback): one outcome per operation of the call (those it was given, then those it admitted), in order; the
# outcomes of operations it finished early are not read.
BatchRunner = Callable[[Sequence[Operation[Any]], "BatchCall"], Sequence[Outcome]]
# Operations handed to a batch runner at once; the runner may still split them by its own limits.
MAX_BATCH_OPERATIONS = 64


@dataclass(frozen=True)
class BatchBudget:
    """How much of one device call an operation of a batch kind takes (its payload's share, e.g. the larger of its
    rows and its tokens as fractions of a generation batch's limits) and how much one call may hold. An operation
    larger than the whole capacity still runs, alone."""

    share: Callable[[Any], float]
    capacity: float = 1.0
    # Whether a payload costs little in one pass beside the payload before it of its lane (they share most of what a
    # pass computes, such as a prompt's prefix); None: never.
    same_pass: Callable[[Any, Any], bool] | None = None


@dataclass(frozen=True)
class BatchKind:
    """Operations that run together in one device call (those whose `Operation.batch_kind` it is), and how."""

    name: str
    runner: BatchRunner
    # How old the kind's oldest ready operation must be before its batch forms (or a running call takes it in), so
    # that requests a client sends together (an RL step's prompts, a few milliseconds apart) run as one batch instead
    # of the first alone and the rest behind it.
    window_s: float = 0.0
    # What one device call may hold; None: up to MAX_BATCH_OPERATIONS operations.
    budget: BatchBudget | None = None
    # While a batch pauses, operations of this kind from lanes that have none in it (gathered for the window) that it
    # does not take in (`BatchCall.admit`) may run as a batch of their own, which does not pause; the runner must then
    # leave what the paused batch uses alone.
    nests: bool = False
    # The most of its budget a call of this kind takes in one pass: its first batch (the first operation whatever its
    # size) and each admission (`BatchCall.admit`). A pass that prefills cannot pause, so every other tenant waits for
    # all of it.
    pass_share: float = 1.0
    # A call of this kind nested in another's pause gives the device back between its steps (`BatchCall.__call__`)
    # until the paused call's next pause, instead of holding it to its end: it runs on a thread of its own.
    parks: bool = False

    def share(self, operation: Operation) -> float:
        """The share of one device call of this kind that `operation` takes."""
        if self.budget is None:
            return 1 / MAX_BATCH_OPERATIONS
        return self.budget.share(operation.payload) / self.budget.capacity

    def same_pass(self, before: Operation, operation: Operation) -> bool:
        """Whether `operation`, the next of `before`'s lane, costs little prefilled in one pass with `before`."""
        same_pass = None if self.budget is None else self.budget.same_pass
        return before.lane == operation.lane and same_pass is not None and same_pass(before.payload, operation.payload)


@dataclass(frozen=True)
class CallHooks:
    """What a call asks of the scheduler that runs it: to run other tenants' work in a pause, to take ready
    operations in (those `accepts` takes), and to record an operation's outcome now."""

    pause: Callable[[BatchCall], None]
    admit: Callable[[BatchCall, Callable[[Operation], bool]], list[Operation]]
    finish: Callable[[BatchCall, Operation, Outcome], None]
    # A nested call of a kind that parks, between its steps: give the device back to the paused call for a while.
    park: Callable[[BatchCall], None]


class BatchCall:
    """One device call in progress: the operations it runs, when each joined it, and the device time each accrued.

    Handed to a batch kind's runner, it is the call's pause callback (calling it lets other tenants' work run), and a
    call that runs step by step may take in more operations of its kind between steps (`admit`) and record an
    operation's outcome before the call ends (`finish`). A call nested in another's pause neither pauses nor admits;
    if its kind parks, calling it gives the device back to the paused call until that call pauses again.
    Its own device time is its wall time less the time that work run in its pauses took; that time is split among
    its operations at every pause, admission and finish, in proportion to their shares of the kind's budget, and what
    is left at its end among the operations still running, in proportion to the tokens each processed.
    """

    def __init__(self, operations: list[Operation], kind: BatchKind | None, nested: bool, hooks: CallHooks) -> None:
        """`kind`: None for the call of one operation without a batch kind, which runs its `work`."""
        self.operations = list(operations)
        self.kind = kind
        self.nested = nested
        # The call of one operation that runs alone: it takes nothing in.
        self.alone = operations[0].alone
        self.started = time.monotonic()
        # Device seconds that other tenants' operations ran while this call paused, and when the pause running now
        # began (None between pauses): that time is the paused work's, not this call's.
        self.paused_seconds = 0.0
        self.pausing_since: float | None = None
        # Whether the runner asks to take operations in (a nesting kind's operations then nest only once refused).
        self.admits = False
        self.refused: set[str] = set()
        self.finished: set[str] = set()
        self.reported_seconds = 0.0
        # Whether the call has ended: its operations' seconds are then being handed to the listeners, and a reading of
        # the unsettled ones would count them twice.
        self.closed = False
        self._hooks = hooks
        self._joined_at: dict[str, float] = {}
        self._accrued: dict[str, float] = {}
        self._accrued_until = 0.0
        # The operations taken in last, until they are prefilled (`prefilled`).
        self._prefilling: list[Operation] = []
        # Each party's seconds of the call's own time by the CREDIT_BUCKET_S in which they were split, oldest first,
        # kept while `recent_by_party` reads them: a generation splits its time at every decode step.
        self._recent_credits: deque[tuple[float, dict[str, float]]] = deque()
        # The pauses (start, end, each party's share of the work that ran in it) that may still fall in the window
        # `recent_seconds` and `recent_by_party` read.
        self._pauses: list[tuple[float, float, dict[str, float]]] = []

    def __call__(self) -> None:
        """Pause: other tenants' ready work that may run meanwhile runs now (nested: the paused call's own steps, if
        this call's kind parks)."""
        if not self.nested:
            self._hooks.pause(self)
        elif self.kind is not None and self.kind.parks:
            self._hooks.park(self)

    def admit(self, accepts: Callable[[Operation], bool]) -> list[Operation]:
        """Other tenants' ready operations of this call's kind that it takes in now, each one `accepts` (see
        `Scheduler._admit`); the runner must return their outcomes after those of the operations it was given."""
        if self.nested or self.alone:
            return []
        self.admits = True
        return self._hooks.admit(self, accepts)

    def finish(self, operation: Operation, outcome: Outcome) -> None:
        """Record `operation`'s outcome now (its future resolves) rather than when the call ends."""
        self._hooks.finish(self, operation, outcome)

    def unfinished(self) -> list[Operation]:
        return [op for op in self.operations if op.request_id not in self.finished]

    def parties(self) -> set[str]:
        """Parties (`Operation.party`) with an operation still running in this call."""
        return {op.party for op in self.unfinished()}

    def held_by_party(self) -> dict[str, float]:
        """Each party's share of the kind's budget in the operations still running."""
        held: dict[str, float] = {}
        for op in self.unfinished():
            held[op.party] = held.get(op.party, 0.0) + self._share(op)
        return held

    def held(self) -> float:
        return sum(self.held_by_party().values())

    def started_at(self, operation: Operation) -> float:
        return self._joined_at.get(operation.request_id, self.started)

    def own_seconds(self, now: float) -> float:
        end = now if self.pausing_since is None else self.pausing_since
        return end - self.started - self.paused_seconds

    def paused_for(self, started: float, ended: float, shares: Mapping[str, float] | None = None) -> None:
        """Work of others ran in this call's pause from `started` to `ended`: that of the parties in `shares`, its
        time theirs in proportion to them (`held_by_party` of the call that ran in the pause)."""
        self.paused_seconds += ended - started
        self._pauses.append((started, ended, dict(shares or {})))

    def recent_seconds(self, now: float, window_s: float) -> tuple[float, float]:
        """The call's own seconds and the seconds others' work ran in its pauses, in the last `window_s` (between
        pauses): how the device was shared lately, which a call of many minutes must not average over its life."""
        since = max(self.started, now - window_s)
        paused = sum(seconds for seconds, _ in self._recent_pauses(since))
        return now - since - paused, paused

    def _recent_pauses(self, since: float) -> list[tuple[float, dict[str, float]]]:
        """The seconds of each pause after `since`, with its parties' shares; older pauses are forgotten."""
        self._pauses = [pause for pause in self._pauses if pause[1] > since]
        return [(end - max(start, since), shares) for start, end, shares in self._pauses]

    def accrue(self, now: float) -> None:
        """Split the call's own time since the last split among the operations running, by their budget shares."""
        own = self.own_seconds(now)
        self._credit(self._split(own - self._accrued_until), now)
        self._accrued_until = own

    def recent_by_party(self, now: float, window_s: float, pauses: bool = True) -> dict[str, float]:
        """Each party's device seconds of this call in the last `window_s`: its share of the call's own time, and
        (with `pauses`) the time its work ran in the call's pauses. A party whose rows ran in a generation and whose
        training pass ran in the same generation's pauses has had both (issue 48: counted apart, an evaluating trial
        kept 38-43% of the device beside another trial's RL steps)."""
        while self._recent_credits and self._recent_credits[0][0] < now - window_s:
            self._recent_credits.popleft()
        totals: dict[str, float] = {}
        for _, by_party in self._recent_credits:
            for party, seconds in by_party.items():
                totals[party] = totals.get(party, 0.0) + seconds
        for seconds, shares in self._recent_pauses(max(self.started, now - window_s)) if pauses else []:
            weight = sum(shares.values())
            if weight <= 0:
                continue
            for party, share in shares.items():
                totals[party] = totals.get(party, 0.0) + seconds * share / weight
        return totals

    def _credit(self, split: list[tuple[Operation, float]], now: float) -> None:
        if not self._recent_credits or now >= self._recent_credits[-1][0] + CREDIT_BUCKET_S:
            self._recent_credits.append((now, {}))
        bucket = self._recent_credits[-1][1]
        for op, seconds in split:
            self._accrued[op.request_id] = self._accrued.get(op.request_id, 0.0) + seconds
            bucket[op.party] = bucket.get(op.party, 0.0) + seconds

    def unsettled_seconds(self, now: float) -> list[tuple[Operation, float]]:
        """Each operation still running and the device seconds it has accrued by `now`, read without splitting the
        call's time: what the tenants' usage adds for a call in progress, so that a generation of minutes does not
        show its tenants idle until it ends."""
        if self.closed:
            return []
        pending = {
            op.request_id: seconds for op, seconds in self._split(max(0.0, self.own_seconds(now) - self._accrued_until))
        }
        return [
            (op, self._accrued.get(op.request_id, 0.0) + pending.get(op.request_id, 0.0)) for op in self.unfinished()
        ]

    def _split(self, seconds: float, among: list[Operation] | None = None) -> list[tuple[Operation, float]]:
        """`seconds` of the call's own time split among the operations running (or `among`), by their budget
        shares."""
        running = self.unfinished() if among is None else among
        weights = [self._share(op) for op in running]
        total = sum(weights)
        if total <= 0:
            return []
        return [(op, seconds * weight / total) for op, weight in zip(running, weights, strict=True)]

    def join(self, operations: list[Operation], now: float) -> None:
        if operations:
            self.accrue(now)
            self.operations += operations
            self._joined_at.update((op.request_id, now) for op in operations)
            self._prefilling = list(operations)

    def prefilled(self) -> None:
        """The operations taken in last are prefilled: the call's time since they joined was theirs alone, split
        among them by their budget shares (the running rows waited; an evaluation's requests joining an RL step's
        generation took 79% of its time prefilling, in a py-spy profile of a study's trials)."""
        if not self._prefilling:
            return
        now = time.monotonic()
        own = self.own_seconds(now)
        self._credit(self._split(own - self._accrued_until, self._prefilling), now)
        self._accrued_until = own
        self._prefilling = []

    def settle(self, operation: Operation, now: float) -> float:
        """Count `operation` finished: the device seconds it accrued."""
        self.accrue(now)
        self.finished.add(operation.request_id)
        seconds = self._accrued.pop(operation.request_id, 0.0)
        self.reported_seconds += seconds
        return seconds

    def close(self, now: float) -> list[float]:
        """The call has ended: the device seconds of each operation still running (`unfinished`, in order), the call's
        own time not yet reported split in proportion to the tokens each processed (a token costs about the same
        whoever sent it), evenly where none are set."""
        self.accrue(now)
        self.closed = True
        left = self.unfinished()
        if not left:
            return []
        seconds = max(0.0, self.own_seconds(now) - self.reported_seconds)
        tokens = sum(op.processed_tokens for op in left)
        if tokens <= 0:
            return [seconds / len(left)] * len(left)
        return [seconds * op.processed_tokens / tokens for op in left]

    def _share(self, operation: Operation) -> float:
        # The call of an operation without a batch kind runs that operation only: it takes the whole call.
        return self.kind.share(operation) if self.kind is not None else 1.0
