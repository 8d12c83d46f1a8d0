"""Trials as local subprocesses against a real backend: launched once, found again, stopped, resumed."""

from __future__ import annotations

import json
from pathlib import Path

from support.trial_phases import wait_for_phase

from autoresearch.executors.local import PID_FILE, LocalExecutor, TrialPhase
from autoresearch.trials.config import TrialConfig


def test_a_trial_runs_to_its_result_and_launching_again_does_nothing(
    backend_url: str, tiny_trial_config: TrialConfig, tmp_path: Path
) -> None:
    executor = LocalExecutor(tmp_path)
    assert executor.status("first").phase is TrialPhase.NOT_STARTED
    executor.launch("first", tiny_trial_config, backend_url)
    launched = (tmp_path / "first" / PID_FILE).read_text()
    # A second controller (after a restart) sees the same trial running and does not start it twice.
    assert LocalExecutor(tmp_path).status("first").phase in (TrialPhase.RUNNING, TrialPhase.FINISHED)
    executor.launch("first", tiny_trial_config, backend_url)
    assert (tmp_path / "first" / PID_FILE).read_text() == launched

    done = wait_for_phase(executor, "first", {TrialPhase.FINISHED, TrialPhase.DIED})
    assert done.phase is TrialPhase.FINISHED, done.failure
    assert done.result.run_id == "first" and 0.0 <= done.result.held_out_accuracy <= 1.0
    assert set(done.evaluations) == {0, 2, 3}
    executor.launch("first", tiny_trial_config, backend_url)
    assert (tmp_path / "first" / PID_FILE).read_text() == launched


def test_a_stopped_trial_is_reported_dead_and_a_relaunch_finishes_it(
    backend_url: str, tiny_trial_config: TrialConfig, tmp_path: Path
) -> None:
    executor = LocalExecutor(tmp_path)
    executor.launch("stopped", tiny_trial_config, backend_url)
    wait_for_phase(executor, "stopped", {TrialPhase.RUNNING})
    executor.stop("stopped")
    died = executor.status("stopped")
    assert died.phase is TrialPhase.DIED and died.failure

    executor.launch("stopped", tiny_trial_config, backend_url)
    done = wait_for_phase(executor, "stopped", {TrialPhase.FINISHED, TrialPhase.DIED})
    assert done.phase is TrialPhase.FINISHED, done.failure
    assert json.loads((tmp_path / "stopped" / "result.json").read_text())["steps_completed"] == tiny_trial_config.steps
