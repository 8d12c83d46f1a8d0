"""`python <this file> <fd> <grace_s> -m <module> [args…]`, as `lifeline.popen` starts a child: watch the pipe on
<fd>, then run <module> as `python -m` would, in this same process.

The watch is a thread blocked reading the pipe, whose only write end the parent holds. When the parent ends, however
it ends (SIGKILL included), the kernel closes that end and the read returns: this process then ends, with its process
group if it leads one — SIGTERM (an orderly shutdown), up to <grace_s> seconds, then SIGKILL; a grace of 0 is SIGKILL
at once.

The standard library only, and nothing of this project: it runs in whatever interpreter the child needs (vLLM's
environment has none of our packages).
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import threading
import time
from pathlib import Path

USAGE = "usage: python watch.py <fd> <grace_s> -m <module> [args…]"


def watch(fd: int, grace_s: float) -> None:
    """End this process (and the group it leads) once the other end of the pipe on `fd` is closed."""

    def wait_for_the_parent() -> None:
        # The parent never writes: the read returns b"" (end of file) when its end closes.
        while True:
            try:
                if not os.read(fd, 1):
                    break
            except OSError:
                break
        end(grace_s)

    threading.Thread(target=wait_for_the_parent, name="lifeline", daemon=True).start()


def end(grace_s: float) -> None:
    """SIGTERM to this process's group if it leads one (its helpers go with it), else to itself; after `grace_s`,
    SIGKILL to the same. Not to a group it merely belongs to: that is its parent's."""
    leads_group = os.getpgrp() == os.getpid()

    def send(signum: int) -> None:
        if leads_group:
            os.killpg(os.getpgrp(), signum)
        else:
            os.kill(os.getpid(), signum)

    if grace_s > 0:
        send(signal.SIGTERM)
        time.sleep(grace_s)
    send(signal.SIGKILL)


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[2] != "-m":
        raise SystemExit(USAGE)
    fd, grace_s, module, args = int(argv[0]), float(argv[1]), argv[3], argv[4:]
    # Not handed on to the child's own children: each of those gets a lifeline from this process if it needs one.
    os.set_inheritable(fd, False)
    watch(fd, grace_s)
    # As `python -m`: the working directory first on the path, not this file's folder (unless -P asked for neither).
    if not getattr(sys.flags, "safe_path", False):
        sys.path[0] = str(Path.cwd())
    sys.argv = [module, *args]  # run_module puts the module's file in argv[0]
    # alter_sys: the module is __main__ in sys.modules while it runs, so multiprocessing's spawn finds it by name.
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
