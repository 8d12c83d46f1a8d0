"""A tenant's lane of queued operations, and the order in which a training client's operations may run.

The SDK numbers a training client's requests (seq_id) and relies on operation n+1 never running before operation n;
chunks of one batch may even arrive out of order. A lane holds its ordered operations by seq_id and offers only the
next one. A seq_id whose request was refused before it was queued is skipped, so that nothing waits for it; a gap
that stays open too long gives up the operations waiting behind it, so that their futures fail with a message instead
of hanging. Operations without a seq_id (sampling) need no order: they wait first in, first out.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from trainer_backend.errors import ConflictError
from trainer_backend.operations import BatchKind, Operation


@dataclass(frozen=True)
class ExpiredGap:
    """Operations given up because the seq_id they waited for (`missing_seq`) never arrived."""

    missing_seq: int
    operations: list[Operation]


class Lane:
    """One tenant's queued operations: those of a training client in seq_id order, the others in arrival order."""

    def __init__(self, next_seq: int = 1) -> None:
        """`next_seq`: the seq_id that runs first (a model's creation is its seq 0)."""
        self._next_seq = next_seq
        self._waiting: dict[int, Operation] = {}
        # seq_ids of requests refused before they were queued: nothing runs for them, and nothing waits for them.
        self._skipped: set[int] = set()
        self._unordered: deque[Operation] = deque()
        # When the lane was last served (monotonic): the least recently served lane goes first.
        self.last_served = 0.0
        # Since when (monotonic) operations have waited behind a gap; the scheduler clears it when it sees the lane
        # ready, so a gap's time counts from when it was first seen.
        self.gap_since: float | None = None

    def add(self, operation: Operation) -> None:
        """Queue `operation`; raises ConflictError when its seq_id was already queued, run or skipped."""
        if operation.seq_id is None:
            self._unordered.append(operation)
            return
        if self._taken(operation.seq_id):
            # The ledger answers retries before they get here; this is a client numbering bug.
            raise ConflictError(f"seq_id {operation.seq_id} of {operation.lane} was already scheduled")
        self._waiting[operation.seq_id] = operation

    def ready(self) -> Operation | None:
        """The operation that may run next: the next one in seq_id order, else the oldest unordered one."""
        if self._next_seq in self._waiting:
            return self._waiting[self._next_seq]
        return self._unordered[0] if self._unordered else None

    def next_of_kind(self, batch_kind: BatchKind) -> Operation | None:
        """The operation of `batch_kind` that may run next: the lane's next one in seq_id order if it is of that
        kind (never a later one: it depends on what runs before it), else its oldest unordered one of that kind."""
        ordered = self._waiting.get(self._next_seq)
        if ordered is not None and ordered.batch_kind is batch_kind:
            return ordered
        return next((op for op in self._unordered if op.batch_kind is batch_kind), None)

    def pop(self, operation: Operation) -> None:
        """Take `operation` out to run; an ordered one lets the next seq_id run."""
        if operation.seq_id is None:
            self._unordered.remove(operation)
        else:
            del self._waiting[operation.seq_id]
            self._advance_to(operation.seq_id + 1)

    def skip(self, seq_id: int) -> bool:
        """Count `seq_id` as done without running anything; False (nothing changes) when it was already queued, run
        or skipped."""
        if self._taken(seq_id):
            return False
        self._skipped.add(seq_id)
        self._advance_to(self._next_seq)
        return True

    def expire_gap(self, now: float, timeout_s: float) -> ExpiredGap | None:
        """For a lane with nothing ready: note when operations began to wait behind a gap, and once that is more than
        `timeout_s` ago, give them up (they leave the lane, which goes on after the last of them)."""
        if not self._waiting:
            return None
        self.gap_since = self.gap_since or now
        if now - self.gap_since <= timeout_s:
            return None
        expired = ExpiredGap(self._next_seq, list(self._waiting.values()))
        self._advance_to(max(self._waiting) + 1)
        self._waiting.clear()
        self.gap_since = None
        return expired

    def take_unordered(self) -> list[Operation]:
        """Remove and return the operations that wait in arrival order (samples); a training client's stay."""
        taken = list(self._unordered)
        self._unordered.clear()
        return taken

    def has_unordered(self) -> bool:
        return bool(self._unordered)

    def operations(self) -> list[Operation]:
        return [*self._waiting.values(), *self._unordered]

    def __len__(self) -> int:
        return len(self._waiting) + len(self._unordered)

    def _advance_to(self, next_seq: int) -> None:
        self._next_seq = next_seq
        while self._next_seq in self._skipped:
            self._next_seq += 1
        self._skipped = {seq for seq in self._skipped if seq > self._next_seq}

    def _taken(self, seq_id: int) -> bool:
        return seq_id < self._next_seq or seq_id in self._waiting or seq_id in self._skipped
