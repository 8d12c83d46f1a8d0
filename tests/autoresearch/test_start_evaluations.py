"""Where RL starts from the base model, its evaluation is made once per folder of runs: by the first run that needs
it, read by the others, on the tiny model against a real backend."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from autoresearch.trials import rl_loop
from autoresearch.trials.config import TrialConfig
from autoresearch.trials.rl_loop import run_trial
from autoresearch.trials.run_dir import RunDirectory
from autoresearch.trials.start_evaluations import StartEvaluations
from tasks.report import HeldOutReport


def report(accuracy: float) -> HeldOutReport:
    return HeldOutReport.of([], "dev", ["easy"]).model_copy(update={"accuracy": accuracy})


def test_runs_that_start_together_evaluate_once_and_other_settings_evaluate_apart(
    tiny_trial_config: TrialConfig, tmp_path: Path
) -> None:
    shared = StartEvaluations(tmp_path)
    made: list[float] = []

    def evaluate() -> HeldOutReport:
        time.sleep(0.2)  # long enough for the other thread to arrive while this one evaluates
        made.append(0.5)
        return report(0.5)

    got: list[HeldOutReport] = []
    threads = [
        threading.Thread(target=lambda: got.append(shared.get_or_evaluate(tiny_trial_config, evaluate)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert made == [0.5] and [r.accuracy for r in got] == [0.5, 0.5]
    # The learning rate does not change the base model's answers; the answer length does.
    same = tiny_trial_config.model_copy(update={"learning_rate": 1e-2})
    assert shared.get_or_evaluate(same, lambda: report(0.9)).accuracy == 0.5
    longer = tiny_trial_config.model_copy(update={"max_tokens": tiny_trial_config.max_tokens + 8})
    assert shared.get_or_evaluate(longer, lambda: report(0.9)).accuracy == 0.9
    # A report that cannot be read is made again, not trusted.
    shared.path_of(tiny_trial_config).write_text("{not json")
    assert shared.get_or_evaluate(tiny_trial_config, lambda: report(0.25)).accuracy == 0.25


def test_a_second_trial_in_the_folder_reads_the_base_models_evaluation_where_rl_starts(
    tiny_trial_config: TrialConfig, backend_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    evaluated_steps: list[int] = []
    evaluate = rl_loop.evaluate_sampler

    def counted(*args: object) -> HeldOutReport:
        made = evaluate(*args)
        evaluated_steps.append(made.step)
        return made

    monkeypatch.setattr(rl_loop, "evaluate_sampler", counted)
    config = tiny_trial_config.model_copy(update={"share_start_evaluation": True, "steps": 1, "warmup_steps": 0})
    for run_id in ("first", "second"):
        run_trial(config.model_copy(update={"run_id": run_id}), backend_url, tmp_path, progress=False)
    assert evaluated_steps == [0, 1, 1]
    first, second = (RunDirectory(tmp_path / run_id).evals.read() for run_id in ("first", "second"))
    assert first[0] == second[0] and first[0]["step"] == 0
    # A trial that does not share, or starts from a warm-up, evaluates where its RL starts itself.
    own = config.model_copy(update={"run_id": "own", "share_start_evaluation": False})
    warmed = config.model_copy(update={"run_id": "warmed", "warmup_steps": 1})
    for other in (own, warmed):
        run_trial(other, backend_url, tmp_path, progress=False)
    assert evaluated_steps == [0, 1, 1, 0, 1, 0, 1]
