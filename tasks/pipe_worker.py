"""A worker process spoken to over a pair of pipes: the parent's `PipeWorker`, the child's `ParentPipes`, and the
`LiveWorkers` an owner kills when it closes.

Both sandboxes run what they contain in a fresh interpreter, `python -m <module> [args…]`, started on a `lifeline`
(it ends at once when the process that started it ends, however that ends), and exchange whole messages with it
through `multiprocessing.connection.Connection`s on the child's stdin and stdout. The parent waits for each answer
with a deadline and kills a child that misses it; what a deadline is, when a child is replaced and what its end
means to the caller stay with each sandbox.

Messages are bytes: nothing here pickles or unpickles, and each sandbox chooses its format by what runs in its child.
The reward-code sandbox (`tasks.reward_code.sandbox`) runs untrusted Python there, so both ways its messages are
JSON, which the parent only ever parses: an unpickled answer could run anything in the parent. The SQL sandbox
(`tasks.text2sql.sql.sandbox_workers`) runs only this checkout's code and DuckDB there, so its queries and answers are
pickles of its own dataclasses.

The standard library and `lifeline` only: the reward-code child imports this module and must import nothing more.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import weakref
from multiprocessing.connection import Connection
from pathlib import Path

import lifeline

_ROOT = Path(__file__).resolve().parents[1]


class WorkerGoneError(Exception):
    """The child's pipes are closed: it exited, was killed, or its parent side was ended by `kill`."""


class PipeWorker:
    """A child `python -m <module> [args…]` on a lifeline, and the two Connections on its stdin and stdout.

    Safe to `kill` from any thread, as often as asked: a thread closing a pool and the one waiting on this worker
    may both end it.
    """

    def __init__(self, module: str, *args: str) -> None:
        self._ending = threading.Lock()
        self._ended = False
        self._process = lifeline.popen(
            [sys.executable, "-m", module, *args],
            grace_s=0,  # a child whose parent died has no one to answer: SIGKILL at once, mid-call or not
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            # A fresh interpreter that imports this checkout. glibc gives each new thread a malloc arena that reserves
            # 64 MiB of address space, which a child's address-space cap counts: with two arenas its threads start.
            env={**os.environ, "MALLOC_ARENA_MAX": "2", "PYTHONPATH": _import_path()},
            cwd=_ROOT,
        )
        self._to_worker = Connection(os.dup(self._process.stdin.fileno()), readable=False)
        self._from_worker = Connection(os.dup(self._process.stdout.fileno()), writable=False)
        self._process.stdin.close()
        self._process.stdout.close()

    @property
    def pid(self) -> int:
        return self._process.pid

    def send(self, message: bytes) -> None:
        """Send one message to the child.

        Raises:
            WorkerGoneError: the child or its pipe is gone.
        """
        try:
            self._to_worker.send_bytes(message)
        except OSError:
            raise WorkerGoneError from None

    def receive(self, timeout_s: float) -> bytes | None:
        """The child's next message, or None if none came within `timeout_s`.

        Raises:
            WorkerGoneError: the child closed its end (it exited or died), or `kill` closed ours.
        """
        try:
            if not self._from_worker.poll(timeout_s):
                return None
            return self._from_worker.recv_bytes()
        except (EOFError, OSError):
            raise WorkerGoneError from None

    def wait(self) -> int:
        """Wait for the child to exit; its exit status (negative: the signal that ended it)."""
        return self._process.wait()

    def kill(self) -> None:
        """Kill the child, reap it and close the pipes (once, whoever asks first)."""
        with self._ending:
            if self._ended:
                return
            self._ended = True
            if self._process.poll() is None:
                self._process.kill()
            self._process.wait()
            for connection in (self._to_worker, self._from_worker):
                connection.close()


class LiveWorkers:
    """The workers one owner has running; safe from any number of threads.

    `kill_all` ends them, and so do the owner's collection and the interpreter's exit: an owner dropped without
    closing leaves no process behind.
    """

    def __init__(self, owner: object) -> None:
        self._lock = threading.Lock()
        self._workers: set[PipeWorker] = set()
        # Holds the set and its lock, never the owner, so the owner can still be collected.
        self._finalizer = weakref.finalize(owner, _kill_all, self._workers, self._lock)

    def add(self, worker: PipeWorker) -> bool:
        """Keep `worker` among the running ones; once `kill_all` has run, kill it instead and return False (a worker
        started while another thread closes its owner must not outlive the owner)."""
        with self._lock:
            if self._finalizer.alive:
                self._workers.add(worker)
                return True
        worker.kill()
        return False

    def discard(self, worker: PipeWorker) -> None:
        with self._lock:
            self._workers.discard(worker)

    def pids(self) -> list[int]:
        with self._lock:
            return [worker.pid for worker in self._workers]

    def kill_all(self) -> None:
        self._finalizer()


class ParentPipes:
    """The child's side of a `PipeWorker`: messages to and from the parent on what were stdin and stdout.

    Build it first thing in the child: it points stdout at stderr, so that a stray print (a library's, the contained
    code's) cannot corrupt a message.
    """

    def __init__(self) -> None:
        self._to_parent = Connection(os.dup(1), readable=False)
        self._from_parent = Connection(os.dup(0), writable=False)
        os.dup2(2, 1)

    def send(self, message: bytes) -> None:
        self._to_parent.send_bytes(message)

    def receive(self) -> bytes | None:
        """The parent's next message; None once the parent has closed its end (the child should exit)."""
        try:
            return self._from_parent.recv_bytes()
        except EOFError:
            return None


def _import_path() -> str:
    existing = os.environ.get("PYTHONPATH")
    return str(_ROOT) if not existing else f"{_ROOT}{os.pathsep}{existing}"


def _kill_all(workers: set[PipeWorker], lock: threading.Lock) -> None:
    with lock:
        for worker in list(workers):
            worker.kill()
        workers.clear()
