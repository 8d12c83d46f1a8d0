"""Processes for tests/lifeline: `python -m support.tethered parent|child <folder> [options]`.

The parent starts a child (with the options in --child) through `lifeline.popen`, writes `parent.json` (its pid,
the child's), and sleeps until killed. The child writes `child.json` (its pid, and its own child's with
--grandchild), and sleeps; with --on-sigterm cleanup it writes `cleaned` on SIGTERM and exits, with --on-sigterm
ignore it ignores SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import lifeline

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


def run_parent(folder: Path, options: argparse.Namespace) -> None:
    child = lifeline.popen(
        [sys.executable, "-m", "support.tethered", "child", str(folder), *options.child.split()],
        grace_s=options.grace,
        start_new_session=options.new_session,
        # Any preexec_fn makes subprocess run the fork hooks in the child before its exec.
        preexec_fn=(lambda: None) if options.preexec else None,
    )
    forked = None
    if options.fork:
        # A process forked without exec holds a copy of everything this one had open; the lifeline must not count it.
        forked = os.fork()
        if forked == 0:
            time.sleep(600)
            os._exit(0)
    report = {"pid": os.getpid(), "child": child.pid, "forked": forked}
    (folder / "parent.json").write_text(json.dumps(report))
    if options.stop_child:
        while not (folder / "child.json").exists():
            time.sleep(0.01)
        (folder / "stopped.json").write_text(json.dumps({"status": lifeline.stop(child, grace_s=options.grace)}))
    time.sleep(600)


def run_child(folder: Path, options: argparse.Namespace) -> None:
    if options.on_sigterm == "cleanup":

        def clean_up(_signum: int, _frame: object) -> None:
            (folder / "cleaned").write_text("yes")
            raise SystemExit(0)

        signal.signal(signal.SIGTERM, clean_up)
    elif options.on_sigterm == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    grandchild = subprocess.Popen(SLEEP) if options.grandchild else None
    report = {"pid": os.getpid(), "grandchild": grandchild and grandchild.pid, "group": os.getpgrp()}
    (folder / "child.json").write_text(json.dumps(report))
    time.sleep(600)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["parent", "child"])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--grace", type=float, default=0.0)
    parser.add_argument("--new-session", action="store_true")
    parser.add_argument("--preexec", action="store_true")
    parser.add_argument("--fork", action="store_true")
    parser.add_argument("--stop-child", action="store_true")
    parser.add_argument("--grandchild", action="store_true")
    parser.add_argument("--on-sigterm", choices=["default", "cleanup", "ignore"], default="default")
    parser.add_argument("--child", default="", help="the child's options, in one argument")
    options = parser.parse_args()
    (run_parent if options.role == "parent" else run_child)(options.folder, options)


if __name__ == "__main__":
    main()
