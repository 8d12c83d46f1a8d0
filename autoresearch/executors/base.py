"""What the controller needs from wherever trials run: launch a run id, tell how it is doing, stop it.

A trial's progress is read from its run directory (the trial runner's own files: evaluations, result), which the
controller sees on its own disk or, in a cluster, on a volume it shares with the trial pods.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol

import yaml

from autoresearch.errors import ExecutorError
from autoresearch.trials.config import TrialConfig
from autoresearch.trials.run_dir import RunDirectory, TrialResult
from tasks.report import HeldOutReport

LAUNCH_CONFIG = "launch.yaml"

log = logging.getLogger(__name__)


class TrialPhase(StrEnum):
    NOT_STARTED = "not_started"
    RUNNING = "running"
    FINISHED = "finished"
    # Gone without a result, for a reason a relaunch may get past (killed, deleted): a relaunch resumes it.
    DIED = "died"
    # Ended without a result for a reason a relaunch would not fix (a deadline, a failure past its retries).
    FAILED = "failed"


@dataclass(frozen=True)
class TrialStatus:
    phase: TrialPhase
    # The held-out evaluations by RL step, as the trial made them so far.
    evaluations: dict[int, HeldOutReport]
    # The trial's result (its result.json): there exactly when the phase is FINISHED.
    result: TrialResult | None = None
    # Why a trial died or failed.
    failure: str | None = None
    started_at: float | None = None


class TrialExecutor(Protocol):
    """Runs trials somewhere and reports on them by run id. `launch` is idempotent: a run id that runs or finished
    is left alone, and one that died is started again, which resumes it from its last checkpoint."""

    # The folder every run's directory is in, `<run_root>/<run_id>/`, on a volume the trials share.
    run_root: Path

    def launch(self, run_id: str, config: TrialConfig, backend_url: str) -> None: ...

    def status(self, run_id: str) -> TrialStatus: ...

    def stop(self, run_id: str) -> None: ...


def stop_or_warn(executor: TrialExecutor, run_id: str) -> None:
    """Stop a run; an executor that does not answer is logged, not raised: the caller goes on to fail the run."""
    try:
        executor.stop(run_id)
    except ExecutorError as error:
        log.warning("could not stop %s: %s", run_id, error)


@dataclass(frozen=True)
class Progress:
    """What a trial's run directory says so far."""

    evaluations: dict[int, HeldOutReport]
    result: TrialResult | None


def read_progress(root: Path) -> Progress:
    directory = RunDirectory(root)
    evaluations = {int(e["step"]): HeldOutReport.model_validate(e) for e in directory.evals.read()}
    return Progress(evaluations, directory.read_result())


def write_launch_config(root: Path, config: TrialConfig) -> Path:
    """The config a trial is launched with, beside its run files, for `python -m autoresearch.trials` to read."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / LAUNCH_CONFIG
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    return path


def trial_command(python: str, config_path: Path, backend_url: str, run_root: Path, run_id: str) -> list[str]:
    """The command line of one trial, the same wherever it runs."""
    return [
        python, "-m", "autoresearch.trials", str(config_path), "--backend-url", backend_url,
        "--run-dir", str(run_root), "--run-id", run_id, "--no-progress",
    ]  # fmt: skip
