"""benchmarks.learning_curves: held-out accuracy against the completions a run had sampled, from its run directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoresearch.trials.config import TrialConfig, load_trial_config
from autoresearch.trials.run_dir import RunDirectory
from benchmarks.learning_curves import curve_of, main
from tasks.report import HeldOutAnswer, HeldOutReport

TINY_CONFIG = Path(__file__).parents[2] / "experiments" / "trials" / "text2sql_tiny.yaml"


def logged_run(root: Path, config: TrialConfig, right_by_step: dict[int, int], questions: int = 4) -> Path:
    directory = RunDirectory(root)
    root.mkdir(parents=True)
    directory.check_config(config)
    for step, right in right_by_step.items():
        answers = [
            HeldOutAnswer(example_id=f"q{i}", difficulty="easy", completion="SELECT 1", correct=i < right)
            for i in range(questions)
        ]
        directory.evals.append(HeldOutReport.of(answers, "dev", ["easy"], step=step).model_dump(mode="json"))
    return root


def test_a_runs_curve_counts_the_completions_it_sampled_and_each_points_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny_trial_config = load_trial_config(TINY_CONFIG)
    wide = tiny_trial_config.model_copy(update={"batch_size": 4, "group_size": 2})
    run = logged_run(tmp_path / "wide", wide, {0: 1, 10: 2, 20: 3})
    curve = curve_of(f"wide={run}")
    assert [(p.step, p.samples, p.accuracy) for p in curve.points] == [(0, 0, 0.25), (10, 80, 0.5), (20, 160, 0.75)]
    assert curve.points[1].standard_error == pytest.approx(0.25)  # sqrt(0.5 * 0.5 / 4)
    narrow = logged_run(tmp_path / "narrow", tiny_trial_config, {0: 1, 5: 4})
    figure = tmp_path / "curves.png"
    assert main([f"wide={run}", str(narrow), "--out", str(figure)]) == 0
    assert figure.stat().st_size > 0
    records = json.loads(next(line for line in capsys.readouterr().out.splitlines() if line.startswith("{")))
    per_step = tiny_trial_config.batch_size * tiny_trial_config.group_size
    assert [p["samples"] for p in records["narrow"]] == [0, 5 * per_step]
    assert main([str(tmp_path / "absent")]) == 2
