"""Each trial's share of the device: a trial's runs carry its run id, the backend's status lists them with their
device time, and the controller's live table shows the figure beside each trial."""

from __future__ import annotations

from pathlib import Path

import httpx
import optuna
import pytest
import tinker
from rich.console import Console
from support.backends import TINY
from support.loopback import free_port
from tinker import types

from autoresearch.device_share import DeviceUse, device_use_by_trial
from autoresearch.trials.backend import TRIAL_METADATA_KEY, api_key
from autoresearch.trials.config import TrialConfig
from autoresearch.trials.rl_loop import run_trial
from autoresearch.view import trials_table

PROMPT = types.ModelInput.from_ints([5, 9, 14, 3])


def train_once(client: tinker.ServiceClient, metadata: dict[str, str] | None) -> None:
    training = client.create_lora_training_client(base_model=TINY, rank=4, user_metadata=metadata).result()
    datum = types.Datum(model_input=PROMPT, loss_fn_inputs={"target_tokens": [9, 14, 3, 2]})
    training.forward_backward([datum], "cross_entropy").result()


def status_runs(backend_url: str) -> list[dict]:
    """The runs the backend's status lists for the trials' key."""
    return httpx.get(f"{backend_url}/api/v1/status", headers={"X-API-Key": api_key()}, timeout=10).json()["runs"]


def test_a_trials_runs_are_summed_under_its_run_id(backend_url: str) -> None:
    with tinker.ServiceClient(base_url=backend_url, api_key=api_key()) as client:
        # A trial that was resumed has a run per start.
        for trial in ("share-0000", "share-0000", "share-0001"):
            train_once(client, {TRIAL_METADATA_KEY: trial})
        train_once(client, None)
    runs = status_runs(backend_url)
    found = device_use_by_trial([backend_url], api_key())
    for trial, starts in (("share-0000", 2), ("share-0001", 1)):
        mine = [run for run in runs if (run["user_metadata"] or {}).get(TRIAL_METADATA_KEY) == trial]
        assert len(mine) == starts
        assert found[trial].seconds == pytest.approx(sum(run["device_seconds"] for run in mine))
        assert found[trial].seconds > 0 and found[trial].share_1m > 0
        # Every request has finished: nothing of the trial's is open on the device.
        assert found[trial].open_requests == 0 == sum(run["open_requests"] for run in mine)


def test_a_trial_tells_the_backend_its_run_id(tiny_trial_config: TrialConfig, backend_url: str, tmp_path: Path) -> None:
    config = tiny_trial_config.model_copy(
        update={"run_id": "share-trial", "steps": 1, "warmup_steps": 0, "eval_interval": 0, "eval_size": 1}
    )
    run_trial(config, backend_url, tmp_path, progress=False)
    assert device_use_by_trial([backend_url], api_key())["share-trial"].seconds > 0


def test_a_backend_that_does_not_answer_leaves_its_trials_without_a_figure() -> None:
    assert device_use_by_trial([f"http://127.0.0.1:{free_port()}"], api_key(), timeout_s=1.0) == {}


def test_the_live_table_shows_each_trials_share_of_the_device() -> None:
    study = optuna.create_study(study_name="shares")
    for number in range(2):
        study.ask().set_user_attr("run_id", f"shares-{number:04d}")
    console = Console(record=True, width=300)
    console.print(trials_table(study, {"shares-0000": DeviceUse(share_1m=0.37, seconds=12.4)}))
    rows = [line for line in console.export_text().splitlines() if "running" in line]
    assert "37% (12 s)" in rows[0] and "%" not in rows[1]
