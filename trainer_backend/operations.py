"""One queued request of the device worker (`Operation`), and what running it yields.

Requests arrive on the HTTP loop and become operations: the scheduler queues them in their tenant's lane
(`lanes.py`) and runs them, alone or in a batch kind's device call (`batches.py`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from trainer_backend.errors import BackendError
from trainer_backend.ledger import ResultFormat
from trainer_backend.request_kinds import RequestKind

if TYPE_CHECKING:  # batches.py builds on operations
    from trainer_backend.batches import BatchKind

# What an operation returns: the result bytes and how they are encoded.
Work = Callable[[], tuple[bytes, ResultFormat]]
# One operation's outcome in a batch: its result, or the error that failed it.
Outcome = tuple[bytes, ResultFormat] | BackendError

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
        """Whose fair share of the device this operation counts toward: its training run (the run's own requests, and
        the samples and evaluations that read its weights, from whichever sampling session), else its lane. Runs of
        one key share the device as runs of two keys do."""
        return self.run or self.lane
