"""The durable ledger of futures: a retry finds its future, a reused seq_id is refused, and what a restart cut off
fails with a reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer_backend.errors import ConflictError
from trainer_backend.ledger import FutureState, Ledger, ResultFormat


def test_a_retry_with_the_same_key_finds_the_same_future(ledger: Ledger) -> None:
    first, created = ledger.submit("alice", "optim_step", "hash-1", "m1", 1, idempotency_key="k1")
    again, created_again = ledger.submit("alice", "optim_step", "hash-1", "m1", 1, idempotency_key="k1")
    assert created and not created_again
    assert again.request_id == first.request_id


def test_a_seq_id_reused_with_another_body_is_refused(ledger: Ledger) -> None:
    first, _ = ledger.submit("alice", "optim_step", "hash-1", "m1", 1, idempotency_key="k1")
    same_body, created = ledger.submit("alice", "optim_step", "hash-1", "m1", 1, idempotency_key="k2")
    assert not created and same_body.request_id == first.request_id
    with pytest.raises(ConflictError, match="seq_id 1 of model m1 was already used"):
        ledger.submit("alice", "optim_step", "hash-2", "m1", 1, idempotency_key="k3")


def test_idempotency_keys_are_per_owner(ledger: Ledger) -> None:
    mine, _ = ledger.submit("alice", "sample", "h", idempotency_key="same")
    theirs, created = ledger.submit("bob", "sample", "h", idempotency_key="same")
    assert created and theirs.request_id != mine.request_id


def test_futures_in_flight_at_a_restart_are_failed_with_a_reason(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    done, _ = ledger.submit("alice", "sample", "h1")
    ledger.complete(done.request_id, b'{"ok": true}', ResultFormat.JSON)
    queued, _ = ledger.submit("alice", "sample", "h2")
    running, _ = ledger.submit("alice", "sample", "h3")
    ledger.mark_running(running.request_id)
    ledger.close()

    reopened = Ledger(tmp_path / "ledger.sqlite3")
    assert reopened.fail_unfinished("the server restarted") == 2
    assert reopened.get(done.request_id).state is FutureState.DONE
    assert reopened.get(done.request_id).result == b'{"ok": true}'
    for request_id in (queued.request_id, running.request_id):
        record = reopened.get(request_id)
        assert record.state is FutureState.FAILED
        assert record.error == "the server restarted"
    reopened.close()
