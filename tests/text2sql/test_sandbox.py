"""The SQL sandbox: what it runs, what it refuses, and that the database and the process survive it."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import duckdb
import pytest
from support.hostile_sql import HOSTILE_CASES, HostileCase

from tasks.text2sql.errors import SandboxError
from tasks.text2sql.sql.sandbox import ExecutionStatus, SandboxLimits, SqlSandbox

CUSTOMERS = 300
ORDERS = 900
LIMITS = SandboxLimits(timeout_s=0.5, memory_limit_mb=256, max_rows=100)
# Hours of work for DuckDB: 900^4 rows.
ENDLESS_QUERY = "SELECT count(*) FROM orders a, orders b, orders c, orders d"


@pytest.fixture
def database(tmp_path: Path) -> Path:
    path = tmp_path / "shop.duckdb"
    with duckdb.connect(str(path)) as connection:
        connection.execute(
            f"""
            CREATE TABLE customers AS
            SELECT range AS id, 'name' || range AS name, 'city' || (range % 7) AS city FROM range({CUSTOMERS});
            CREATE TABLE orders AS
            SELECT range AS id, range % {CUSTOMERS} AS customer_id, (range * 7 % 1000) / 10.0 AS amount,
                   DATE '2024-01-01' + (range % 365)::INTEGER AS placed_on
            FROM range({ORDERS});
            """
        )
    return path


@pytest.fixture
def sandbox() -> Iterator[SqlSandbox]:
    with SqlSandbox(LIMITS) as sandbox:
        yield sandbox


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _files_under(directory: Path) -> set[Path]:
    return set(directory.rglob("*"))


def test_query_returns_columns_and_rows(sandbox: SqlSandbox, database: Path) -> None:
    result = sandbox.execute(database, "SELECT id, name FROM customers WHERE id < 3 ORDER BY id")

    assert result.status is ExecutionStatus.OK
    assert result.ok
    assert result.columns == ("id", "name")
    assert result.rows == ((0, "name0"), (1, "name1"), (2, "name2"))
    assert not result.truncated
    assert result.error is None
    assert result.elapsed_s > 0


@pytest.mark.parametrize(
    ("sql", "rows"),
    [
        ("WITH first AS (SELECT * FROM orders WHERE id < 10) SELECT count(*) FROM first", ((10,),)),
        ("SELECT 1 UNION SELECT 2 ORDER BY 1", ((1,), (2,))),
        ("SELECT id FROM customers WHERE id < 3 INTERSECT SELECT 2 ORDER BY 1", ((2,),)),
        ("SELECT id FROM customers WHERE id < 3 EXCEPT SELECT 2 ORDER BY 1", ((0,), (1,))),
        ("VALUES (1, 'a'), (2, 'b')", ((1, "a"), (2, "b"))),
        ("FROM customers SELECT count(*)", ((CUSTOMERS,),)),
        ("SELECT count(*) FROM orders;", ((ORDERS,),)),
        ("SELECT count(*) FROM range(5) CROSS JOIN generate_series(1, 2)", ((10,),)),
        ("SELECT table_name FROM duckdb_tables() ORDER BY 1", (("customers",), ("orders",))),
        ("SELECT lower('X') /* a comment; with a semicolon */ -- and another", (("x",),)),
    ],
    ids=[
        "with",
        "union",
        "intersect",
        "except",
        "values",
        "from_first",
        "trailing_semicolon",
        "table_functions_after_from",
        "catalog",
        "comments",
    ],
)
def test_read_only_query_shapes_run(
    sandbox: SqlSandbox, database: Path, sql: str, rows: tuple[tuple[object, ...], ...]
) -> None:
    result = sandbox.execute(database, sql)

    assert result.status is ExecutionStatus.OK, result.error
    assert result.rows == rows


def test_rows_beyond_max_rows_are_cut_and_flagged(sandbox: SqlSandbox, database: Path) -> None:
    result = sandbox.execute(database, "SELECT id FROM orders ORDER BY id")

    assert result.status is ExecutionStatus.OK
    assert result.truncated
    assert result.rows == tuple((i,) for i in range(LIMITS.max_rows))


def test_exactly_max_rows_is_not_truncated(sandbox: SqlSandbox, database: Path) -> None:
    result = sandbox.execute(database, f"SELECT id FROM orders LIMIT {LIMITS.max_rows}")

    assert len(result.rows) == LIMITS.max_rows
    assert not result.truncated


def test_endless_result_streams_only_the_rows_returned(sandbox: SqlSandbox, database: Path) -> None:
    result = sandbox.execute(database, "SELECT * FROM range(1000000000000)")

    assert result.status is ExecutionStatus.OK
    assert result.truncated
    assert len(result.rows) == LIMITS.max_rows
    assert result.elapsed_s < LIMITS.timeout_s


def test_syntax_error_is_an_error_naming_the_problem(sandbox: SqlSandbox, database: Path) -> None:
    result = sandbox.execute(database, "SELEC id FROM customers")

    assert result.status is ExecutionStatus.ERROR
    assert result.error is not None
    assert "syntax error" in result.error


def test_unknown_table_is_an_error_naming_the_table(sandbox: SqlSandbox, database: Path) -> None:
    result = sandbox.execute(database, "SELECT * FROM suppliers")

    assert result.status is ExecutionStatus.ERROR
    assert result.error is not None
    assert "suppliers" in result.error


def test_sql_longer_than_the_limit_is_blocked_without_parsing(database: Path) -> None:
    with SqlSandbox(SandboxLimits(max_sql_chars=50)) as sandbox:
        # Parsed, this would be a syntax error rather than a refusal.
        result = sandbox.execute(database, "SELEC" + " " * 60)

    assert result.status is ExecutionStatus.BLOCKED
    assert result.error is not None
    assert "exceeds the limit of 50" in result.error


@pytest.mark.parametrize("case", HOSTILE_CASES, ids=lambda case: case.name)
def test_hostile_statement_is_contained(sandbox: SqlSandbox, database: Path, tmp_path: Path, case: HostileCase) -> None:
    digest, files = _sha256(database), _files_under(tmp_path)

    result = sandbox.execute(database, case.sql.replace("$TMP", str(tmp_path)))

    assert result.status in case.allowed, result.error
    if result.status is not ExecutionStatus.OK:
        assert result.error
    if result.status is ExecutionStatus.ERROR:
        assert case.error_hint in result.error
    assert _sha256(database) == digest
    assert _files_under(tmp_path) == files
    assert sandbox.execute(database, "SELECT count(*) FROM orders").rows == ((ORDERS,),)


def test_hostile_corpus_is_large_and_explains_every_error() -> None:
    assert len(HOSTILE_CASES) >= 60
    assert len({case.name for case in HOSTILE_CASES}) == len(HOSTILE_CASES)
    for case in HOSTILE_CASES:
        if ExecutionStatus.ERROR in case.allowed or ExecutionStatus.OK in case.allowed:
            assert case.why, case.name
        if ExecutionStatus.ERROR in case.allowed:
            assert case.error_hint, case.name


def test_copy_and_export_into_own_directory_write_nothing(sandbox: SqlSandbox, database: Path, tmp_path: Path) -> None:
    target = tmp_path / "leak.csv"
    dump = tmp_path / "dump"

    copied = sandbox.execute(database, f"COPY customers TO '{target}'")
    exported = sandbox.execute(database, f"EXPORT DATABASE '{dump}'")

    assert copied.status is ExecutionStatus.BLOCKED
    assert exported.status is ExecutionStatus.BLOCKED
    assert not target.exists()
    assert not dump.exists()


def test_access_duckdb_refuses_is_blocked(sandbox: SqlSandbox, database: Path) -> None:
    # Not on the sandbox's list of names: it reads a directory under ~/.duckdb, which only the
    # engine's enable_external_access=false stops.
    result = sandbox.execute(database, "SELECT * FROM duckdb_extension_repositories()")

    assert result.status is ExecutionStatus.BLOCKED
    assert result.error is not None
    assert "outside the database" in result.error


def test_timed_out_query_is_interrupted_and_the_sandbox_recovers(database: Path) -> None:
    with SqlSandbox(SandboxLimits(timeout_s=0.2)) as sandbox:
        timed_out = sandbox.execute(database, ENDLESS_QUERY)
        after = sandbox.execute(database, "SELECT count(*) FROM customers")

    assert timed_out.status is ExecutionStatus.TIMED_OUT
    assert timed_out.error is not None
    assert "0.2 s" in timed_out.error
    assert 0.2 <= timed_out.elapsed_s < 1.5
    assert after.rows == ((CUSTOMERS,),)


def test_memory_limit_is_an_error_naming_the_limit(database: Path) -> None:
    with SqlSandbox(SandboxLimits(timeout_s=10, memory_limit_mb=64)) as sandbox:
        result = sandbox.execute(database, "SELECT count(*) FROM (SELECT * FROM range(100000000) ORDER BY random())")

    assert result.status is ExecutionStatus.ERROR
    assert result.error is not None
    assert "64 MiB memory limit" in result.error


def test_one_sandbox_serves_many_threads(sandbox: SqlSandbox, database: Path) -> None:
    def orders_of(customer: int) -> tuple[tuple[object, ...], ...]:
        sql = f"SELECT count(*), min(id) FROM orders WHERE customer_id = {customer}"
        return sandbox.execute(database, sql).rows

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(orders_of, range(CUSTOMERS)))

    assert results == [((ORDERS // CUSTOMERS, customer),) for customer in range(CUSTOMERS)]


def test_watchdog_interrupts_only_the_queries_past_their_deadline(sandbox: SqlSandbox, database: Path) -> None:
    endless = set(range(0, 64, 4))

    def run(index: int) -> tuple[ExecutionStatus, threading.Thread]:
        sql = ENDLESS_QUERY if index in endless else f"SELECT count(*) FROM orders WHERE customer_id = {index}"
        return sandbox.execute(database, sql).status, threading.current_thread()

    with ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = list(pool.map(run, range(64)))

    statuses = [status for status, _ in outcomes]
    assert statuses == [ExecutionStatus.TIMED_OUT if index in endless else ExecutionStatus.OK for index in range(64)]
    assert len({thread for _, thread in outcomes}) > 1


def test_engine_settings_are_locked_down(sandbox: SqlSandbox, database: Path) -> None:
    settings = (
        "enable_external_access",
        "autoload_known_extensions",
        "autoinstall_known_extensions",
        "allow_community_extensions",
        "python_enable_replacements",
        "lock_configuration",
        "threads",
        "temp_directory",
        "memory_limit",
    )
    sql = "SELECT " + ", ".join(f"current_setting('{name}')" for name in settings)

    result = sandbox.execute(database, sql)

    assert result.rows == ((False, False, False, False, False, True, 1, "", "256.0 MiB"),)


def test_missing_database_raises_and_is_not_created(sandbox: SqlSandbox, tmp_path: Path) -> None:
    missing = tmp_path / "missing.duckdb"

    with pytest.raises(SandboxError, match="cannot open database"):
        sandbox.execute(missing, "SELECT 1")
    assert not missing.exists()


def test_sandboxes_with_other_limits_and_plain_connections_share_a_file(sandbox: SqlSandbox, database: Path) -> None:
    assert sandbox.execute(database, "SELECT 1").ok
    with duckdb.connect(str(database), read_only=True) as plain:
        assert plain.execute("SELECT 1").fetchone() == (1,)
        with SqlSandbox(SandboxLimits(memory_limit_mb=128, timeout_s=0.5)) as other:
            assert other.execute(database, "SELECT 1").ok
            setting = other.execute(database, "SELECT current_setting('memory_limit')")
            assert setting.rows == (("128.0 MiB",),)
    assert sandbox.execute(database, "SELECT 1").ok


def test_a_lower_row_cap_per_call_truncates_early(sandbox: SqlSandbox, database: Path) -> None:
    capped = sandbox.execute(database, "SELECT * FROM range(100)", max_rows=5)
    assert capped.truncated and len(capped.rows) == 5
    assert not sandbox.execute(database, "SELECT * FROM range(5)", max_rows=5).truncated


def test_execute_after_close_raises(database: Path) -> None:
    sandbox = SqlSandbox(LIMITS)
    sandbox.close()

    with pytest.raises(SandboxError, match="closed"):
        sandbox.execute(database, "SELECT 1")


@pytest.mark.parametrize("field", ["timeout_s", "memory_limit_mb", "threads", "max_rows", "max_sql_chars"])
def test_non_positive_limit_is_rejected_naming_the_field(field: str) -> None:
    with pytest.raises(SandboxError, match=f"SandboxLimits.{field}"):
        SandboxLimits(**{field: 0})
