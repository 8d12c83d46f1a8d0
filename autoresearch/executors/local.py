"""Trials as subprocesses of this machine (`python -m autoresearch.trials`), each in `<run_root>/<run_id>/`.

A trial ends with the controller that started it, however the controller ends (`lifeline`). The state of a trial is
read from its run directory and a pid file beside it, so a controller started again finds its trials finished or
dead; a trial whose process died is started again with the same run id, which resumes it from its last checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import lifeline
from autoresearch.executors.base import TrialPhase, TrialStatus, read_progress, trial_command, write_launch_config
from autoresearch.trials.config import TrialConfig

PID_FILE = "trial.pid"
LOG_FILE = "trial.log"
# How long a trial gets to end on SIGTERM before SIGKILL.
STOP_GRACE_S = 30.0


class LocalExecutor:
    """Trials as subprocesses of this machine, each in `<run_root>/<run_id>/`."""

    def __init__(self, run_root: Path, python: str = sys.executable) -> None:
        self.run_root = run_root
        self.python = python
        self._children: dict[str, subprocess.Popen] = {}

    def launch(self, run_id: str, config: TrialConfig, backend_url: str) -> None:
        """Start the trial unless it runs or finished already; a trial that died resumes from its checkpoint."""
        phase = self.status(run_id).phase
        if phase in (TrialPhase.RUNNING, TrialPhase.FINISHED):
            return
        root = self.run_root / run_id
        config_path = write_launch_config(root, config)
        command = trial_command(self.python, config_path, backend_url, self.run_root, run_id)
        with (root / LOG_FILE).open("a") as log:
            # Its own session, so that stopping it ends what it started too; on a lifeline, so that it ends with this
            # process, also one killed outright.
            process = lifeline.popen(
                command,
                grace_s=STOP_GRACE_S,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._children[run_id] = process
        launched = {"pid": process.pid, "started_at": time.time(), "start_ticks": _start_ticks(process.pid)}
        (root / PID_FILE).write_text(json.dumps(launched))

    def status(self, run_id: str) -> TrialStatus:
        root = self.run_root / run_id
        progress = read_progress(root)
        evaluations = progress.evaluations
        if progress.result is not None:
            return TrialStatus(TrialPhase.FINISHED, evaluations, result=progress.result)
        launched = _read_pid(root)
        if launched is None:
            return TrialStatus(TrialPhase.NOT_STARTED, evaluations)
        pid, started_at, start_ticks = launched
        if self._alive(run_id, pid, start_ticks):
            return TrialStatus(TrialPhase.RUNNING, evaluations, started_at=started_at)
        # It may have written its result and exited between the first look and this one.
        result = read_progress(root).result
        if result is not None:
            return TrialStatus(TrialPhase.FINISHED, evaluations, result=result)
        log = root / LOG_FILE
        tail = log.read_text(errors="replace")[-2000:].strip() if log.exists() else ""
        failure = "the trial process exited without a result" + (
            f"; its log ends:\n{tail}" if tail else ", and wrote nothing"
        )
        return TrialStatus(TrialPhase.DIED, evaluations, failure=failure, started_at=started_at)

    def stop(self, run_id: str) -> None:
        """Stop a running trial (pruned or over its time limit); its checkpoints stay."""
        launched = _read_pid(self.run_root / run_id)
        if launched is None or not self._alive(run_id, launched[0], launched[2]):
            return
        child = self._children.get(run_id)
        if child is not None and child.pid == launched[0]:
            lifeline.stop(child, grace_s=STOP_GRACE_S)
        else:
            os.killpg(launched[0], signal.SIGTERM)

    def _alive(self, run_id: str, pid: int, start_ticks: int | None) -> bool:
        child = self._children.get(run_id)
        if child is not None and child.pid == pid:
            return child.poll() is None
        # A trial started by an earlier controller: alive if a process with that pid runs and started when the trial
        # did (Linux's /proc; the start time also tells a reused pid apart). Elsewhere: if the pid exists at all.
        if start_ticks is not None:
            return _start_ticks(pid) == start_ticks
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True


def _start_ticks(pid: int) -> int | None:
    """When a live (not zombie) process started, in clock ticks since boot; None without /proc or process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the command name, which is in parentheses and may contain anything: state is the first of
    # them, the start time the twentieth.
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _read_pid(root: Path) -> tuple[int, float, int | None] | None:
    try:
        data = json.loads((root / PID_FILE).read_text())
    except (OSError, ValueError):
        return None
    return int(data["pid"]), float(data["started_at"]), data.get("start_ticks")
