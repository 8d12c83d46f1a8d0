"""The device worker: one thread runs every device operation, in each training client's seq_id order.

Requests arrive on the HTTP loop and become `Operation`s, which wait in their tenant's lane (`lanes.py`): a training
client's run in seq_id order, and a gap that stays open longer than `gap_timeout_s` fails the operations waiting behind
it. Across tenants the worker serves the least recently served one first, so a tenant with a deep queue cannot starve
the others. Operations of a registered batch kind (`operations.py`: sampling, training passes) run together: the worker
takes ready ones of that kind from all tenants (for a training client only its next in order) into one device call, one
tenant at a time in turn, least recently served first, while the kind's budget has room (a generation batch's rows and
tokens), so a tenant with hundreds of queued requests gets a share of each call, not the whole of it, and others'
requests join the next call. A batch kind may have a gathering window: its oldest ready operation waits until it is that
old before the batch is formed, so that requests a client sends together (an RL step's prompts, a few milliseconds
apart) run as one batch instead of the first alone and the rest behind it. A long call may pause between its steps to
let other tenants' short operations run. A call that runs step by step (a generation) takes in, between its steps,
another tenant's gathered operations of its kind (`BatchCall.admit`): they share its steps, and each operation's result
is recorded as soon as it is done (`BatchCall.finish`), so a light tenant's generation neither waits for a heavy
tenant's to end nor runs beside it as a second batch. A batch kind may also nest: what the running call cannot take in
runs in its pause as a batch of its own; a nested batch of a kind that parks (a training pass) runs a step in each of
the paused call's pauses rather than all of it at once (`sliced_calls.py`). An operation may ask to run alone (a
batch-invariant sample): its call holds it only, takes nothing in and is taken into nothing, so its result is what it
computes alone whatever else is queued. Busy time is measured around each device call.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Literal

from trainer_backend.errors import BackendError, OverloadedError, ServerError
from trainer_backend.lanes import ExpiredGap, Lane
from trainer_backend.ledger import Ledger
from trainer_backend.operations import BatchCall, BatchKind, CallHooks, Operation, Outcome
from trainer_backend.sliced_calls import SlicedCall

log = logging.getLogger(__name__)

# Which tenant's ready operation runs next: the least recently served tenant's (the server's policy), or the one that
# arrived first (kept to measure what the policy buys: benchmarks/fairness.py).
SchedulingPolicy = Literal["least_recently_served", "fifo"]
# A running batch lets other tenants' work run in its pauses while that work has taken at most this many times the
# batch's own device time, so a long generation keeps half the device however busy the others are: as much as it
# lends, which two trials of a study need to split the device evenly (issue 48). Measured with Gemma 3 270M
# (benchmarks.fairness --engine, docs/performance.md): with no bound, a tenant's RL steps beside another tenant's
# 332-prompt evaluation ran about as fast as alone and the evaluation's batches took 9 times as long; at 2 (until
# 2026-12-07), the RL steps took 1.2-1.6 times as long as alone, and one Gemma trial's step beside another's ran 2.7
# times the pair's median (benchmarks.trial_pair) where at 1 the longest ran 1.6 times.
PAUSE_SHARE_LIMIT = 1.0
# ...counted over the last this many seconds of the batch, not its whole life: a generation that other tenants keep
# feeding may run for many minutes, and over its life it would owe them minutes of pauses back to back (nested
# generations that do not pause), or none at all once they had run ahead, while its own tenant waits.
PAUSE_SHARE_WINDOW_S = 60.0
# A batch nested in a pause holds at most this share of its kind's budget (its first operation whatever its size). It
# does not pause, so the paused batch and every other tenant wait for all of it: measured in a study's two Spider
# trials (long prompts, most of a step's requests refused by the running batch for cache room), a whole step nested
# in one pause froze the other trial's batch for 7.7 minutes. A quarter at a time lets the paused batch take its own
# steps between the nested ones (PAUSE_SHARE_LIMIT), at the cost of more, smaller generations.
NESTED_BATCH_SHARE = 0.25
# A running call takes in other tenants' operations while it holds less than its kind's budget, and past it while the
# joining tenant holds no more than its even share of JOIN_EVEN_SHARE_OF budgets among the call's tenants, never more
# than JOIN_BUDGET_LIMIT budgets in all: what a batch and a batch nested in its pause held before calls took
# operations in. The call's time is split by the budget each holds, so a tenant that joins a full call may hold as
# much as the one that filled it. Measured on a study's two Spider trials (issue 48, docs/performance.md): held to its
# even share of one budget (half), the second trial got a third of the device for as long as the first trial's
# evaluation fed the call.
JOIN_BUDGET_LIMIT = 2.0
JOIN_EVEN_SHARE_OF = 2.0
# Whether a running call takes in operations of a party it already runs some of (`_admit`); off is the rule before
# 2026-12-07, kept as a variant to measure (benchmarks/scheduler_variants.py).
JOIN_OWN_PARTY = True
# Whether a party that has had more of a running call's own time over the last PAUSE_SHARE_WINDOW_S than every other
# party in it waits to take more in. The budget bounds what a party holds, not what it costs: an evaluation's
# requests are a long prompt for a short answer, and one that refilled the call as its answers ended took 79% of an
# RL step's generation prefilling them (py-spy, a study's two trials), every running row waiting meanwhile.
JOIN_WITHIN_RECENT_SHARE = True
# Whether a party's time in a call (what `_owed_pause` and `_admit` weigh) counts the work it ran in the call's
# pauses, and pauses are lent by party as well as by the call's own time. Off, the rule until 2026-12-07: pauses lent
# by the call's own time only, whoever's rows had it (the variant pauses-by-call).
PAUSE_SHARE_BY_PARTY = True


def _runs_only_between_calls(operation: Operation | None) -> bool:
    """Whether `operation` can run neither in a call's pause nor nested nor taken into a call."""
    if operation is None or operation.interleaves:
        return False
    kind = operation.batch_kind
    return kind is None or not kind.nests


class _Turn(Enum):
    """What a lane's turn came to (`_in_turns`)."""

    TOOK = "took"  # an operation: the lane goes behind its party's other lanes
    LANE_DONE = "lane done"  # nothing more from this lane
    PARTY_DONE = "party done"  # nothing more from this lane's party


def _in_turns(lanes: Sequence[tuple[str, str]], take: Callable[[str], _Turn]) -> None:
    """Offer (lane, party) pairs their turns one party at a time: each round, every party, in the order its first lane
    comes in `lanes`, offers its next lane to `take`, until every lane is done. A run whose requests come through
    several sampling sessions so gets one turn a round, as a run with one session does."""
    parties: dict[str, deque[str]] = {}
    for name, party in lanes:
        parties.setdefault(party, deque()).append(name)
    while parties:
        for party in list(parties):
            names = parties[party]
            turn = take(names[0])
            if turn is _Turn.TOOK:
                names.rotate(-1)
            elif turn is _Turn.LANE_DONE:
                names.popleft()
            else:
                names.clear()
            if not names:
                del parties[party]


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
    # Operations queued or running by (owner, training run): which runs have work on the device now.
    open_by_run: dict[tuple[str, str], int] = field(default_factory=dict)


class Scheduler:
    """Runs operations on one worker thread; `submit` is safe from any thread."""

    def __init__(
        self,
        ledger: Ledger,
        max_queued: int = 1024,
        gap_timeout_s: float = 60.0,
        policy: SchedulingPolicy = "least_recently_served",
        max_queued_per_owner: int | None = None,
    ) -> None:
        """`max_queued_per_owner`: queued operations one owner may have (None: only `max_queued` bounds them)."""
        self.ledger = ledger
        self.policy = policy
        self.max_queued = max_queued
        self.max_queued_per_owner = max_queued_per_owner
        self.gap_timeout_s = gap_timeout_s
        self._kinds: dict[str, BatchKind] = {}
        self._hooks = CallHooks(self._pause, self._admit, self._finish, self._park)
        # The nested call that runs in slices in the pauses of the call it is nested in, if any (at most one).
        self._sliced: SlicedCall | None = None
        # When the batch the worker waits to gather may form (monotonic); None when it waits for nothing.
        self._gathering_until: float | None = None
        self._batches = 0
        self._batched_operations = 0
        self._lanes: dict[str, Lane] = {}
        # When each party (`Operation.party`) was last served (monotonic): the least recently served goes first.
        self._party_served: dict[str, float] = {}
        self._condition = threading.Condition()
        self._stopping = False
        self._busy_seconds = 0.0
        self._operations_by_kind: dict[str, int] = {}
        # The device calls running now: the worker's, and one running in its pause.
        self._calls: list[BatchCall] = []
        self._busy_listeners: list[Callable[[float, float], None]] = []
        self._device_time_listeners: list[Callable[[Operation, float], None]] = []
        self._thread = threading.Thread(target=self._run, name="device-worker", daemon=True)
        self._thread.start()

    def on_busy(self, listener: Callable[[float, float], None]) -> None:
        """Called with (start, end) monotonic times after each operation, for duty-cycle accounting."""
        self._busy_listeners.append(listener)

    def on_device_time(self, listener: Callable[[Operation, float], None]) -> None:
        """Called after each device call with each of its operations and the device seconds that were its share."""
        self._device_time_listeners.append(listener)

    def running_device_time(self) -> list[tuple[Operation, float]]:
        """The operations of the device calls running now, each with the device seconds it has accrued so far and not
        yet handed to the `on_device_time` listeners."""
        now = time.monotonic()
        with self._condition:
            return [pair for call in self._calls for pair in call.unsettled_seconds(now)]

    def register(self, kind: BatchKind) -> None:
        """Serve operations of `kind` (those whose `batch_kind` it is) with its runner; the component that queues such
        operations registers it once. Raises ValueError for a name registered already."""
        with self._condition:
            if kind.name in self._kinds:
                raise ValueError(f"batch kind {kind.name!r} is registered already; register each batch kind once")
            self._kinds[kind.name] = kind

    def submit(self, operation: Operation[Any]) -> None:
        """Queue an operation; raises OverloadedError when the queues are full (the client backs off)."""
        batched = operation.batch_kind is not None
        kind = operation.batch_kind
        runnable = operation.payload is not None and kind is not None and self._kinds.get(kind.name) is kind
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
            self._lanes.setdefault(operation.lane, Lane()).add(operation)
            self._condition.notify()

    def expect_sequence(self, lane: str, next_seq: int) -> None:
        """Start a new lane's numbering somewhere other than 1; a lane that exists already keeps its place.

        A model's creation is its seq 0 and may be retried after it ran: rewinding the lane then would make the
        model's next request wait for a seq_id that already ran.
        """
        with self._condition:
            self._lanes.setdefault(lane, Lane(next_seq))

    def skip(self, lane: str, seq_id: int) -> None:
        """Count `seq_id` as done without running anything: its request was refused before it was queued.

        The SDK numbers a training client's requests before sending them, so a refused one leaves a gap that its
        next requests would otherwise wait on until `gap_timeout_s`. A seq_id already queued or run is left alone.
        """
        with self._condition:
            if self._lanes.setdefault(lane, Lane()).skip(seq_id):
                self._condition.notify()

    def queued(self, lane: str) -> int:
        """Operations of one lane waiting to run (cheap: every training request asks)."""
        with self._condition:
            found = self._lanes.get(lane)
            return len(found) if found is not None else 0

    def lanes_with_queued_samples(self) -> set[str]:
        """The lanes with operations waiting in arrival order (samples), not yet running."""
        with self._condition:
            return {name for name, lane in self._lanes.items() if lane.has_unordered()}

    def drop_queued_samples(self, lanes: set[str], reason: str) -> int:
        """Fail the operations of these lanes that wait in arrival order (samples), with `reason`, before they run;
        those already running finish. How many were dropped."""
        with self._condition:
            dropped = [op for name in lanes if (lane := self._lanes.get(name)) for op in lane.take_unordered()]
        for operation in dropped:
            self.ledger.fail(operation.request_id, reason, "user")
        return len(dropped)

    def folders_in_use(self) -> set[Path]:
        """Checkpoint folders that queued or running operations read."""
        with self._condition:
            running = [op for call in self._calls for op in call.operations]
            return {op.reads for op in [*self._queued_operations(), *running] if op.reads is not None}

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
                running=tuple(op.request_id for call in self._calls for op in call.unfinished()),
                running_since=self._calls[0].started if self._calls else None,
                open_by_run=dict(self._open_by_run()),
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
        return Counter(op.owner for op in self._queued_operations() if op.owner is not None)

    def _open_by_run(self) -> Counter[tuple[str, str]]:
        running = [op for call in self._calls for op in call.unfinished()]
        open_operations = [*self._queued_operations(), *running]
        return Counter((op.owner, op.run) for op in open_operations if op.owner is not None and op.run is not None)

    def _queued_operations(self) -> Iterator[Operation]:
        return (op for lane in self._lanes.values() for op in lane.operations())

    def _queued_by(self, owner: str) -> int:
        return self._queued_by_owner()[owner]

    def _next(self, paused: BatchCall | None = None) -> list[Operation]:
        """The ready operation of the least recently served lane, with every ready operation it can batch with.

        Also expires operations stuck behind a gap. Empty when nothing is ready. With `paused`, only operations that
        may run while that call pauses.
        """
        now = time.monotonic()
        only_interleaving = paused is not None
        # Set again below while the chosen batch still gathers; never left over from an earlier look.
        self._gathering_until = None
        paused_parties = paused.parties() if paused is not None else set()
        # A training client's next request waits for the one before it, which may be running in the paused call (a
        # training pass pauses too).
        running_lanes = {op.lane for call in self._calls for op in call.unfinished() if op.seq_id is not None}
        candidates = []
        for name, lane in self._lanes.items():
            operation = lane.ready()
            if operation is None:
                expired = lane.expire_gap(now, self.gap_timeout_s)
                if expired is not None:
                    self._fail_expired(name, expired)
                continue
            if paused is not None and (not self._runs_in_pause(operation, paused, now) or name in running_lanes):
                continue
            lane.gap_since = None
            candidates.append((self._turn(name, operation), name, operation))
        if not candidates:
            return []
        candidates.sort(key=lambda c: c[0])
        _, name, first = candidates[0]
        kind = first.batch_kind
        window_s = kind.window_s if kind is not None else 0.0
        if not only_interleaving and now < first.enqueued_at + window_s:
            self._gathering_until = first.enqueued_at + window_s
            return []
        self._lanes[name].pop(first)
        self._served(name, first, now)
        if kind is None or first.alone:
            return [first]
        # A nested batch takes nothing from the parties of the batch it runs in, and is smaller.
        mate_lanes = [name for _, name, operation in candidates if operation.party not in paused_parties]
        capacity = kind.pass_share if paused is None else min(kind.pass_share, NESTED_BATCH_SHARE)
        return [first, *self._batch_mates(first, kind, mate_lanes, now, capacity)]

    def _turn(self, lane_name: str, operation: Operation) -> tuple[float, float]:
        """When `operation` gets its turn among the ready ones, lowest first: by arrival under "fifo"; else the least
        recently served party first (a run's new sampling session does not put it ahead of other runs), and within
        a party its least recently served lane."""
        if self.policy == "fifo":
            return operation.enqueued_at, 0.0
        return self._party_served.get(operation.party, 0.0), self._lanes[lane_name].last_served

    def _served(self, lane_name: str, operation: Operation, now: float) -> None:
        self._lanes[lane_name].last_served = now
        self._party_served[operation.party] = now

    def _runs_in_pause(self, operation: Operation, paused: BatchCall, now: float) -> bool:
        """Whether `operation` may run while `paused` pauses: it interleaves, or it nests (its kind nests, as the paused
        call's does, its party has nothing in the paused call, its batch has gathered, and the paused call, within its
        budget, did not take it in when it could have).

        A training pass lends its pauses to work that interleaves only: a generation nested in one would hold it for
        all of that generation (a nested batch does not pause). Either way, the operation's party must be owed a
        pause (`_owed_pause`)."""
        if not self._owed_pause(paused, {operation.party}, now):
            return False
        if operation.interleaves:
            return True
        kind = operation.batch_kind
        return (
            kind is not None
            and kind.nests
            and paused.kind is not None
            and paused.kind.nests
            and operation.party not in paused.parties()
            and now >= operation.enqueued_at + kind.window_s
            and (not paused.admits or (operation.request_id in paused.refused and paused.held() <= 1.0))
        )

    @staticmethod
    def _owed_pause(paused: BatchCall, parties: set[str], now: float) -> bool:
        """Whether one of `parties` may have more of `paused`'s pauses: over the last PAUSE_SHARE_WINDOW_S it has had
        no more of that call (its share of the call's own time and what it ran in the call's pauses) than
        PAUSE_SHARE_LIMIT times the most any party running in the call has had. A party whose rows ran in the call
        has had part of its time already, and its training pass in the pauses gets only what makes it even. A party
        running in the call is owed its own pauses (its client's training step in its own generation's)."""
        if not PAUSE_SHARE_BY_PARTY or parties & paused.parties():
            return True
        recent = paused.recent_by_party(now, PAUSE_SHARE_WINDOW_S)
        hosts = max((recent.get(party, 0.0) for party in paused.parties()), default=0.0)
        return min((recent.get(party, 0.0) for party in parties), default=0.0) <= PAUSE_SHARE_LIMIT * hosts + 1e-9

    def _batch_mates(
        self, first: Operation, kind: BatchKind, lane_names: list[str], now: float, capacity: float = 1.0
    ) -> list[Operation]:
        """Ready operations of `first`'s batch kind to run with it: one party at a time in turn (in `lane_names`'
        order, least recently served first), while `capacity` of the kind's budget has room."""
        used = kind.share(first)
        # The other parties take their turns before `first`'s party takes a second one. A training client's next
        # ordered operation depends on the one taken before it: one per lane and batch.
        ready_of = {name: self._lanes[name].ready() for name in lane_names if name != first.lane}
        others = [(name, op.party) for name, op in ready_of.items() if op is not None and op.party != first.party]
        own = [(name, first.party) for name, op in ready_of.items() if op is not None and op.party == first.party]
        mates: list[Operation] = []

        def take(name: str) -> _Turn:
            nonlocal used
            lane = self._lanes[name]
            operation = lane.next_of_kind(kind)
            if operation is None or operation.alone or used + kind.share(operation) > capacity + 1e-9:
                return _Turn.LANE_DONE
            lane.pop(operation)
            self._served(name, operation, now)
            used += kind.share(operation)
            mates.append(operation)
            return _Turn.TOOK if operation.seq_id is None else _Turn.LANE_DONE

        _in_turns([*others, *own, *([(first.lane, first.party)] if first.seq_id is None else [])], take)
        return mates

    def _admit(self, call: BatchCall, accepts: Callable[[Operation], bool]) -> list[Operation]:
        """Ready operations of `call`'s kind that it takes in now, gathered for the kind's window, one lane at a time
        in turn (least recently served party first) within JOIN_BUDGET_LIMIT and, all together, the kind's pass share
        (the first whatever its size), each one `accepts` and none that runs alone (those are marked refused: they may
        run nested in the call's pause).

        Beside other parties, a party takes in one operation at a time (or a lane's run of operations that cost little
        prefilled together, `BatchKind.same_pass`), and none while it has had more of the call's time over the last
        minute than every other party in it (prefilling what it took in counts as its own) until they catch up
        (JOIN_WITHIN_RECENT_SHARE).

        A party with operations in the call takes more in too: otherwise an RL step's requests past one call's budget
        waited for the whole call to end (in a study's Spider trials, a quarter of a step's requests waited three
        minutes), and an evaluation took its next requests in only once all it had in the call were done, all at once.

        While an operation the call refused still waits, it takes nothing in: a call that others keep feeding would
        otherwise never end, nor hold little enough to let the refused one nest, and its party would wait for good.
        Nor while a lane's next operation can run only between calls (a run's creation or weights load, which change
        the model's adapters): a call that an evaluation feeds would hold a new trial's creation for the whole
        evaluation."""
        kind = call.kind
        with self._condition:
            if self._stopping or kind is None:
                return []
            now = time.monotonic()
            refused = call.refused
            if refused and any(op.request_id in refused for op in self._queued_operations()):
                return []
            if any(_runs_only_between_calls(lane.ready()) for lane in self._lanes.values()):
                return []
            call.accrue(now)
            recent = call.recent_by_party(now, PAUSE_SHARE_WINDOW_S, pauses=PAUSE_SHARE_BY_PARTY)
            held = call.held_by_party()
            # The parties in the call before it takes anything in now (`held` grows with what it takes).
            present = set(held)

            def sharing(party: str) -> bool:
                return JOIN_WITHIN_RECENT_SHARE and any(other != party for other in present)

            def ahead(party: str) -> bool:
                others = [recent.get(other, 0.0) for other in present if other != party]
                return sharing(party) and recent.get(party, 0.0) > max(others)

            inside = set() if JOIN_OWN_PARTY else present
            waiting = []
            for name, lane in self._lanes.items():
                oldest = lane.next_of_kind(kind)
                if oldest is not None and oldest.party not in inside and now >= oldest.enqueued_at + kind.window_s:
                    waiting.append((self._turn(name, oldest), name, oldest.party))
            taken: list[Operation] = []
            this_pass = 0.0
            # The operation each party sharing the call took last in this admission.
            taken_last: dict[str, Operation] = {}

            def take(name: str) -> _Turn:
                nonlocal this_pass
                lane = self._lanes[name]
                operation = lane.next_of_kind(kind)
                if operation is None or operation.seq_id is not None:
                    return _Turn.LANE_DONE
                if ahead(operation.party):
                    return _Turn.PARTY_DONE
                # Beside other parties, one at a time, or a run of one lane that costs little together: a KL penalty's
                # reference scores, where a generation takes them in, are 4 completions of each prompt, and one at a
                # time each prompt was prefilled 4 times (56 requests, 149 s; issue 48); questions over one schema too.
                before = taken_last.get(operation.party)
                if before is not None and not kind.same_pass(before, operation):
                    return _Turn.PARTY_DONE
                share = kind.share(operation)
                if taken and this_pass + share > kind.pass_share + 1e-9:
                    return _Turn.PARTY_DONE
                tenants = len(held) + (operation.party not in held)
                total = sum(held.values()) + share
                own = held.get(operation.party, 0.0) + share
                if not (
                    total <= 1.0 + 1e-9
                    or (own <= JOIN_EVEN_SHARE_OF / tenants + 1e-9 and total <= JOIN_BUDGET_LIMIT + 1e-9)
                ):
                    return _Turn.PARTY_DONE
                if operation.alone or not accepts(operation):
                    call.refused.add(operation.request_id)
                    return _Turn.LANE_DONE
                lane.pop(operation)
                self._served(name, operation, now)
                held[operation.party] = own
                this_pass += share
                taken.append(operation)
                # What it costs to take in counts only once it is prefilled, so `ahead` does not stop the next one.
                if sharing(operation.party):
                    taken_last[operation.party] = operation
                return _Turn.TOOK

            _in_turns([(name, party) for _, name, party in sorted(waiting)], take)
            call.join(taken, now)
        for operation in taken:
            self.ledger.mark_running(operation.request_id)
        return taken

    def _fail_expired(self, name: str, gap: ExpiredGap) -> None:
        for operation in gap.operations:
            self.ledger.fail(
                operation.request_id,
                f"request seq_id {operation.seq_id} of {name} waited {self.gap_timeout_s:.0f} s for seq_id "
                f"{gap.missing_seq}, which never arrived; requests of one training client run in order",
                "user",
            )

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
                call = self._call(batch, nested=False)
                self._calls.append(call)
            self._execute(call)
            with self._condition:
                self._calls.remove(call)
            self._finish_sliced()

    def _call(self, batch: list[Operation], nested: bool) -> BatchCall:
        return BatchCall(batch, batch[0].batch_kind, nested, self._hooks)

    def _pause(self, call: BatchCall) -> None:
        """A long call pauses: run one batch of other tenants' ready operations that interleave or nest, if any, unless
        they have had their share of this call's recent time (PAUSE_SHARE_LIMIT over PAUSE_SHARE_WINDOW_S), all
        together and each party (`_owed_pause`).

        A nested batch of a kind that parks (a training pass) runs in slices, a step in each pause, until it ends; no
        other batch starts in a pause meanwhile, and what is left of it when the paused call ends runs right after."""
        with self._condition:
            now = time.monotonic()
            # Each party's share of the call's own time so far, which `_owed_pause` reads.
            call.accrue(now)
            own, paused = call.recent_seconds(now, PAUSE_SHARE_WINDOW_S)
            if self._stopping or paused > PAUSE_SHARE_LIMIT * own:
                return
            sliced = self._sliced
            if sliced is None:
                batch = self._next(paused=call)
                if not batch:
                    return
                nested = self._call(batch, nested=True)
                self._calls.append(nested)
                if nested.kind is not None and nested.kind.parks:
                    sliced = self._sliced = SlicedCall(nested, self._execute)
            elif self._owed_pause(call, sliced.call.parties(), now):
                nested = sliced.call
            else:
                return
            shares = nested.held_by_party()
            # Inside the paused call's busy interval, which already counts this time.
            started = call.pausing_since = time.monotonic()
        if sliced is None:
            self._execute(nested)
        else:
            sliced.run_slice()
        with self._condition:
            call.paused_for(started, time.monotonic(), shares)
            call.pausing_since = None
            if sliced is None or sliced.done:
                self._calls.remove(nested)
                self._sliced = None

    def _park(self, call: BatchCall) -> None:
        """A nested call of a kind that parks is between two steps: the call it is nested in goes on until it pauses
        again. Its wait counts as a pause of its own (not its device time)."""
        sliced = self._sliced
        if sliced is None or sliced.call is not call or not sliced.hosted:
            return
        with self._condition:
            parked = call.pausing_since = time.monotonic()
        sliced.park()
        with self._condition:
            call.paused_for(parked, time.monotonic())
            call.pausing_since = None

    def _finish_sliced(self) -> None:
        """The call a sliced call was nested in has ended: the sliced call runs to its end now, before anything else
        (its lane's next operation waits for it, and an adapter's creation must not fall in the middle of a pass)."""
        sliced = self._sliced
        if sliced is None:
            return
        sliced.hosted = False
        started = time.monotonic()
        sliced.run_slice()
        end = time.monotonic()
        with self._condition:
            self._calls.remove(sliced.call)
            self._sliced = None
            self._busy_seconds += end - started
        for listener in self._busy_listeners:
            listener(started, end)

    def _finish(self, call: BatchCall, operation: Operation, outcome: Outcome) -> None:
        """Record `operation`'s outcome before its call ends; its device seconds are those it accrued in the call."""
        with self._condition:
            if operation.request_id in call.finished:
                return
            seconds = call.settle(operation, time.monotonic())
        self._record(call, operation, outcome, seconds)

    def _record(self, call: BatchCall, operation: Operation, outcome: Outcome, seconds: float) -> None:
        # Counted before the future resolves, so a client that reads its usage after a result finds it there.
        for time_listener in self._device_time_listeners:
            time_listener(operation, seconds)
        if isinstance(outcome, BackendError):
            result_text = f"failed ({outcome.category})"
            self.ledger.fail(operation.request_id, str(outcome), outcome.category)
        else:
            result_text = "done"
            self.ledger.complete(operation.request_id, *outcome)
        started = call.started_at(operation)
        log.info(
            "operation %s",
            result_text,
            extra={
                "request_id": operation.request_id,
                "kind": operation.kind,
                "lane": operation.lane,
                "seq_id": operation.seq_id,
                "queued_s": round(started - operation.enqueued_at, 4),
                "run_s": round(time.monotonic() - started, 4),
                "batch": len(call.operations),
                "nested": call.nested,
                "joined": started > call.started,
                "alone": operation.alone,
            },
        )
        with self._condition:
            self._operations_by_kind[operation.kind] = self._operations_by_kind.get(operation.kind, 0) + 1

    def _execute(self, call: BatchCall) -> None:
        for operation in call.operations:
            self.ledger.mark_running(operation.request_id)
        outcomes = self._outcomes(call)
        end = time.monotonic()
        with self._condition:
            seconds = call.close(end)
            left = [
                (op, outcome)
                for op, outcome in zip(call.operations, outcomes, strict=True)
                if op.request_id not in call.finished
            ]
        for (operation, outcome), share in zip(left, seconds, strict=True):
            self._record(call, operation, outcome, share)
        with self._condition:
            if not call.nested:
                self._busy_seconds += end - call.started
            if len(call.operations) > 1:
                self._batches += 1
                self._batched_operations += len(call.operations)
        if not call.nested:
            for listener in self._busy_listeners:
                listener(call.started, end)

    def _outcomes(self, call: BatchCall) -> list[Outcome]:
        """Run one operation or one batch; whatever it raises fails its operations, never the worker."""
        first, kind = call.operations[0], call.kind
        try:
            if kind is None:
                return [first.work()]
            outcomes = list(kind.runner(list(call.operations), call))
            if len(outcomes) != len(call.operations):
                raise RuntimeError(
                    f"the {kind.name} runner returned {len(outcomes)} outcomes for {len(call.operations)}"
                )
            return outcomes
        except BackendError as error:
            return [error] * len(call.operations)
        except Exception:  # the worker must survive anything one request provokes
            ids = ", ".join(op.request_id for op in call.operations)
            log.exception("operation(s) %s (%s) failed", ids, first.kind)
            # The exception's text stays in the log: it may name server paths or, in a batch, other tenants' ids.
            return [
                ServerError(f"internal error in {op.kind}; the server's log has the details of request {op.request_id}")
                for op in call.operations
            ]
