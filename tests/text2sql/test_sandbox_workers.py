"""The sandbox in worker processes: whatever a query makes DuckDB allocate, the scoring process's memory stays
where it was, the query ends in a result by its deadline, and the next query runs.

The statements below are the ones that escaped the in-process sandbox (they build values outside DuckDB's memory
limit, or get past the screen of function names), each measured at 2-6 GB and 12-20 s before this layer existed.
Real worker processes, a real address-space cap, a real DuckDB file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import duckdb
import pytest
from support.hostile_sql import HOSTILE_CASES, HostileCase
from support.process_trees import NEEDS_PROC, alive, wait_until_gone

from tasks.text2sql.errors import SandboxError
from tasks.text2sql.sql.sandbox import ExecutionStatus, SandboxLimits
from tasks.text2sql.sql.sandbox_workers import IsolatedSandbox

LIMITS = SandboxLimits(timeout_s=1.0, memory_limit_mb=128, max_rows=100, worker_memory_mb=256)
ORDERS = 900
# What the parent may grow by while its workers run every statement below: far under one statement's appetite.
PARENT_GROWTH_MB = 100
WORKER_DEADLINE_S = LIMITS.timeout_s + 2.0 + 3.0  # the sandbox's deadline, the kill grace, a restart

ESCAPED = {
    "trim both from repeat": "SELECT length(trim(BOTH FROM repeat('x', 1000000000)))",
    "trim both from a huge series": "SELECT length(trim(BOTH FROM (SELECT string_agg(i::VARCHAR, '') "
    "FROM generate_series(1, 300000000) t(i))))",
    "substring of a huge range": "SELECT length(substring((SELECT string_agg('xxxxxxxx', '') "
    "FROM generate_series(1, 200000000)) FROM 1 FOR 1000000000))",
    "trim over a series": "SELECT max(length(trim(BOTH FROM i::VARCHAR))) FROM generate_series(1, 2000000000) t(i)",
    "doubling list_reduce": "SELECT length(list_reduce(['x','x','x','x','x','x','x','x','x','x','x','x','x','x',"
    "'x','x','x','x','x','x','x','x','x','x','x','x','x','x','x','x','x','x','x','x'], lambda a, b: a || a))",
    "format with a huge width": "SELECT length(format('{:>1000000000}', 'x'))",
    "printf with a huge width": "SELECT length(printf('%300000000d', 1))",
    "damerau_levenshtein of long strings": "SELECT damerau_levenshtein(s, reverse(s)) FROM (SELECT "
    "string_agg(chr((65 + i % 26)::INTEGER), '') AS s FROM generate_series(1, 15000) t(i))",
    # Ten times longer at each of nine levels: 10^10 characters.
    "nested replace": "SELECT length(" + "replace(" * 9 + "'xxxxxxxxxx'" + ", 'x', 'xxxxxxxxxx')" * 9 + ")",
}


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("workers") / "shop.duckdb"
    with duckdb.connect(str(path)) as connection:
        connection.execute(
            "CREATE TABLE customers AS SELECT range AS id, 'name' || range AS name, 'city' || (range % 7) AS city "
            f"FROM range(300); CREATE TABLE orders AS SELECT range AS id, range % 300 AS customer_id, "
            f"(range * 7 % 1000) / 10.0 AS amount, DATE '2024-01-01' + (range % 365)::INTEGER AS placed_on "
            f"FROM range({ORDERS})"
        )
    return path


@pytest.fixture(scope="module")
def sandbox() -> IsolatedSandbox:
    with IsolatedSandbox(LIMITS, workers=2) as isolated:
        yield isolated


def resident_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_queries_run_in_workers_with_the_sandboxs_results(sandbox: IsolatedSandbox, database: Path) -> None:
    result = sandbox.execute(database, "SELECT id, name FROM customers WHERE id < 3 ORDER BY id")
    assert result.status is ExecutionStatus.OK
    assert result.rows == ((0, "name0"), (1, "name1"), (2, "name2"))
    assert sandbox.execute(database, "DELETE FROM customers").status is ExecutionStatus.BLOCKED
    assert sandbox.execute(database, "SELECT * FROM orders", max_rows=5).truncated


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the process's RSS from /proc")
def test_statements_that_escaped_the_in_process_sandbox_cost_their_worker_not_the_caller(
    sandbox: IsolatedSandbox, database: Path
) -> None:
    before = resident_mb()
    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = pool.map(lambda sql: timed_execute(sandbox, database, sql), ESCAPED.values())
        timed = dict(zip(ESCAPED, outcomes, strict=True))
    grew = resident_mb() - before
    for name, (status, error, seconds) in timed.items():
        # Refused by the screen, stopped by DuckDB's limit or clock, or its worker ended: never a result the size
        # of the statement's appetite, never past the hard deadline.
        assert status in (ExecutionStatus.BLOCKED, ExecutionStatus.ERROR, ExecutionStatus.TIMED_OUT), (name, error)
        assert seconds < WORKER_DEADLINE_S, (name, seconds)
    assert grew < PARENT_GROWTH_MB, f"the scoring process grew by {grew:.0f} MB"
    assert sandbox.execute(database, "SELECT count(*) FROM orders").rows == ((ORDERS,),)


def timed_execute(sandbox: IsolatedSandbox, database: Path, sql: str) -> tuple[ExecutionStatus, str | None, float]:
    started = time.monotonic()
    result = sandbox.execute(database, sql)
    return result.status, result.error, time.monotonic() - started


def test_a_query_that_ends_its_worker_is_an_error_and_a_new_worker_takes_the_next(database: Path) -> None:
    limits = SandboxLimits(timeout_s=1.0, memory_limit_mb=2048, worker_memory_mb=256)
    with IsolatedSandbox(limits, workers=1) as sandbox:
        # One value of 1 GB, under DuckDB's limit here but past what the worker may map.
        result = sandbox.execute(database, "SELECT length(format('{:>1000000000}', 'x'))")
        assert result.status is ExecutionStatus.ERROR
        assert "Allocation failure" in result.error or "256 MiB" in result.error
        after = sandbox.execute(database, "SELECT count(*) FROM customers")
        assert after.status is ExecutionStatus.OK and after.rows == ((300,),)


def test_a_worker_that_dies_mid_batch_costs_only_the_query_it_was_running(database: Path) -> None:
    with IsolatedSandbox(SandboxLimits(timeout_s=20.0), workers=1) as sandbox:
        sandbox.execute(database, "SELECT 1")
        (pid,) = sandbox.worker_pids
        # The second query runs for hours; the worker is killed (as the OOM killer would) while it does.
        threading.Timer(1.0, os.kill, (pid, signal.SIGKILL)).start()
        results = sandbox.execute_many(
            [
                (database, "SELECT count(*) FROM customers", None),
                (database, "SELECT count(*) FROM orders a, orders b, orders c, orders d", None),
                (database, "SELECT count(*) FROM orders", None),
                (database, "SELECT max(id) FROM customers", None),
            ]
        )
        assert [r.status for r in results] == [ExecutionStatus.OK, ExecutionStatus.ERROR, *[ExecutionStatus.OK] * 2]
        assert "ended its sandbox worker" in results[1].error
        assert [r.rows for r in (results[0], results[2], results[3])] == [((300,),), ((ORDERS,),), ((299,),)]
        assert sandbox.replaced == 1 and sandbox.worker_pids != [pid]


def test_closing_the_pool_while_threads_wait_on_its_workers_ends_each_worker_once(database: Path) -> None:
    """Ctrl-C or SIGTERM closes the pool while threads still wait on its workers (a data build's round trips): the
    closing thread and the waiting ones both end the workers, and that must neither raise in either nor leave a
    worker behind; the interrupted queries come back as errors."""
    endless = "SELECT count(*) FROM orders a, orders b, orders c, orders d"
    for _ in range(5):  # the two ends race; a few rounds give the race its chances
        sandbox = IsolatedSandbox(SandboxLimits(timeout_s=20.0), workers=2)
        sandbox.execute_many([(database, "SELECT 1", None)] * 2)
        pids = sandbox.worker_pids
        with ThreadPoolExecutor(2) as waiting:
            futures = [waiting.submit(sandbox.execute, database, endless) for _ in range(2)]
            time.sleep(0.5)
            sandbox.close()
            results = [future.result(timeout=30) for future in futures]
        assert [r.status for r in results] == [ExecutionStatus.ERROR] * 2
        wait_until_gone(pids, within_s=10)


def test_a_batch_is_shared_among_the_workers_and_answered_in_order(sandbox: IsolatedSandbox, database: Path) -> None:
    queries = [(database, f"SELECT {i} + count(*) FROM customers", None) for i in range(9)]
    assert [r.rows for r in sandbox.execute_many(queries)] == [((300 + i,),) for i in range(9)]
    assert len(sandbox.worker_pids) == 2


@pytest.mark.parametrize("case", HOSTILE_CASES, ids=lambda case: case.name)
def test_the_hostile_corpus_is_contained_in_workers(
    sandbox: IsolatedSandbox, database: Path, tmp_path: Path, case: HostileCase
) -> None:
    result = sandbox.execute(database, case.sql.replace("$TMP", str(tmp_path)))
    # A worker the statement ended, or a deadline the parent enforced, counts as the clock or the memory limit.
    allowed = case.allowed | ({ExecutionStatus.ERROR} if ExecutionStatus.TIMED_OUT in case.allowed else set())
    assert result.status in allowed, result.error
    assert list(tmp_path.iterdir()) == []


def test_a_database_that_cannot_be_opened_raises_in_the_caller(sandbox: IsolatedSandbox, tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="cannot open database"):
        sandbox.execute(tmp_path / "missing.duckdb", "SELECT 1")
    assert not (tmp_path / "missing.duckdb").exists()


# A scorer whose two workers each run a query of hours (under a deadline of ten minutes), killed outright.
SCORER_KILLED_MID_QUERY = """
import sys, threading, time
from pathlib import Path
from tasks.text2sql.sql.sandbox import SandboxLimits
from tasks.text2sql.sql.sandbox_workers import IsolatedSandbox

sandbox = IsolatedSandbox(SandboxLimits(timeout_s=600.0), workers=2)
endless = (Path(sys.argv[1]), "SELECT count(*) FROM orders a, orders b, orders c, orders d", None)
threading.Thread(target=sandbox.execute_many, args=([endless, endless],), daemon=True).start()
while len(sandbox.worker_pids) < 2:
    time.sleep(0.05)
print(*sandbox.worker_pids, flush=True)
time.sleep(600)
"""


@NEEDS_PROC
def test_workers_end_at_once_when_the_process_that_started_them_is_killed_mid_query(database: Path) -> None:
    scorer = subprocess.Popen(
        [sys.executable, "-c", SCORER_KILLED_MID_QUERY, str(database)],
        cwd=Path(__file__).parents[2],
        stdout=subprocess.PIPE,
        text=True,
    )
    workers = [int(pid) for pid in scorer.stdout.readline().split()]
    assert len(workers) == 2 and all(alive(pid) for pid in workers)
    time.sleep(0.5)  # both queries under way
    scorer.kill()
    scorer.wait()
    try:
        wait_until_gone(workers, within_s=2)
    finally:
        for pid in filter(alive, workers):
            os.kill(pid, signal.SIGKILL)
