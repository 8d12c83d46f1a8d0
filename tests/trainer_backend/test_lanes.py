"""A lane offers a training client's operations in seq_id order only, skips refused seq_ids, and gives up what waits
behind a gap that stays open too long; unordered operations wait first in, first out."""

from __future__ import annotations

import pytest

from trainer_backend.errors import ConflictError
from trainer_backend.lanes import Lane
from trainer_backend.ledger import ResultFormat
from trainer_backend.operations import BatchKind, Operation
from trainer_backend.request_kinds import RequestKind


def _op(seq_id: int | None, batch_kind: BatchKind | None = None) -> Operation:
    def work() -> tuple[bytes, ResultFormat]:
        raise AssertionError("a lane never runs what it holds")

    return Operation(f"r-{seq_id}", RequestKind.OPTIM_STEP, "m1", work, seq_id, batch_kind=batch_kind)


def _drain(lane: Lane) -> list[int | None]:
    order = []
    while (operation := lane.ready()) is not None:
        lane.pop(operation)
        order.append(operation.seq_id)
    return order


def test_operations_that_arrive_out_of_order_are_offered_in_seq_id_order() -> None:
    lane = Lane()
    for seq_id in (3, 2, 4):
        lane.add(_op(seq_id))
    assert lane.ready() is None  # seq_id 1 has not arrived: nothing later may run
    lane.add(_op(1))
    assert _drain(lane) == [1, 2, 3, 4]
    assert len(lane) == 0


def test_a_skipped_seq_id_is_not_waited_for_and_cannot_be_queued_afterwards() -> None:
    lane = Lane()
    lane.add(_op(3))
    assert lane.skip(2)  # ahead of the lane: counted once the lane gets there
    lane.add(_op(1))
    assert _drain(lane) == [1, 3]
    assert not lane.skip(3), "a seq_id that ran is not skipped"
    with pytest.raises(ConflictError, match="seq_id 2 of m1 was already scheduled"):
        lane.add(_op(2))


def test_a_gap_gives_up_what_waits_behind_it_only_after_the_timeout() -> None:
    lane = Lane()
    lane.add(_op(2))
    lane.add(_op(3))
    assert lane.expire_gap(now=100.0, timeout_s=5.0) is None  # the gap is first seen now
    assert lane.expire_gap(now=105.0, timeout_s=5.0) is None
    expired = lane.expire_gap(now=105.5, timeout_s=5.0)
    assert expired is not None and expired.missing_seq == 1
    assert [op.seq_id for op in expired.operations] == [2, 3]
    assert len(lane) == 0 and lane.gap_since is None
    # The lane goes on after the last operation it gave up; the missing one, arriving late, is refused.
    lane.add(_op(4))
    assert _drain(lane) == [4]
    with pytest.raises(ConflictError):
        lane.add(_op(1))


def test_a_lane_that_starts_elsewhere_offers_its_first_seq_id_and_refuses_a_repeat() -> None:
    lane = Lane(next_seq=0)
    lane.add(_op(0))
    with pytest.raises(ConflictError):
        lane.add(_op(0))
    assert _drain(lane) == [0]


def test_a_batch_kind_gets_the_next_ordered_operation_never_a_later_one() -> None:
    lane = Lane()
    training_pass = BatchKind("pass", lambda operations, call: [])
    lane.add(_op(1))
    lane.add(_op(2, batch_kind=training_pass))
    unordered = _op(None, batch_kind=training_pass)
    lane.add(unordered)
    # seq_id 2 depends on seq_id 1, which is no training pass: only the unordered operation may join a batch now.
    assert lane.next_of_kind(training_pass) is unordered
    lane.pop(lane.ready())
    assert lane.next_of_kind(training_pass).seq_id == 2
