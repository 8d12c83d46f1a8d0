"""Durable futures: every mutating request becomes a row that survives a restart.

A request is identified by its idempotency key (the SDK's HTTP layer reuses it when it retries a call) and, for
training clients, by (model, seq_id) (the SDK's outer retry loop resends with a new key but the same seq_id): a
retry finds the existing future instead of running twice, and a seq_id reused with another body is refused.
Requests in flight when the server stopped are marked failed with a reason at start-up, so a client polling them
after a restart gets an answer instead of waiting forever.
"""

from __future__ import annotations

import secrets
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from trainer_backend.errors import ConflictError
from trainer_backend.request_kinds import RequestKind


class FutureState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class ResultFormat(StrEnum):
    JSON = "json"
    PROTO = "proto"


@dataclass(frozen=True)
class FutureRecord:
    request_id: str
    owner: str
    # The RequestKind it was submitted as, read back as the string the ledger stores.
    kind: str
    model_id: str | None
    seq_id: int | None
    state: FutureState
    result: bytes | None
    result_format: ResultFormat | None
    error: str | None
    category: str | None
    created_at: float
    updated_at: float

    @property
    def finished(self) -> bool:
        return self.state in (FutureState.DONE, FutureState.FAILED)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS futures (
    request_id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    kind TEXT NOT NULL,
    model_id TEXT,
    seq_id INTEGER,
    idempotency_key TEXT,
    body_hash TEXT NOT NULL,
    state TEXT NOT NULL,
    result BLOB,
    result_format TEXT,
    error TEXT,
    category TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS futures_by_key ON futures(owner, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE UNIQUE INDEX IF NOT EXISTS futures_by_seq ON futures(model_id, seq_id) WHERE seq_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS futures_by_state ON futures(state);
"""

_COLUMNS = (
    "request_id, owner, kind, model_id, seq_id, state, result, result_format, error, category, created_at, updated_at"
)

Listener = Callable[[FutureRecord], None]


class Ledger:
    """Futures in a SQLite file; safe to use from the HTTP loop and the device worker at once."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()
        self._listeners: list[Listener] = []

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def add_listener(self, listener: Listener) -> None:
        """Called with the record each time a future finishes (from whichever thread finished it)."""
        self._listeners.append(listener)

    def submit(
        self,
        owner: str,
        kind: RequestKind,
        body_hash: str,
        model_id: str | None = None,
        seq_id: int | None = None,
        idempotency_key: str | None = None,
    ) -> tuple[FutureRecord, bool]:
        """A new queued future, or the existing one for a retried request; `True` when it is new.

        Raises ConflictError when (model_id, seq_id) was already used by a request with another body.
        """
        now = time.time()
        with self._lock:
            existing = self._find_existing(owner, idempotency_key, model_id, seq_id)
            if existing is not None:
                existing_hash, record = existing
                if existing_hash != body_hash:
                    raise ConflictError(
                        f"seq_id {seq_id} of model {model_id} was already used by a different {record.kind} request "
                        f"({record.request_id}); a retry must send the same body"
                        if seq_id is not None
                        else f"idempotency key {idempotency_key!r} was already used by a different request"
                    )
                return record, False
            request_id = f"req-{secrets.token_hex(12)}"
            self._db.execute(
                "INSERT INTO futures (request_id, owner, kind, model_id, seq_id, idempotency_key, body_hash, state,"
                " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (request_id, owner, kind, model_id, seq_id, idempotency_key, body_hash, FutureState.QUEUED, now, now),
            )
            return self._get_locked(request_id), True

    def _find_existing(
        self, owner: str, idempotency_key: str | None, model_id: str | None, seq_id: int | None
    ) -> tuple[str, FutureRecord] | None:
        row = None
        if idempotency_key is not None:
            row = self._db.execute(
                "SELECT request_id, body_hash FROM futures WHERE owner = ? AND idempotency_key = ?",
                (owner, idempotency_key),
            ).fetchone()
        if row is None and model_id is not None and seq_id is not None:
            row = self._db.execute(
                "SELECT request_id, body_hash FROM futures WHERE model_id = ? AND seq_id = ?", (model_id, seq_id)
            ).fetchone()
        if row is None:
            return None
        return row[1], self._get_locked(row[0])

    def get(self, request_id: str) -> FutureRecord | None:
        with self._lock:
            return self._get_locked(request_id)

    def _get_locked(self, request_id: str) -> FutureRecord | None:
        row = self._db.execute(f"SELECT {_COLUMNS} FROM futures WHERE request_id = ?", (request_id,)).fetchone()
        return None if row is None else _record(row)

    def discard(self, request_id: str) -> None:
        """Forget a future that was never queued, so that a retry of its request is a new submission."""
        with self._lock:
            self._db.execute("DELETE FROM futures WHERE request_id = ?", (request_id,))

    def mark_running(self, request_id: str) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE futures SET state = ?, updated_at = ? WHERE request_id = ?",
                (FutureState.RUNNING, time.time(), request_id),
            )

    def complete(self, request_id: str, result: bytes, result_format: ResultFormat) -> None:
        self._finish(request_id, FutureState.DONE, result, result_format, None, None)

    def fail(self, request_id: str, error: str, category: str) -> None:
        self._finish(request_id, FutureState.FAILED, None, None, error, category)

    def _finish(
        self,
        request_id: str,
        state: FutureState,
        result: bytes | None,
        result_format: ResultFormat | None,
        error: str | None,
        category: str | None,
    ) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE futures SET state = ?, result = ?, result_format = ?, error = ?, category = ?, updated_at = ?"
                " WHERE request_id = ?",
                (state, result, result_format, error, category, time.time(), request_id),
            )
            record = self._get_locked(request_id)
        if record is not None:
            for listener in self._listeners:
                listener(record)

    def fail_unfinished(self, reason: str) -> int:
        """Mark every queued or running future failed (at start-up: their work died with the last process)."""
        with self._lock:
            cursor = self._db.execute(
                "UPDATE futures SET state = ?, error = ?, category = 'server', updated_at = ? WHERE state IN (?, ?)",
                (FutureState.FAILED, reason, time.time(), FutureState.QUEUED, FutureState.RUNNING),
            )
            return cursor.rowcount

    def in_flight(self, owner: str | None = None) -> list[FutureRecord]:
        """Queued and running futures, oldest first: all of them, or one owner's."""
        query = f"SELECT {_COLUMNS} FROM futures WHERE state IN (?, ?)"
        params: tuple = (FutureState.QUEUED, FutureState.RUNNING)
        if owner is not None:
            query, params = query + " AND owner = ?", (*params, owner)
        with self._lock:
            rows = self._db.execute(query + " ORDER BY created_at", params).fetchall()
        return [_record(row) for row in rows]

    def counts_by_state(self) -> dict[FutureState, int]:
        with self._lock:
            rows = self._db.execute("SELECT state, COUNT(*) FROM futures GROUP BY state").fetchall()
        return {FutureState(state): count for state, count in rows}


def _record(row: tuple) -> FutureRecord:
    return FutureRecord(
        request_id=row[0],
        owner=row[1],
        kind=row[2],
        model_id=row[3],
        seq_id=row[4],
        state=FutureState(row[5]),
        result=row[6],
        result_format=ResultFormat(row[7]) if row[7] else None,
        error=row[8],
        category=row[9],
        created_at=row[10],
        updated_at=row[11],
    )
