"""The controller as the cluster schedules it: the CronJob's own command, run twice in a row against the same
storage, continues one study — the second run launches what the first left of the budget, and nothing twice.

With SQLite (a single machine) and with PostgreSQL (the cluster's store, where the controller's LangGraph
checkpoints live in the same database as the study).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import optuna
import psycopg
import pytest
import yaml
from optuna.trial import TrialState
from support.postgres_server import postgres_bin, postgres_server

from autoresearch.trials.start_evaluations import FOLDER_NAME

ROOT = Path(__file__).resolve().parents[2]
CRONJOB = ROOT / "k8s" / "base" / "autoresearch-cronjob.yaml"


def cronjob_command(spec_path: Path, run_root: Path) -> list[str]:
    """The controller container's command from the CronJob manifest, with its mounts swapped for local folders."""
    cronjob = yaml.safe_load(CRONJOB.read_text())
    (container,) = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    command = container["command"]
    assert command[:3] == ["python", "-m", "autoresearch"]
    spec_arg = command[3]
    assert spec_arg.startswith(mounts["specs"] + "/") and command[command.index("--run-root") + 1] == mounts["runs"]
    swapped = {"python": sys.executable, spec_arg: str(spec_path), mounts["runs"]: str(run_root)}
    return [swapped.get(arg, arg) for arg in command]


@pytest.fixture(params=["sqlite", "postgresql"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'optuna.db'}"
        return
    if postgres_bin() is None and not os.environ.get("REQUIRE_POSTGRES"):
        pytest.skip("no PostgreSQL binaries (initdb) on this machine")
    with postgres_server() as url:
        # As in the cluster: the password comes from the environment, never from the spec file.
        yield url.replace("optuna@", "optuna:${POSTGRES_PASSWORD}@")


def test_the_cronjob_command_run_twice_continues_one_study(backend_url: str, storage: str, tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "experiments" / "text2sql_tiny.yaml").read_text())
    data.update(
        backend=backend_url,
        storage=storage,
        pruning={"kind": "none"},
        # The first run launches two trials, then is out of time: it waits for them and stops, as a tick would.
        budget={"trials": 3, "concurrency": 2, "steps_per_trial": 1, "trial_time_limit_s": 300, "run_time_limit_s": 3},
    )
    spec_path = tmp_path / "specs" / "tiny.yaml"
    spec_path.parent.mkdir()
    spec_path.write_text(yaml.safe_dump(data))
    command = cronjob_command(spec_path, tmp_path / "runs")
    env = {**os.environ, "POSTGRES_PASSWORD": "unused-with-trust-auth", "TINKER_TELEMETRY": "0"}
    url = storage.replace("${POSTGRES_PASSWORD}", env["POSTGRES_PASSWORD"])

    first = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    study = optuna.load_study(study_name=data["study"], storage=url)
    assert [t.state for t in study.get_trials(deepcopy=False)] == [TrialState.COMPLETE] * 2

    second = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    assert [s.study_name for s in optuna.get_all_study_summaries(url)] == [data["study"]]
    trials = optuna.load_study(study_name=data["study"], storage=url).get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3
    assert [t.user_attrs["run_id"] for t in trials] == [f"{data['study']}-{i:04d}" for i in range(3)]
    trial_dirs = sorted(
        p.name for p in (tmp_path / "runs" / data["study"] / "trials").iterdir() if p.name != FOLDER_NAME
    )
    assert trial_dirs == [t.user_attrs["run_id"] for t in trials]

    if storage.startswith("postgresql"):
        # The controller's checkpoints went to the study's database, not to a file on the (ephemeral) pod disk.
        assert not list((tmp_path / "runs").rglob("*.sqlite3"))
        with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as connection:
            threads = connection.execute("SELECT DISTINCT thread_id FROM checkpoints").fetchall()
        assert threads == [(data["study"],)]
    else:
        assert (tmp_path / "runs" / data["study"] / "controller.sqlite3").exists()
