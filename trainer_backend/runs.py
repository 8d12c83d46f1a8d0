"""Sessions, training runs (one per training client) and sampling sessions, with their owners.

Ids are random tokens, so nobody can reach another key's run by guessing; a model id embeds its session id as the
Tinker API does ("<session>:train:<n>").
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer_backend.batch_invariance import BatchInvariance
from trainer_backend.engine.types import LoraSettings
from trainer_backend.errors import NotFoundError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    tags TEXT NOT NULL,
    created_at REAL NOT NULL,
    last_heartbeat REAL NOT NULL,
    finished_at REAL
);
CREATE TABLE IF NOT EXISTS training_runs (
    model_id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    session_id TEXT NOT NULL,
    base_model TEXT NOT NULL,
    lora_rank INTEGER NOT NULL,
    train_mlp INTEGER NOT NULL,
    train_attn INTEGER NOT NULL,
    train_unembed INTEGER NOT NULL,
    seed INTEGER,
    created_at REAL NOT NULL,
    last_request_at REAL NOT NULL
);
-- A base-model sample counts toward its client session's run (`sole_run_of_session`), looked up per request.
CREATE INDEX IF NOT EXISTS training_runs_by_session ON training_runs (session_id);
-- How many checkpoints of each kind a run keeps (the most recent); a run without a row keeps them all.
CREATE TABLE IF NOT EXISTS run_retention (
    model_id TEXT PRIMARY KEY,
    keep INTEGER NOT NULL
);
-- The user_metadata a run was created with, as JSON; a run without a row was given none.
CREATE TABLE IF NOT EXISTS run_metadata (
    model_id TEXT PRIMARY KEY,
    metadata TEXT NOT NULL
);
-- The batch invariance a session's user_metadata asked for (`batch_invariance.py`); a session without a row: off.
CREATE TABLE IF NOT EXISTS session_batch_invariance (
    session_id TEXT PRIMARY KEY,
    mode TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS sampling_sessions (
    sampling_session_id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    session_id TEXT NOT NULL,
    base_model TEXT NOT NULL,
    model_path TEXT,
    created_at REAL NOT NULL
);
"""

# The columns of training_runs that `_run_from_row` reads, in its order.
_RUN_COLUMNS = (
    "model_id, owner, session_id, base_model, lora_rank, train_mlp, train_attn, train_unembed, seed, created_at,"
    " last_request_at"
)


@dataclass(frozen=True)
class TrainingRun:
    model_id: str
    owner: str
    session_id: str
    base_model: str
    lora: LoraSettings
    created_at: float
    last_request_at: float


@dataclass(frozen=True)
class SamplingSession:
    sampling_session_id: str
    owner: str
    session_id: str
    base_model: str
    # A tinker:// path of sampler weights, or None to sample the base model.
    model_path: str | None


class RunStore:
    """Who owns which session, run and sampling session; a lookup with the wrong owner is a NotFoundError."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def create_session(self, owner: str, tags: list[str], batch_invariance: BatchInvariance = "off") -> str:
        session_id = f"ses-{secrets.token_hex(10)}"
        now = time.time()
        with self._lock:
            self._db.execute(
                "INSERT INTO sessions VALUES (?, ?, ?, ?, ?, NULL)", (session_id, owner, json.dumps(tags), now, now)
            )
            if batch_invariance != "off":
                self._db.execute("INSERT INTO session_batch_invariance VALUES (?, ?)", (session_id, batch_invariance))
        return session_id

    def batch_invariance(self, sampling_session_id: str) -> BatchInvariance:
        """The batch invariance of the session that the sampling session belongs to."""
        with self._lock:
            row = self._db.execute(
                "SELECT b.mode FROM sampling_sessions s JOIN session_batch_invariance b ON b.session_id = s.session_id"
                " WHERE s.sampling_session_id = ?",
                (sampling_session_id,),
            ).fetchone()
        return "off" if row is None else row[0]

    def _owned_row(self, noun: str, query: str, key: str, owner: str) -> tuple:
        """The row `query` selects for the `noun` `key` of `owner` (its two parameters, in that order).

        Raises:
            NotFoundError: no such row, or another owner's: the same error, so that ids of other keys cannot be probed.
        """
        with self._lock:
            row = self._db.execute(query, (key, owner)).fetchone()
        if row is None:
            raise NotFoundError(f"unknown {noun} {key!r}")
        return row

    def require_session(self, owner: str, session_id: str) -> None:
        self._owned_row("session", "SELECT 1 FROM sessions WHERE session_id = ? AND owner = ?", session_id, owner)

    def heartbeat(self, owner: str, session_id: str) -> None:
        self.require_session(owner, session_id)
        with self._lock:
            self._db.execute("UPDATE sessions SET last_heartbeat = ? WHERE session_id = ?", (time.time(), session_id))

    def finish_session(self, owner: str, session_id: str) -> None:
        self.require_session(owner, session_id)
        with self._lock:
            self._db.execute("UPDATE sessions SET finished_at = ? WHERE session_id = ?", (time.time(), session_id))

    def silent_sampling_sessions(self, sampling_session_ids: set[str], silent_for_s: float) -> set[str]:
        """Those of these sampling sessions whose client session has sent heartbeats but none in the `silent_for_s`
        seconds before the latest heartbeat any session sent.

        Measured against the latest heartbeat, not the clock, so a server too busy to take heartbeats for a while
        takes no one for gone; a client that never sends any (not the SDK) is never taken for gone.
        """
        if not sampling_session_ids:
            return set()
        marks = ", ".join("?" * len(sampling_session_ids))
        with self._lock:
            rows = self._db.execute(
                "SELECT s.sampling_session_id FROM sampling_sessions s JOIN sessions c ON s.session_id = c.session_id"
                f" WHERE s.sampling_session_id IN ({marks}) AND c.finished_at IS NULL"
                " AND c.last_heartbeat > c.created_at"
                " AND c.last_heartbeat < (SELECT max(last_heartbeat) FROM sessions) - ?",
                (*sampling_session_ids, silent_for_s),
            ).fetchall()
        return {row[0] for row in rows}

    def model_id_for(self, session_id: str, model_seq_id: int) -> str:
        return f"{session_id}:train:{model_seq_id}"

    def create_training_run(
        self, owner: str, session_id: str, model_seq_id: int, base_model: str, lora: LoraSettings
    ) -> TrainingRun:
        self.require_session(owner, session_id)
        model_id = self.model_id_for(session_id, model_seq_id)
        now = time.time()
        with self._lock:
            self._db.execute(
                "INSERT OR IGNORE INTO training_runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    model_id,
                    owner,
                    session_id,
                    base_model,
                    lora.rank,
                    lora.train_mlp,
                    lora.train_attn,
                    lora.train_unembed,
                    lora.seed,
                    now,
                    now,
                ),
            )
        return self.training_run(owner, model_id)

    def training_run(self, owner: str, model_id: str) -> TrainingRun:
        query = f"SELECT {_RUN_COLUMNS} FROM training_runs WHERE model_id = ? AND owner = ?"
        return _run_from_row(self._owned_row("model", query, model_id, owner))

    def set_retention(self, model_id: str, keep: int) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO run_retention VALUES (?, ?)", (model_id, keep))

    def retention(self, model_id: str) -> int | None:
        """How many checkpoints of each kind the run keeps; None: all."""
        with self._lock:
            row = self._db.execute("SELECT keep FROM run_retention WHERE model_id = ?", (model_id,)).fetchone()
        return None if row is None else row[0]

    def set_metadata(self, model_id: str, metadata: dict[str, Any]) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO run_metadata VALUES (?, ?)", (model_id, json.dumps(metadata)))

    def metadata(self, model_id: str) -> dict[str, Any] | None:
        """The user_metadata the run was created with; None if it had none."""
        with self._lock:
            row = self._db.execute("SELECT metadata FROM run_metadata WHERE model_id = ?", (model_id,)).fetchone()
        return None if row is None else json.loads(row[0])

    def touch(self, model_id: str) -> None:
        with self._lock:
            self._db.execute("UPDATE training_runs SET last_request_at = ? WHERE model_id = ?", (time.time(), model_id))

    def list_training_runs(self, owner: str, limit: int = 100, offset: int = 0) -> tuple[list[TrainingRun], int]:
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_RUN_COLUMNS} FROM training_runs WHERE owner = ? ORDER BY created_at DESC LIMIT ? OFFSET ?",
                (owner, limit, offset),
            ).fetchall()
            total = self._db.execute("SELECT COUNT(*) FROM training_runs WHERE owner = ?", (owner,)).fetchone()[0]
        return [_run_from_row(r) for r in rows], total

    def create_sampling_session(
        self, owner: str, session_id: str, base_model: str, model_path: str | None
    ) -> SamplingSession:
        self.require_session(owner, session_id)
        sampling_session_id = f"smp-{secrets.token_hex(10)}"
        with self._lock:
            self._db.execute(
                "INSERT INTO sampling_sessions VALUES (?, ?, ?, ?, ?, ?)",
                (sampling_session_id, owner, session_id, base_model, model_path, time.time()),
            )
        return SamplingSession(sampling_session_id, owner, session_id, base_model, model_path)

    def sole_run_of_session(self, session_id: str) -> str | None:
        """The training run the client session `session_id` created, when it created exactly one."""
        with self._lock:
            rows = self._db.execute("SELECT model_id FROM training_runs WHERE session_id = ? LIMIT 2", (session_id,))
            found = rows.fetchall()
        return found[0][0] if len(found) == 1 else None

    def sampling_session(self, owner: str, sampling_session_id: str) -> SamplingSession:
        query = (
            "SELECT sampling_session_id, owner, session_id, base_model, model_path FROM sampling_sessions"
            " WHERE sampling_session_id = ? AND owner = ?"
        )
        return SamplingSession(*self._owned_row("sampling session", query, sampling_session_id, owner))


def _run_from_row(row: tuple) -> TrainingRun:
    return TrainingRun(
        model_id=row[0],
        owner=row[1],
        session_id=row[2],
        base_model=row[3],
        lora=LoraSettings(
            rank=row[4], train_mlp=bool(row[5]), train_attn=bool(row[6]), train_unembed=bool(row[7]), seed=row[8]
        ),
        created_at=row[9],
        last_request_at=row[10],
    )
