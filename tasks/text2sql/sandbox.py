"""Runs untrusted SQL, written by the policy during RL, against read-only DuckDB files.

The layers a statement meets, outermost first:

1. Size: text longer than `SandboxLimits.max_sql_chars` is refused without being parsed.
2. Shape: DuckDB's own parser must find exactly one statement, of type SELECT (which covers WITH,
   UNION/INTERSECT/EXCEPT, VALUES, FROM-first, DESCRIBE, SHOW and SUMMARIZE). The statement the parser
   returned is what runs, so no text the check did not see can reach the engine.
3. Names: DuckDB's own tokenizer lists every function call; calls that reach outside the database, run
   SQL held in a string, change state, sleep, or build one value of unbounded size are refused.
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
from types import TracebackType
from typing import Protocol

import duckdb

from tasks.text2sql.errors import SandboxError


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

# Function names are compared lowercased, after unquoting ("read_csv" and READ_CSV are the same call).
#
# Readers of files, URLs and Python objects. External access is off, so DuckDB refuses the file readers
# anyway; refusing them by name keeps that true should a setting ever slip. The *_scan family includes
# arrow_scan and pandas_scan, which take raw memory addresses and could crash the process.
_READER_PREFIXES = ("read_", "parquet_", "sniff_")
_READER_SUFFIXES = ("_scan",)
_READERS = frozenset({"glob", "arrow_scan_dumb", "python_map_function"})
# Run SQL given as a string, which every check here would see only as a literal.
_SQL_RUNNERS = frozenset({"query", "query_table", "json_execute_serialized_sql"})
# Change the database, the connection or the process: checkpoints, sequences, the random seed (which
# would make later queries on the cached connection depend on this one), logging, profiling, the grammar.
_STATE_CHANGERS = frozenset(
    {
        "checkpoint",
        "force_checkpoint",
        "set_config",
        "setseed",
        "setval",
        "nextval",
        "write_log",
        "enable_logging",
        "disable_logging",
        "truncate_duckdb_logs",
        "enable_profiling",
        "disable_profiling",
        "add_grammar_extension",
        "remove_grammar_extension",
        "create_external_resource",
        "destroy_external_resource",
        "register_external_resource",
        "register_external_resource_type",
        "deregister_external_resource",
    }
)
# Reveal what is not this database: credentials, the environment, the extension directory on disk, and
# logs, metrics or prepared statements that could hold other connections' SQL, such as the gold query of
# the same example. Refused wherever the name stands, since duckdb_logs is also a view. Catalog and
# settings introspection (duckdb_tables(), information_schema, duckdb_settings()) stays allowed: it is
# read-only, the configuration is locked, and a policy may legitimately look up the schema.
_OUTSIDE_INTROSPECTION = frozenset(
    {
        "getenv",
        "duckdb_secrets",
        "which_secret",
        "duckdb_extensions",
        "duckdb_temporary_files",
        "duckdb_logs",
        "duckdb_logs_parsed",
        "duckdb_log_contexts",
        "duckdb_live_query_metrics",
        "duckdb_prepared_statements",
    }
)
# A sleep cannot be interrupted, so it would hold the calling thread past any time limit.
_SLEEPERS = frozenset({"sleep_ms", "pg_sleep"})
# Build one value whose size is an argument (repeat('x', 1e9), range(1e9) as a list): DuckDB allocates it
# outside memory_limit and cannot interrupt it. The table functions of the same names stream rows and
# notice interrupts, so they stay allowed where only a table can stand: right after FROM, JOIN, LATERAL.
_AMPLIFIERS = frozenset({"repeat", "lpad", "rpad", "list_resize", "array_resize", "range", "generate_series"})
_TABLE_FUNCTION_AMPLIFIERS = frozenset({"repeat", "range", "generate_series"})
_TABLE_POSITION = frozenset({"from", "join", "lateral"})
# Keywords after which a string literal names a table, which DuckDB would read as a file or URL.
_TABLE_NAMING = frozenset({"from", "join", "describe", "summarize", "show", "pivot", "unpivot"})
# Data-changing clauses DuckDB accepts inside a query (WITH x AS (DELETE ... RETURNING *) SELECT ...).
# Read-only mode refuses them at run time; naming them here gives a clearer refusal.
_WRITE_CLAUSES = frozenset({("delete", "from"), ("insert", "into"), ("insert", "or"), ("merge", "into")})
# UPDATE's target may be qualified and aliased (UPDATE main.t AS x SET), so SET is looked for a few
# tokens on rather than next.
_UPDATE_SET_WINDOW = 6


class _RefusedError(Exception):
    """A statement stopped before execution, with the status and message to report."""

    def __init__(self, status: ExecutionStatus, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _refusal_of_call(name: str, previous: str) -> str | None:
    """Why a call of `name` after the token `previous` is refused, or None when it is allowed."""
    if name in _READERS or name.startswith(_READER_PREFIXES) or name.endswith(_READER_SUFFIXES):
        return f"{name}() reads files, URLs or memory outside the database"
    if name in _SQL_RUNNERS:
        return f"{name}() runs SQL held in a string"
    if name in _STATE_CHANGERS:
        return f"{name}() changes database, connection or process state"
    if name in _SLEEPERS:
        return f"{name}() sleeps and cannot be interrupted"
    if name in _AMPLIFIERS and not (name in _TABLE_FUNCTION_AMPLIFIERS and previous in _TABLE_POSITION):
        return f"{name}() builds a value of unbounded size outside the memory limit"
    return None


def _screen_tokens(sql: str) -> None:
    """Raise _RefusedError for a forbidden call, a file named as a table, or a write clause inside the query."""
    data = sql.encode()
    # DuckDB's tokenizer reports byte offsets; a token runs to the next one, whitespace trimmed.
    starts = duckdb.tokenize(sql)
    tokens: list[tuple[duckdb.token_type, str]] = []
    for index, (start, kind) in enumerate(starts):
        if kind == duckdb.token_type.comment:
            continue
        end = starts[index + 1][0] if index + 1 < len(starts) else len(data)
        tokens.append((kind, data[start:end].decode(errors="replace").strip()))

    words = [_word(kind, text) for kind, text in tokens]
    for index, (kind, text) in enumerate(tokens):
        previous = words[index - 1] if index > 0 else ""
        following = tokens[index + 1][1] if index + 1 < len(tokens) else ""
        word = words[index]
        if word in _OUTSIDE_INTROSPECTION:
            raise _RefusedError(ExecutionStatus.BLOCKED, f"{word} reveals state outside this database")
        if word and following.startswith("("):
            reason = _refusal_of_call(word, previous)
            if reason is not None:
                raise _RefusedError(ExecutionStatus.BLOCKED, reason)
        if kind == duckdb.token_type.string_const and previous in _TABLE_NAMING:
            raise _RefusedError(ExecutionStatus.BLOCKED, f"a string ({text}) names a table, which reads a file or URL")
        if kind == duckdb.token_type.keyword and (
            (word, following.lower()) in _WRITE_CLAUSES
            or (word == "update" and "set" in words[index + 2 : index + _UPDATE_SET_WINDOW])
        ):
            raise _RefusedError(ExecutionStatus.BLOCKED, f"a data-changing {word.upper()} inside a query")


def is_utf8(text: str) -> bool:
    """Whether `text` encodes as UTF-8, as DuckDB's binding needs; a decoded completion may hold a lone surrogate."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _word(kind: duckdb.token_type, text: str) -> str:
    """The lowercased name a keyword or identifier token stands for; empty for other tokens."""
    if kind == duckdb.token_type.keyword:
        return text.lower()
    if kind == duckdb.token_type.identifier:
        if text.startswith('"') and text.endswith('"') and len(text) >= 2:
            text = text[1:-1].replace('""', '"')
        return text.lower()
    return ""


def _parse_single_query(connection: duckdb.DuckDBPyConnection, sql: str) -> duckdb.Statement:
    """The one read-only query `sql` holds; raises _RefusedError when it holds anything else."""
    if not is_utf8(sql):
        raise _RefusedError(ExecutionStatus.ERROR, "the SQL is not valid Unicode text (a lone surrogate)")
    try:
        statements = connection.extract_statements(sql)
    except duckdb.Error as error:
        raise _RefusedError(ExecutionStatus.ERROR, str(error)) from error
    try:
        kinds = [statement.type for statement in statements]
    except ValueError as error:
        # The Python binding cannot name some statement types (UPDATE EXTENSIONS); none is a query.
        raise _RefusedError(ExecutionStatus.BLOCKED, f"unsupported statement type: {error}") from error
    if not statements:
        raise _RefusedError(ExecutionStatus.BLOCKED, "no statement: the SQL is empty or only comments")
    if len(statements) > 1:
        names = ", ".join(kind.name for kind in kinds)
        raise _RefusedError(
            ExecutionStatus.BLOCKED, f"{len(statements)} statements ({names}); only one query is allowed"
        )
    if kinds[0] is not duckdb.StatementType.SELECT:
        raise _RefusedError(
            ExecutionStatus.BLOCKED,
            f"{kinds[0].name} statements are not allowed; only a single read-only query (SELECT) is",
        )
    _screen_tokens(sql)
    return statements[0]


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


class SqlSandbox:
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
        if len(sql) > self.limits.max_sql_chars:
            result = ExecutionResult(
                ExecutionStatus.BLOCKED,
                error=f"SQL of {len(sql)} characters exceeds the limit of {self.limits.max_sql_chars}",
            )
        else:
            try:
                statement = _parse_single_query(slot.connection, sql)
            except _RefusedError as refusal:
                result = ExecutionResult(refusal.status, error=refusal.message)
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

    def __enter__(self) -> SqlSandbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

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
