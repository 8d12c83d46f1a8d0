"""Executing a gold query on its DuckDB database with a timeout, and caching the verdicts across loads."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import duckdb
from pydantic import BaseModel, Field, ValidationError

from tasks.text2sql.sources.spider.cache import write_atomically
from tasks.text2sql.sources.spider.gold_repairs import GoldRejectedError

GOLD_TIMEOUT_S = 10.0


class _GoldVerdict(BaseModel):
    # None when the query ran.
    category: str | None = None
    message: str = ""


class GoldCheckCache(BaseModel):
    """Outcomes of earlier gold executions, so that a reload does not rerun every query."""

    verdicts: dict[str, _GoldVerdict] = Field(default_factory=dict)

    @classmethod
    def read(cls, path: Path) -> GoldCheckCache:
        try:
            return cls.model_validate_json(path.read_bytes())
        except (OSError, ValidationError):
            # A missing or unreadable cache only costs a rerun.
            return cls()

    def write(self, path: Path) -> None:
        write_atomically(path, self.model_dump_json())


def check_gold(
    con: duckdb.DuckDBPyConnection, sql: str, signature: str, earlier: GoldCheckCache, now: GoldCheckCache
) -> None:
    key = hashlib.sha256(f"{signature}\0{sql}".encode()).hexdigest()
    verdict = earlier.verdicts.get(key)
    if verdict is None:
        try:
            _execute_with_timeout(con, sql, GOLD_TIMEOUT_S)
            verdict = _GoldVerdict()
        except GoldRejectedError as rejected:
            if rejected.category == "timeout":
                # A faster machine may finish it: do not remember timeouts.
                raise
            verdict = _GoldVerdict(category=rejected.category, message=rejected.message)
    now.verdicts[key] = verdict
    if verdict.category is not None:
        raise GoldRejectedError(verdict.category, verdict.message, sql)


def _execute_with_timeout(con: duckdb.DuckDBPyConnection, sql: str, timeout_s: float) -> None:
    watchdog = threading.Timer(timeout_s, con.interrupt)
    watchdog.start()
    try:
        con.execute(sql).fetchall()
    except duckdb.InterruptException as error:
        raise GoldRejectedError("timeout", f"ran longer than {timeout_s:g} s", sql) from error
    except duckdb.Error as error:
        raise GoldRejectedError(f"duckdb {type(error).__name__}", str(error), sql) from error
    finally:
        watchdog.cancel()
