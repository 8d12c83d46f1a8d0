"""Child processes that end with the process that started them, however it ends.

`popen(["python", "-m", module, …], grace_s=…)` starts the child as `subprocess.Popen` would, but through
`lifeline/watch.py`: a thread in the child blocks reading a pipe whose only write end stays in this process. When
this process ends — an orderly exit, an exception, SIGKILL, the OOM killer — the kernel closes that end, the child's
read returns, and the child ends itself: SIGTERM (its orderly shutdown), up to `grace_s` seconds, then SIGKILL. A
child started with `start_new_session=True` leads a process group and ends the whole group, so processes it started
itself (vLLM's engine) go with it.

`stop(process, grace_s)` is the orderly end from this side, for the same tree.

A pipe rather than Linux's parent-death signal (`PR_SET_PDEATHSIG`): that signal fires when the *thread* that
started the child ends, and the backend starts vLLM on a loading thread that ends, the SQL sandbox its workers on a
pool's threads; it reaches the child only, not the processes the child started; and macOS has none.

The three layers (trainer_backend, tasks, autoresearch) each start processes and none imports another, so this lives
beside them: the standard library only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

WATCH = Path(__file__).with_name("watch.py")


class _Lifeline:
    """This process's pipe: every child gets the read end; the write end never leaves this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ends: tuple[int, int] | None = None
        # A child forked without exec (multiprocessing's fork start method) gets a copy of the write end, which would
        # keep this process's children alive as long as it lives: it closes it and makes its own pipe if it needs one.
        os.register_at_fork(after_in_child=self._forget)

    def read_end(self) -> int:
        with self._lock:
            if self._ends is None:
                self._ends = os.pipe()  # not inheritable: no child gets the write end by accident
            return self._ends[0]

    def _forget(self) -> None:
        self._lock = threading.Lock()
        # The read end stays open: a `Popen` with a preexec_fn runs this hook too, between its fork and its exec, in
        # a child that is being handed that end.
        if self._ends is not None:
            with contextlib.suppress(OSError):
                os.close(self._ends[1])
        self._ends = None


_LIFELINE = _Lifeline()


def popen(command: Sequence[str], *, grace_s: float, **options: Any) -> subprocess.Popen:
    """`subprocess.Popen(command, **options)` for a command `python -m module [args…]`, tied to this process.

    When this process ends, the child sends SIGTERM to itself (to its process group if it leads one:
    `start_new_session=True`), waits up to `grace_s` seconds, then sends SIGKILL; `grace_s=0` is SIGKILL at once.
    The child runs in the same process as the watch, so the `Popen`'s pid is the module's.

    Raises:
        ValueError: the command is not `python -m module …`.
    """
    if len(command) < 3 or command[1] != "-m":
        raise ValueError(f"lifeline.popen runs `python -m module [args…]`, not {list(command)[:3]}")
    python, _, module, *args = command
    fd = _LIFELINE.read_end()
    argv = [str(python), str(WATCH), str(fd), str(grace_s), "-m", module, *args]
    pass_fds = (*options.pop("pass_fds", ()), fd)
    return subprocess.Popen(argv, pass_fds=pass_fds, **options)


def stop(process: subprocess.Popen, grace_s: float) -> int:
    """End a child and, if it leads a process group, that whole group: SIGTERM, up to `grace_s` seconds for the child
    to exit, then SIGKILL (which also reaches what a group leader that crashed left running). Returns its exit status.
    """
    if process.poll() is None:
        _signal_tree(process, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)
    _signal_tree(process, signal.SIGKILL)
    return process.wait()


def _signal_tree(process: subprocess.Popen, signum: int) -> None:
    # A process group's id is its leader's pid, and a pid is not given out again while a group carries it: the group
    # named by the child's pid exists only if the child leads (or led) it.
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signum)
