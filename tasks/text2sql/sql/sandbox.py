"""Runs untrusted SQL, written by the policy during RL, against read-only DuckDB files.

The layers a statement meets, outermost first:

1. to 3. Screening of the text (screening.py): its size (`SandboxLimits.max_sql_chars`), its shape (one
   read-only query, as DuckDB's own parser finds it; the parsed statement is what runs) and the names it
   calls (nothing that reaches outside the database, runs SQL held in a string, changes state, sleeps, or
   builds one value of unbounded size).
4. Engine: connections are read-only, with external access, extension loading and configuration
   changes turned off, a memory limit, a thread count and no spilling to disk.
5. Time: one watchdog thread interrupts every query still running at its deadline.
6. Rows: at most `max_rows + 1` rows are fetched; the rest of the result is cancelled.

What this does not bound: DuckDB builds intermediate string and list values outside `memory_limit`,
and some of that work (constant folding, one huge value) does not notice an interrupt, so a statement
such as nested `replace(replace(...))` or `printf('%300000000d', 1)` can take gigabytes and seconds
before it fails. Rows are converted to Python objects outside the limit too. `IsolatedSandbox`
(sandbox_workers.py), which scoring uses, runs this sandbox in worker processes under an address-space
cap and a hard deadline, so that such a statement costs its worker, never the caller.

Deeply nested JSON (`json_structure` of a 9,000-deep array built with `string_agg`) runs to a result in
milliseconds and a few megabytes (measured), and is accepted: the text it reads is held to the memory limit
like any string, and a depth that overflowed a stack would end only its worker.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Protocol

import duckdb

from tasks.closeable import Closeable
from tasks.text2sql.errors import SandboxError
from tasks.text2sql.sql.screening import RefusedSqlError, screen
from tasks.text2sql.sql.screening import is_utf8 as is_utf8  # re-exported: scoring.py imports it from here


class ExecutionStatus(StrEnum):
    """How one statement ended."""

    OK = "ok"
    # Refused before or at execution: not a single read-only query, a forbidden function or statement,
    # or access outside the database.
    BLOCKED = "blocked"
    TIMED_OUT = "timed_out"
    # An ordinary SQL error (syntax, unknown column, ...) or the memory limit.
    ERROR = "error"


@dataclass(frozen=True)
class ExecutionResult:
    """The outcome of one statement: its rows when OK, otherwise a message a person can act on."""

    status: ExecutionStatus
    columns: tuple[str, ...] = ()
    # Plain Python values as DuckDB's fetch gives them.
    rows: tuple[tuple[object, ...], ...] = ()
    # More than max_rows rows existed; `rows` holds the first max_rows.
    truncated: bool = False
    error: str | None = None
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether the statement ran to a result."""
        return self.status is ExecutionStatus.OK


class QueryRunner(Protocol):
    """What runs untrusted SQL: `SqlSandbox` in this process, `IsolatedSandbox` in capped worker processes."""

    def execute(self, db_path: Path, sql: str, max_rows: int | None = None) -> ExecutionResult: ...


@dataclass(frozen=True)
class SandboxLimits:
    """What one statement may use."""

    # Wall-clock budget of one statement, fetching its rows included.
    timeout_s: float = 2.0
    # DuckDB's memory_limit, for each (thread, database) connection: each has an engine of its own.
    memory_limit_mb: int = 512
    # DuckDB worker threads per database file (the calling thread always works too).
    threads: int = 1
    # Rows returned; when more exist the result says `truncated`.
    max_rows: int = 10_000
    # Longer statements are BLOCKED without being parsed.
    max_sql_chars: int = 20_000
    # Address space a sandbox worker process may map beyond what it holds once started (`IsolatedSandbox`): the
    # memory_limit above, plus what DuckDB builds outside it, plus rows on their way out.
    worker_memory_mb: int = 1024

    def __post_init__(self) -> None:
        for name in ("timeout_s", "memory_limit_mb", "threads", "max_rows", "max_sql_chars", "worker_memory_mb"):
            value = getattr(self, name)
            if value <= 0:
                raise SandboxError(f"SandboxLimits.{name} must be positive, got {value!r}")


_DEFAULT_LIMITS = SandboxLimits()


@dataclass(eq=False)
class _Slot:
    """One thread's connection to one database, and which query of the watchdog's it runs now."""

    connection: duckdb.DuckDBPyConnection
    ticket: int | None = None
    # Whether the watchdog interrupted the slot's latest query.
    interrupted: bool = False


@dataclass(order=True)
class _Deadline:
    at: float
    ticket: int
    slot: _Slot = field(compare=False)


class _Watchdog:
    """One thread that interrupts every query still running at its deadline.

    A deadline is not removed when its query ends early; the ticket tells a stale deadline from the
    slot's current query, so arming and disarming stay O(log n) with no wake-up of this thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._deadlines: list[_Deadline] = []
        self._tickets = itertools.count()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="sql-sandbox-watchdog", daemon=True)
        self._thread.start()

    @contextmanager
    def watching(self, slot: _Slot, timeout_s: float) -> Iterator[None]:
        """Interrupt `slot`'s connection if the block is still running after `timeout_s`."""
        with self._lock:
            ticket = next(self._tickets)
            slot.ticket = ticket
            slot.interrupted = False
            heapq.heappush(self._deadlines, _Deadline(time.monotonic() + timeout_s, ticket, slot))
            if self._deadlines[0].ticket == ticket:
                self._wake.notify()
        try:
            yield
        finally:
            # Under the lock, so that an interrupt only ever reaches the query it was meant for.
            with self._lock:
                slot.ticket = None

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            self._wake.notify()
        self._thread.join()

    def _run(self) -> None:
        with self._lock:
            while not self._stopped:
                now = time.monotonic()
                while self._deadlines and self._deadlines[0].at <= now:
                    deadline = heapq.heappop(self._deadlines)
                    if deadline.slot.ticket == deadline.ticket:
                        deadline.slot.interrupted = True
                        # A connection closed under its query (close() racing execute()) must not
                        # stop the watchdog for every other query.
                        with suppress(duckdb.Error):
                            deadline.slot.connection.interrupt()
                self._wake.wait(self._deadlines[0].at - now if self._deadlines else None)


class SqlSandbox(Closeable):
    """Executes one untrusted read-only query at a time per thread, from any number of threads.

    Each (thread, database) pair keeps its own read-only connection, so repeated queries are cheap.
    Close the sandbox once no thread is executing on it.
    """

    def __init__(self, limits: SandboxLimits = _DEFAULT_LIMITS) -> None:
        self.limits = limits
        self._config: dict[str, str | bool | int] = {
            "enable_external_access": False,
            "autoload_known_extensions": False,
            "autoinstall_known_extensions": False,
            "allow_community_extensions": False,
            "allow_persistent_secrets": False,
            # Python variables must not be readable as tables.
            "python_enable_replacements": False,
            # No spilling: a query over the memory limit fails instead of writing temporary files.
            "temp_directory": "",
            "memory_limit": f"{limits.memory_limit_mb}MiB",
            "threads": limits.threads,
            "lock_configuration": True,
        }
        self._slots: dict[tuple[int, str], _Slot] = {}
        self._slots_lock = threading.Lock()
        self._watchdog = _Watchdog()
        self._closed = False

    def execute(self, db_path: Path, sql: str, max_rows: int | None = None) -> ExecutionResult:
        """Run `sql` against `db_path`; every outcome of the SQL is a result, never an exception.

        `max_rows` lowers the row cap for this call (a scorer that only needs to know whether a result has
        more rows than the gold one need not convert thousands of them to Python).

        Raises SandboxError only for what does not depend on the SQL: a database that cannot be opened
        and use after close.
        """
        started = time.perf_counter()
        slot = self._slot(db_path)
        try:
            statement = screen(slot.connection, sql, self.limits.max_sql_chars)
        except RefusedSqlError as refusal:
            status = ExecutionStatus.BLOCKED if refusal.blocked else ExecutionStatus.ERROR
            result = ExecutionResult(status, error=refusal.message)
        else:
            cap = self.limits.max_rows if max_rows is None else min(max_rows, self.limits.max_rows)
            result = self._run(slot, statement, cap)
        return replace(result, elapsed_s=time.perf_counter() - started)

    def close(self) -> None:
        """Stop the watchdog and close every connection; later calls to execute raise SandboxError."""
        if self._closed:
            return
        self._closed = True
        self._watchdog.stop()
        with self._slots_lock:
            slots, self._slots = list(self._slots.values()), {}
        for slot in slots:
            slot.connection.close()

    def _slot(self, db_path: Path) -> _Slot:
        if self._closed:
            raise SandboxError("the sandbox is closed")
        key = (threading.get_ident(), str(db_path))
        with self._slots_lock:
            slot = self._slots.get(key)
        if slot is not None:
            return slot
        try:
            connection = self._open(db_path)
        except duckdb.Error as error:
            raise SandboxError(f"cannot open database {db_path} read-only: {error}") from error
        slot = _Slot(connection)
        with self._slots_lock:
            self._slots[key] = slot
        return slot

    def _open(self, db_path: Path) -> duckdb.DuckDBPyConnection:
        """A private in-memory engine with the file attached read-only, then locked down.

        Attaching instead of opening the file keeps the sandbox out of DuckDB's per-process cache of
        database instances: other code in the process (prompt rendering, a loader, another sandbox with
        other limits) can open the same file with its own settings, and each connection gets its own
        memory limit instead of sharing one per file.
        """
        unlocked = {k: v for k, v in self._config.items() if k not in ("enable_external_access", "lock_configuration")}
        connection = duckdb.connect(":memory:", config=unlocked)
        try:
            quoted = str(db_path).replace("'", "''")
            connection.execute(f"ATTACH '{quoted}' AS sandboxed (READ_ONLY)")
            connection.execute("USE sandboxed")
            connection.execute("SET enable_external_access = false")
            connection.execute("SET lock_configuration = true")
        except BaseException:
            connection.close()
            raise
        return connection

    def _run(self, slot: _Slot, statement: duckdb.Statement, max_rows: int) -> ExecutionResult:
        connection = slot.connection
        try:
            with self._watchdog.watching(slot, self.limits.timeout_s):
                connection.execute(statement)
                columns = tuple(column[0] for column in connection.description or ())
                rows = connection.fetchmany(max_rows + 1)
        # A sandbox boundary: whatever the SQL provokes, including a value Python cannot represent,
        # must come back as a result.
        except Exception as error:
            return self._failure(error, slot.interrupted)
        finally:
            # Frees what the rest of a streamed result holds (a sort, a hash table), which would
            # otherwise count against the memory limit until the next query.
            connection.abort()
        return ExecutionResult(
            ExecutionStatus.OK,
            columns=columns,
            rows=tuple(rows[:max_rows]),
            truncated=len(rows) > max_rows,
        )

    def _failure(self, error: Exception, interrupted: bool) -> ExecutionResult:
        if interrupted or isinstance(error, duckdb.InterruptException):
            return ExecutionResult(
                ExecutionStatus.TIMED_OUT, error=f"query interrupted at the {self.limits.timeout_s:g} s limit"
            )
        if isinstance(error, duckdb.OutOfMemoryException):
            first_line = str(error).splitlines()[0]
            return ExecutionResult(
                ExecutionStatus.ERROR,
                error=f"query hit the {self.limits.memory_limit_mb} MiB memory limit ({first_line})",
            )
        if isinstance(error, duckdb.PermissionException):
            return ExecutionResult(
                ExecutionStatus.BLOCKED, error=f"DuckDB refused access outside the database: {error}"
            )
        return ExecutionResult(ExecutionStatus.ERROR, error=str(error) or type(error).__name__)
