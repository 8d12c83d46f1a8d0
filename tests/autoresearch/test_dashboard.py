"""optuna-dashboard shows a study as the controller leaves it: trials with their rationale, and the analysis note.

A real dashboard on loopback, read by headless Chromium (Debian's `chromium`; .ci/run installs it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import optuna
import pytest
from optuna_dashboard import save_note
from support.loopback import free_port

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    # Lets the single-page app fetch and render the study before the DOM is dumped.
    "--virtual-time-budget=15000",
]


def rendered(url: str, profile: Path) -> str:
    command = [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", url]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout


@pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("REQUIRE_CHROMIUM"),
    reason="needs Chromium (apt-get install chromium); .ci/run installs it and requires this test to run",
)
def test_the_dashboard_shows_the_trials_rationales_and_the_note(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="dashboard-check", storage=storage, direction="maximize")
    for number, rationale in enumerate(["PPO with a format bonus", "a lower learning rate"]):
        trial = study.ask({"learning_rate": optuna.distributions.FloatDistribution(1e-5, 1e-2, log=True)})
        trial.set_user_attr("rationale", rationale)
        study.tell(trial, 0.1 * number)
    save_note(study, "**Round 1.** Lower learning rates held their held-out accuracy better.")

    port = free_port()
    dashboard = subprocess.Popen(
        # The console script users run, from this environment.
        [str(Path(sys.executable).parent / "optuna-dashboard"), storage, "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{port}/dashboard/studies/{study._study_id}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(base, timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert dashboard.poll() is None and time.monotonic() < deadline, "the dashboard did not start"
            time.sleep(0.2)
        trials_page = rendered(f"{base}/trials", tmp_path / "profile-trials")
        note_page = rendered(f"{base}/note", tmp_path / "profile-note")
    finally:
        dashboard.terminate()
        dashboard.wait(10)
    assert "Trial 0" in trials_page and "Trial 1" in trials_page
    assert "PPO with a format bonus" in trials_page  # the selected trial's user attributes
    assert "Lower learning rates held their held-out accuracy better." in note_page
