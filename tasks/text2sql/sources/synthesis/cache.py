"""The disk cache of the LLM pass: per query, the question written and the round trip's verdict.

An entry is keyed by the seed and everything that decides the LLM's answer (prompt version, model, the request
itself), so the same build asks nothing twice and a changed prompt or model asks again. Entries are written to a
temporary file and renamed into place: an interrupted build leaves whole entries or none.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError


class Verdict(StrEnum):
    KEPT = "kept"  # the round trip's SQL gave the source query's result
    MISMATCH = "mismatch"  # it ran, to another result
    SQL_FAILED = "sql_failed"  # it did not run (an error, a blocked or timed-out statement)
    NO_SQL = "no_sql"  # the answer held no SQL
    NO_QUESTION = "no_question"  # the writer's reply held no usable question
    TOO_LONG = "too_long"  # a request exceeded the model's context (a large schema for a small model)
    # Kept by the round trip, but the question reads like a phrasing only the bundled dev and test ask in (decided
    # when the question file is written, never cached): training on it would leak an unseen form.
    READS_HELD_OUT = "reads_held_out"


class CachedItem(BaseModel):
    """What the LLM pass concluded about one query."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    db_id: str
    sql: str
    model: str
    verdict: Verdict
    question: str | None = None
    answer_sql: str | None = None
    # The raw replies, for a person looking into why pairs were dropped.
    question_reply: str = ""
    # The last answer, after `attempts` tries (the first and the repairs of SQL that failed to run).
    answer_reply: str = ""
    attempts: int = 1
    detail: str = ""


def cache_key(seed: int, model: str, payload: object) -> str:
    text = json.dumps({"seed": seed, "model": model, "payload": payload}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


class VerdictCache:
    """One JSON file per entry under `root`, in folders by the key's first two characters."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> CachedItem | None:
        """The entry, or None when there is none (an unreadable entry counts as none and is written again)."""
        try:
            return CachedItem.model_validate_json(self._path(key).read_text())
        except (FileNotFoundError, ValidationError, ValueError):
            return None

    def put(self, item: CachedItem) -> None:
        path = self._path(item.key)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, item.model_dump_json(indent=1))

    def __len__(self) -> int:
        return sum(1 for _ in self.root.glob("*/*.json")) if self.root.exists() else 0


def write_atomically(path: Path, text: str) -> None:
    """Write `text` to `path` so that a reader sees the old file or the new one, never a part of it."""
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        Path(temporary).replace(path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
