"""A backend killed in the middle of a trial's forward_backward and started again on the same storage: the trial,
run by hand as a user would (`python -m autoresearch.trials`), goes on from its last checkpoint and finishes, with
every step logged once, and the request the kill cut off failed by name."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from support.backends import start_backend_process
from support.loopback import free_port

from autoresearch.trials.run_dir import RunDirectory

ROOT = Path(__file__).parents[2]
STEPS = 6
# The trial gets one torch thread, as the backend does (support.backends).
ENVIRONMENT = {k: v for k, v in os.environ.items() if k != "TINKER_BASE_URL"} | {"OMP_NUM_THREADS": "1"}


def unfinished_forward_backward(ledger: Path) -> str | None:
    """The request id of a forward_backward the backend has accepted and not finished, if there is one now."""
    with sqlite3.connect(f"file:{ledger}?mode=ro", uri=True) as db:
        row = db.execute(
            "SELECT request_id FROM futures WHERE kind = 'forward_backward' AND state IN ('queued', 'running')"
        ).fetchone()
    return None if row is None else row[0]


def kill_mid_forward_backward(server: subprocess.Popen, directory: RunDirectory, ledger: Path, trial) -> str:
    """SIGKILL the backend while one of the trial's RL forward_backwards (after its first RL checkpoint) is
    unfinished; returns that request's id. The backend is stopped (SIGSTOP) before the check that decides, so it
    cannot finish the request between the check and the kill."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        assert trial.poll() is None, "the trial ended before the backend could be killed"
        state = directory.load_state()
        if state is not None and state.step >= 2 and unfinished_forward_backward(ledger) is not None:
            server.send_signal(signal.SIGSTOP)
            request_id = unfinished_forward_backward(ledger)
            if request_id is not None:
                server.kill()
                server.wait()
                return request_id
            server.send_signal(signal.SIGCONT)
        time.sleep(0.002)
    raise AssertionError("no forward_backward was caught in flight")


@pytest.mark.slow
def test_a_trial_survives_a_backend_killed_mid_forward_backward(tmp_path: Path) -> None:
    storage_root = tmp_path / "backend"
    port = free_port()
    config = yaml.safe_load((ROOT / "experiments/trials/text2sql_tiny.yaml").read_text())
    config |= {"steps": STEPS, "checkpoint_interval": 2, "eval_interval": 0}
    config_path = tmp_path / "trial.yaml"
    config_path.write_text(yaml.safe_dump(config))
    directory = RunDirectory(tmp_path / "runs" / "killed")
    ledger = storage_root / "ledger.sqlite3"

    server = start_backend_process(storage_root, port)
    command = [
        sys.executable, "-m", "autoresearch.trials", str(config_path), "--backend-url", f"http://127.0.0.1:{port}",
        "--run-dir", str(tmp_path / "runs"), "--run-id", "killed", "--no-progress",
    ]  # fmt: skip
    trial = subprocess.Popen(command, cwd=ROOT, env=ENVIRONMENT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        cut_off = kill_mid_forward_backward(server, directory, ledger, trial)
        server = start_backend_process(storage_root, port)
        stdout, stderr = trial.communicate(timeout=300)
    finally:
        trial.kill()
        server.terminate()
        server.wait(30)

    assert trial.returncode == 0, stderr.decode()[-3000:]
    assert f"run killed: {STEPS} steps" in stdout.decode()
    assert "the backend was interrupted 1 time(s)" in stdout.decode(), stdout.decode()
    # Steps after the checkpoint were redone, and logged once: none counted twice, none lost.
    assert [m["step"] for m in directory.metrics.read()] == list(range(1, STEPS + 1))
    result = json.loads(directory.result_path.read_text())
    assert result["steps_completed"] == STEPS and result["backend_interruptions"] == 1
    with sqlite3.connect(ledger) as db:
        state, error = db.execute("SELECT state, error FROM futures WHERE request_id = ?", (cut_off,)).fetchone()
    assert state == "failed" and "the server restarted" in error
    # The resume trained on in a new run; once it had saved, the killed run's training states were deleted (each
    # interruption would otherwise leave a run's worth of checkpoints against the key's storage).
    runs_with_states = {p.parent.parent.name for p in (storage_root / "checkpoints" / "runs").glob("*/weights/*")}
    final_run = result["checkpoint_path"].removeprefix("tinker://").split("/")[0]
    assert runs_with_states == {final_run.replace(":", "__")}
    assert directory.load_state().left_behind == ()
