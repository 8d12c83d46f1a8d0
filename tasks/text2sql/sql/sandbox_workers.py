"""The SQL sandbox in worker processes whose address space the operating system caps, so that no query can take the
scoring process's memory, whatever it makes DuckDB allocate.

`SqlSandbox` bounds what DuckDB tracks (its memory limit, a deadline it notices), but string and list functions
build values outside that limit, and a value under construction or a constant being folded does not notice an
interrupt: `trim(BOTH FROM repeat('x', 1000000000))` reached 3.9 GB and 12 s against 512 MiB and 2 s. A screen of
function names will always miss one, so the cap does not depend on it. Each worker here is a fresh interpreter that
imports only DuckDB, runs a `SqlSandbox`, and before each query caps its own address space (RLIMIT_AS) at what it
maps then plus `SandboxLimits.worker_memory_mb`: an allocation past the cap fails inside the worker (a DuckDB error,
a MemoryError or the worker's death). The parent gives each query a hard deadline past the sandbox's own: a worker
that has not answered by then is killed. Either way that query's result is an error, the worker is replaced, and
the caller carries on; nothing the SQL does reaches the calling process. A worker whose resident memory has grown
by more than `worker_memory_mb` (an allocator keeping what a large query freed) retires after its answer.

Each worker is a `tasks.pipe_worker.PipeWorker`, ended at once if the parent dies. Queries and results cross its pair
of private pipes as pickles of this module's own types (the worker runs only this checkout's code and DuckDB); a batch
of queries goes to each worker in one message (`execute_many`).
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tasks.closeable import Closeable
from tasks.pipe_worker import LiveWorkers, ParentPipes, PipeWorker, WorkerGoneError
from tasks.text2sql.errors import SandboxError
from tasks.text2sql.sql.sandbox import ExecutionResult, ExecutionStatus, SandboxLimits, SqlSandbox

log = logging.getLogger(__name__)

# How long past the sandbox's own deadline the parent waits before it kills a worker: DuckDB's interrupt normally
# ends a query at its deadline, and rows still have to be converted and sent.
_DEADLINE_GRACE_S = 2.0
# How long a fresh worker may take to import DuckDB and report ready.
_START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class _Query:
    db_path: str
    sql: str
    max_rows: int | None


class _Worker(PipeWorker):
    """One worker process; `run` sends queries and waits for each result or its deadline."""

    def __init__(self, limits: SandboxLimits) -> None:
        # On a lifeline: a worker whose parent dies while it runs a query ends at once, not when the query does.
        super().__init__("tasks.text2sql.sql.sandbox_workers", pickle.dumps(limits).hex())
        try:
            ready = self.receive(_START_TIMEOUT_S)
        except WorkerGoneError:
            self.kill()
            raise SandboxError("an SQL sandbox worker exited while starting; its error is in the log") from None
        if ready is None:
            self.kill()
            raise SandboxError("an SQL sandbox worker did not start")

    def run(self, queries: Sequence[_Query], deadline_s: float) -> tuple[list[_Answer], bool]:
        """Send the queries at once and collect the answers, each within `deadline_s` of the one before.

        Returns the answers received, in order, and whether the worker is gone: killed for missing a deadline or
        found dead (the query after the last answer was running then), or retired by its last answer.
        """
        answers: list[_Answer] = []
        try:
            self.send(pickle.dumps(list(queries)))
            while len(answers) < len(queries):
                message = self.receive(deadline_s)
                if message is None:
                    break
                answers.append(pickle.loads(message))
                if answers[-1].retire:
                    self.kill()
                    return answers, True
            else:
                return answers, False
        except WorkerGoneError:
            pass
        self.kill()
        return answers, True


class IsolatedSandbox(Closeable):
    """`SqlSandbox`'s `execute`, and `execute_many` for a batch, run in worker processes with an address-space cap;
    safe from any number of threads.

    `workers` queries run at once; more wait for a free worker. Workers start on first use and are replaced when a
    query ends one or overruns its deadline.
    """

    def __init__(self, limits: SandboxLimits | None = None, workers: int = 2) -> None:
        if workers < 1:
            raise SandboxError(f"IsolatedSandbox needs at least one worker, got {workers}")
        self.limits = limits or SandboxLimits()
        self._free: queue.SimpleQueue[_Worker | None] = queue.SimpleQueue()
        for _ in range(workers):
            self._free.put(None)  # a slot whose worker starts when first needed
        self._workers = workers
        self._closed = False
        self._lock = threading.Lock()
        # A sandbox dropped without close() still stops its workers when it is collected.
        self._live = LiveWorkers(self)
        self.replaced = 0  # workers a query ended: for tests and logs

    def execute(self, db_path: Path, sql: str, max_rows: int | None = None) -> ExecutionResult:
        """`SqlSandbox.execute` in a worker; a query that ends its worker or overruns the deadline is an error."""
        return self._run_share([_Query(str(db_path), sql, max_rows)])[0]

    def execute_many(self, queries: Sequence[tuple[Path, str, int | None]]) -> list[ExecutionResult]:
        """Each query's `execute` result, in order, the queries shared among the workers.

        Each worker gets its share in one message and answers query by query, so a batch pays the pipes' latency
        once per worker rather than once per query: that latency is most of what a worker adds to a short query.
        """
        batch = [_Query(str(path), sql, max_rows) for path, sql, max_rows in queries]
        shares = [batch[start :: self._workers] for start in range(min(self._workers, len(batch)))]
        if len(shares) <= 1:
            return self._run_share(batch)
        with ThreadPoolExecutor(max_workers=len(shares), thread_name_prefix="sandbox-share") as pool:
            answered = list(pool.map(self._run_share, shares))
        # Query i went to share i mod n, at place i div n.
        return [answered[i % len(shares)][i // len(shares)] for i in range(len(batch))]

    def _run_share(self, queries: list[_Query]) -> list[ExecutionResult]:
        """One worker's share: on a worker that dies, the query it was running is an error and the rest go on."""
        if self._closed:
            raise SandboxError("the sandbox is closed")
        results: list[ExecutionResult] = []
        while len(results) < len(queries):
            worker = self._free.get()
            try:
                if worker is None:
                    worker = self._start()
                answers, gone = worker.run(queries[len(results) :], self.limits.timeout_s + _DEADLINE_GRACE_S)
                results.extend(_checked(answer.result) for answer in answers)
                if gone:
                    retired = bool(answers) and answers[-1].retire
                    self._retire(worker, killed=not retired)
                    worker = None
                    if not retired:
                        results.append(_killed(self.limits))
            finally:
                self._free.put(worker)
        return results

    @property
    def worker_pids(self) -> list[int]:
        """The process ids of the running workers (for monitoring, and for tests that end one)."""
        return self._live.pids()

    def _start(self) -> _Worker:
        worker = _Worker(self.limits)
        if not self._live.add(worker):
            raise SandboxError("the sandbox is closed")
        return worker

    def _retire(self, worker: _Worker, killed: bool) -> None:
        worker.kill()
        self._live.discard(worker)
        with self._lock:
            self.replaced += killed
        if killed:
            log.warning("an SQL sandbox worker was ended by its query; a new one takes its place")

    def close(self) -> None:
        """Stop every worker; later calls to execute raise SandboxError."""
        self._closed = True
        self._live.kill_all()


def _checked(result: ExecutionResult) -> ExecutionResult:
    """The result, or the caller's SandboxError for a database the worker could not open (not the SQL's doing)."""
    if result.error is not None and result.error.startswith(_SETUP_FAILURE):
        raise SandboxError(result.error.removeprefix(_SETUP_FAILURE))
    return result


def _killed(limits: SandboxLimits) -> ExecutionResult:
    return ExecutionResult(
        ExecutionStatus.ERROR,
        error=(
            f"the query ended its sandbox worker: it needed more than the {limits.worker_memory_mb} MiB cap or ran "
            f"past the {limits.timeout_s:g} s limit without noticing the interrupt"
        ),
    )


# A worker reports a database it cannot open (not the SQL's fault) with this prefix, for the parent to raise.
_SETUP_FAILURE = "sandbox setup failed: "


def _serve(limits: SandboxLimits) -> None:
    """A worker's loop: queries in on stdin, results out on stdout, each query under an address-space cap."""
    parent = ParentPipes()
    headroom = limits.worker_memory_mb * 2**20
    cap = _AddressSpaceCap(headroom)
    with SqlSandbox(limits) as sandbox:
        started = _memory()
        parent.send(b"ready")
        while (message := parent.receive()) is not None:
            queries: list[_Query] = pickle.loads(message)
            for query in queries:
                # Set afresh for each query: opening a database maps some 70 MB that the query then holds.
                cap.renew()
                try:
                    result = sandbox.execute(Path(query.db_path), query.sql, query.max_rows)
                except SandboxError as error:
                    result = ExecutionResult(ExecutionStatus.ERROR, error=f"{_SETUP_FAILURE}{error}")
                # Memory the allocator kept from a large query counts against the machine: past the headroom,
                # this worker retires after this answer, and the parent sends the rest to a new one.
                now = _memory()
                retire = now is not None and started is not None and now.resident > started.resident + headroom
                parent.send(pickle.dumps(_Answer(result, retire)))
                if retire:
                    return


@dataclass(frozen=True)
class _Answer:
    result: ExecutionResult
    # The worker exits after this answer; the parent starts a new one for the next query.
    retire: bool


@dataclass(frozen=True)
class _Memory:
    mapped: int  # bytes of address space
    resident: int  # bytes in RAM


def _memory() -> _Memory | None:
    """This process's mapped and resident bytes, from /proc (None where there is none: macOS, Windows)."""
    try:
        size, resident = Path("/proc/self/statm").read_bytes().split()[:2]
    except OSError:
        return None
    page = os.sysconf("SC_PAGE_SIZE")
    return _Memory(int(size) * page, int(resident) * page)


class _AddressSpaceCap:
    """Keeps the soft RLIMIT_AS at what the process maps plus `headroom`, where the OS enforces it (Linux).

    `renew` before each query: it lowers or raises the soft limit (never past the hard one, which stays as it was)
    only when the mapping moved by more than `_SLACK` since the last time, so the usual query pays one read of /proc.
    """

    _SLACK = 32 * 2**20

    def __init__(self, headroom: int) -> None:
        self.headroom = headroom
        self._mapped_at_cap: int | None = None
        try:
            import resource
        except ImportError:  # Windows has no rlimits
            self._resource = None
            return
        self._resource = resource

    def renew(self) -> None:
        memory = _memory()
        if self._resource is None or memory is None:
            return
        if self._mapped_at_cap is not None and abs(memory.mapped - self._mapped_at_cap) <= self._SLACK:
            return
        _, hard = self._resource.getrlimit(self._resource.RLIMIT_AS)
        cap = memory.mapped + self.headroom
        if hard != self._resource.RLIM_INFINITY:
            cap = min(cap, hard)
        self._resource.setrlimit(self._resource.RLIMIT_AS, (cap, hard))
        self._mapped_at_cap = memory.mapped


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    # Through the module's importable name, so that the answers it pickles name that module and not __main__.
    from tasks.text2sql.sql import sandbox_workers

    sandbox_workers._serve(pickle.loads(bytes.fromhex(sys.argv[1])))
