"""Real trials on the tiny model against a real backend on loopback, driven only through the Tinker API."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tinker
from support.trained_adapters import trained_adapter

from autoresearch.errors import ConfigurationError
from autoresearch.trials.backend import api_key
from autoresearch.trials.config import InitialState, TrialConfig
from autoresearch.trials.evaluation import evaluate_checkpoint
from autoresearch.trials.paired import compare
from autoresearch.trials.rl_loop import run_trial
from autoresearch.trials.run_dir import RunDirectory
from tasks.report import HeldOutReport
from tasks.text2sql.dataset import Text2SqlDataset
from tasks.text2sql.reward.rewards import DEFAULT_REWARD_SPEC
from tasks.text2sql.reward.scoring import Scorer
from tasks.text2sql.task import Text2SqlTask

STEP_KEYS = {
    "step",
    "reward_mean",
    "reward_std",
    "accuracy",
    "groups_kept",
    "datums",
    "loss",
    "kl",
    "completion_tokens_mean",
    "tokens_per_s",
    "step_time_s",
    "turns_mean",
    "reward/execution_match",
    "reward/length_penalty",
}


class KilledError(Exception):
    """Stands for the process dying in the middle of a step."""


def assert_scored_by_the_matcher(report: HeldOutReport, scorer: Scorer, bundled: Text2SqlDataset) -> None:
    examples = {e.id: e for e in bundled.split(report.split)}
    items = [(examples[a.example_id], a.completion) for a in report.answers]
    expected = [score.correct for score in scorer.score_many(items, DEFAULT_REWARD_SPEC)]
    assert [a.correct for a in report.answers] == expected
    assert report.accuracy == sum(expected) / len(expected)
    assert 0.0 <= report.accuracy <= 1.0


def test_a_trial_trains_evaluates_checkpoints_and_plots(
    tiny_trial_config: TrialConfig,
    backend_url: str,
    tmp_path: Path,
    scorer: Scorer,
    bundled: Text2SqlDataset,
    text2sql: Text2SqlTask,
) -> None:
    config = tiny_trial_config.model_copy(update={"run_id": "complete"})
    reports: list[HeldOutReport] = []

    def keep_going(report: HeldOutReport) -> bool:
        reports.append(report)
        return True

    result = run_trial(config, backend_url, tmp_path, progress=False, on_eval=keep_going)

    directory = RunDirectory(tmp_path / "complete")
    metrics = directory.metrics.read()
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(set(m) == STEP_KEYS for m in metrics)
    assert any(m["datums"] > 0 for m in metrics)
    assert all((m["loss"] is None) == (m["datums"] == 0) and m["kl"] is None for m in metrics)
    assert [w["step"] for w in directory.warmup.read()] == [1]

    # Evaluated where RL starts, every 2 steps and at the end, each time through the task's matcher; the callback
    # judges only evaluations after RL steps.
    assert [r.step for r in reports] == [2, 3]
    assert [e["step"] for e in directory.evals.read()] == [0, 2, 3]
    for report in reports:
        assert len(report.answers) == config.eval_size
        assert_scored_by_the_matcher(report, scorer, bundled)
    assert result.held_out_accuracy == reports[-1].accuracy
    starting_accuracy = directory.evals.read()[0]["accuracy"]
    assert result.held_out_history == {0: starting_accuracy, 2: reports[0].accuracy, 3: reports[1].accuracy}
    # What RL did is the evaluation where it started against the last one, on the same questions.
    assert result.rl_comparison == compare(HeldOutReport.model_validate(directory.evals.read()[0]), reports[-1])

    state = directory.load_state()
    assert state is not None and state.finished and state.step == 3
    assert state.data_position == config.warmup_steps * config.warmup_batch_size + 3 * config.batch_size
    assert result.checkpoint_path == state.checkpoint_path and result.checkpoint_path.endswith("/weights/step-000003")
    assert result.steps_completed == 3 and not result.stopped_early and result.resumed_from_step is None
    assert directory.plot_path.read_bytes().startswith(b"\x89PNG")
    assert json.loads(directory.result_path.read_text())["held_out_accuracy"] == result.held_out_accuracy

    # The controller's standalone evaluation of the final weights answers as the trial's last evaluation did.
    again = evaluate_checkpoint(config, backend_url, model_path=result.sampler_path, task=text2sql)
    assert [a.completion for a in again.answers] == [a.completion for a in reports[-1].answers]

    # Finished: asking again returns the stored result without touching a backend.
    assert run_trial(config, "http://127.0.0.1:9", tmp_path, progress=False) == result


def test_a_restarted_trial_resumes_from_its_last_checkpoint(
    tiny_trial_config: TrialConfig, backend_url: str, tmp_path: Path
) -> None:
    config = tiny_trial_config.model_copy(
        update={"run_id": "resumed", "steps": 4, "warmup_steps": 0, "checkpoint_interval": 2, "eval_interval": 3}
    )

    def die_at_step_3(report: HeldOutReport) -> bool:
        raise KilledError(f"killed after step {report.step}")

    with pytest.raises(KilledError):
        run_trial(config, backend_url, tmp_path, progress=False, on_eval=die_at_step_3)
    directory = RunDirectory(tmp_path / "resumed")
    before = directory.metrics.path.read_text().splitlines()
    assert [json.loads(line)["step"] for line in before] == [1, 2, 3]
    state = directory.load_state()
    assert state is not None and state.step == 2 and not state.finished
    assert state.data_position == 2 * config.batch_size and state.checkpoint_path.endswith("/weights/step-000002")

    evaluated: list[int] = []

    def keep_going(report: HeldOutReport) -> bool:
        evaluated.append(report.step)
        return True

    result = run_trial(config, backend_url, tmp_path, progress=False, on_eval=keep_going)
    after = directory.metrics.path.read_text().splitlines()
    assert result.resumed_from_step == 2 and result.steps_completed == 4
    # Steps 1 and 2 were not redone: their lines are untouched. Step 3 ran again, once, on the same prompts.
    assert after[:2] == before[:2]
    assert [json.loads(line)["step"] for line in after] == [1, 2, 3, 4]
    assert evaluated == [3, 4]
    assert json.loads(after[2])["reward_mean"] == pytest.approx(json.loads(before[2])["reward_mean"])

    # Finished, but asked for one step more: it trains on from the final checkpoint.
    longer = run_trial(config.model_copy(update={"steps": 5}), backend_url, tmp_path, progress=False)
    assert longer.resumed_from_step == 4 and longer.steps_completed == 5
    assert [m["step"] for m in directory.metrics.read()] == [1, 2, 3, 4, 5]


def test_a_trial_stopped_during_an_evaluation_resumes_at_that_evaluation_without_redoing_its_step(
    tiny_trial_config: TrialConfig, backend_url: str, tmp_path: Path
) -> None:
    """An evaluation may take as long as many steps (a 1.5B's of 400 questions, half an hour on a CPU): a trial
    stopped during one resumes at it, from that step's checkpoint, recorded before the evaluation began."""
    config = tiny_trial_config.model_copy(
        update={"run_id": "mid-eval", "steps": 3, "warmup_steps": 0, "checkpoint_interval": 1, "eval_interval": 2}
    )

    def die_at_step_2(report: HeldOutReport) -> bool:
        raise KilledError(f"killed after step {report.step}")

    with pytest.raises(KilledError):
        run_trial(config, backend_url, tmp_path, progress=False, on_eval=die_at_step_2)
    directory = RunDirectory(tmp_path / "mid-eval")
    state = directory.load_state()
    assert state is not None and state.step == 2 and state.checkpoint_path.endswith("/weights/step-000002")
    # The process died while it evaluated step 2: that evaluation never reached the log.
    evals = directory.evals.path.read_text().splitlines()
    assert [json.loads(line)["step"] for line in evals] == [0, 2]
    directory.evals.path.write_text(evals[0] + "\n")
    before = directory.metrics.path.read_text().splitlines()

    evaluated: list[int] = []

    def keep_going(report: HeldOutReport) -> bool:
        evaluated.append(report.step)
        return True

    result = run_trial(config, backend_url, tmp_path, progress=False, on_eval=keep_going)
    assert result.resumed_from_step == 2 and result.steps_completed == 3
    assert directory.metrics.path.read_text().splitlines()[:2] == before  # step 2 not redone
    assert evaluated == [2, 3]
    assert [e["step"] for e in directory.evals.read()] == [0, 2, 3]


def test_a_resumed_trial_deletes_what_its_earlier_run_holds_but_the_state_it_resumed_from_before_it_saves(
    tiny_trial_config: TrialConfig, backend_url: str, tmp_path: Path
) -> None:
    # Kept until the new run's first save, the earlier run's states and sampler weights could fill a key's storage
    # quota so that the save is refused.
    config = tiny_trial_config.model_copy(
        update={"run_id": "cleared", "steps": 4, "warmup_steps": 0, "checkpoint_interval": 2, "eval_interval": 1}
    )

    def die_at_step_3(report: HeldOutReport) -> bool:
        if report.step == 3:
            raise KilledError("killed after step 3")
        return True

    with pytest.raises(KilledError):
        run_trial(config, backend_url, tmp_path, progress=False, on_eval=die_at_step_3)
    resumed_from = RunDirectory(tmp_path / "cleared").load_state().checkpoint_path
    earlier_run = resumed_from.removeprefix("tinker://").split("/")[0]
    rest = tinker.RestClient(base_url=backend_url, api_key=api_key())
    assert len(rest.list_checkpoints(earlier_run).result().checkpoints) > 1  # its sampler weights besides the state

    held_at_step_3: list[list[str]] = []

    def look_at_step_3(report: HeldOutReport) -> bool:
        if report.step == 3:  # resumed from step 2, before the new run's first checkpoint (step 4)
            held_at_step_3.append([c.tinker_path for c in rest.list_checkpoints(earlier_run).result().checkpoints])
        return True

    result = run_trial(config, backend_url, tmp_path, progress=False, on_eval=look_at_step_3)
    assert result.resumed_from_step == 2 and result.steps_completed == 4
    assert held_at_step_3 == [[resumed_from]]
    assert rest.list_checkpoints(earlier_run).result().checkpoints == []  # and that went once the new run saved


def test_a_trial_keeps_only_its_most_recent_checkpoints_on_the_backend(
    tiny_trial_config: TrialConfig, backend_url: str, tmp_path: Path
) -> None:
    config = tiny_trial_config.model_copy(
        update={"run_id": "kept", "steps": 3, "checkpoint_interval": 1, "eval_interval": 0, "keep_checkpoints": 1}
    )
    result = run_trial(config, backend_url, tmp_path, progress=False)
    model_id = result.checkpoint_path.removeprefix("tinker://").split("/")[0]
    rest = tinker.RestClient(base_url=backend_url, api_key=api_key())
    listed = rest.list_checkpoints(model_id).result().checkpoints
    # Three steps saved three states and a sampler save per step; the last of each kind is what stays.
    assert sorted(c.tinker_path for c in listed) == sorted([result.sampler_path, result.checkpoint_path])


def test_a_trial_from_a_saved_state_starts_at_its_weights_and_after_its_examples(
    tiny_trial_config: TrialConfig, backend_url: str, tmp_path: Path
) -> None:
    # A warm-up strong enough to change the tiny model's greedy answers, and no RL: what a shared warm-up runs.
    warmup = tiny_trial_config.model_copy(
        update={"run_id": "warmup", "steps": 0, "warmup_steps": 2, "warmup_learning_rate": 3e-2, "eval_interval": 1}
    )
    warmed = run_trial(warmup, backend_url, tmp_path, progress=False)
    assert warmed.steps_completed == 0 and warmed.checkpoint_path.endswith("/weights/warmup-000002")
    warmup_answers = [a["completion"] for a in RunDirectory(tmp_path / "warmup").evals.read()[0]["answers"]]
    base_answers = [a.completion for a in evaluate_checkpoint(warmup, backend_url).answers]
    assert warmup_answers != base_answers, "the warm-up must change the answers for this test to tell them apart"

    initial = InitialState(path=warmed.checkpoint_path, examples_seen=warmup.warmup_examples)
    config = tiny_trial_config.model_copy(
        update={"run_id": "from-warmup", "warmup_steps": 0, "init_from": initial, "eval_interval": 1}
    )
    result = run_trial(config, backend_url, tmp_path, progress=False)
    directory = RunDirectory(tmp_path / "from-warmup")
    # Where RL starts it answers as the warm-up left the model, not as a fresh adapter (the base model) would.
    assert [a["completion"] for a in directory.evals.read()[0]["answers"]] == warmup_answers
    assert directory.warmup.read() == []
    state = directory.load_state()
    assert state is not None and result.steps_completed == config.steps
    # Its prompts came after the examples the warm-up learned from.
    assert state.data_position == warmup.warmup_examples + config.steps * config.batch_size

    other_rank = config.model_copy(update={"run_id": "other-rank", "lora_rank": 8})
    with pytest.raises(ConfigurationError, match=r"init_from: .* holds a rank-4 adapter; .* asks for rank 8"):
        run_trial(other_rank, backend_url, tmp_path, progress=False)


def test_an_eval_callback_can_stop_a_trial_early(
    tiny_trial_config: TrialConfig, backend_url: str, tmp_path: Path
) -> None:
    # Also the DRO loss with the KL penalty and normalised advantages: the other path through the loop.
    config = tiny_trial_config.model_copy(
        update={
            "run_id": "pruned",
            "steps": 4,
            "warmup_steps": 0,
            "checkpoint_interval": 10,
            "eval_interval": 1,
            "loss": "dro",
            "loss_fn_config": {"beta": 0.05},
            "kl_coef": 0.1,
            "normalize_advantages": True,
        }
    )
    result = run_trial(config, backend_url, tmp_path, progress=False, on_eval=lambda report: report.step < 2)
    assert result.stopped_early and result.steps_completed == 2
    assert result.checkpoint_path.endswith("/weights/step-000002")
    metrics = RunDirectory(tmp_path / "pruned").metrics.read()
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(isinstance(m["kl"], float) for m in metrics)


@pytest.mark.slow
def test_the_command_line_runs_a_trial_on_a_backend_it_starts(tmp_path: Path) -> None:
    # The backend the trial starts gets one torch thread, for the reason given in conftest.py.
    environment = {k: v for k, v in os.environ.items() if k != "TINKER_BASE_URL"} | {"OMP_NUM_THREADS": "1"}
    command = [
        sys.executable, "-m", "autoresearch.trials", "experiments/trials/text2sql_tiny.yaml",
        "--run-dir", str(tmp_path), "--run-id", "by-hand", "--no-progress",
    ]  # fmt: skip
    finished = subprocess.run(
        command, cwd=Path(__file__).parents[2], env=environment, capture_output=True, text=True, timeout=300
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "run by-hand: 3 steps, held-out accuracy" in finished.stdout
    directory = RunDirectory(tmp_path / "by-hand")
    assert len(directory.metrics.read()) == 3 and directory.plot_path.exists()
    assert (directory.backend_root / "server.log").exists()


def test_the_command_line_scores_the_baseline_without_training(
    tiny_trial_config: TrialConfig, backend_url: str, tmp_path: Path
) -> None:
    environment = dict(os.environ) | {"TINKER_BASE_URL": backend_url, "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable, "-m", "autoresearch.trials", "experiments/trials/text2sql_tiny.yaml",
        "--run-dir", str(tmp_path), "--baseline",
    ]  # fmt: skip
    finished = subprocess.run(
        command, cwd=Path(__file__).parents[2], env=environment, capture_output=True, text=True, timeout=300
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    match = re.search(r"baseline tiny-gemma3 on dev \((\d+) questions\): held-out accuracy ([\d.]+)", finished.stdout)
    assert match is not None, finished.stdout
    assert int(match.group(1)) == tiny_trial_config.eval_size
    assert 0.0 <= float(match.group(2)) <= 1.0
    assert not list(tmp_path.glob("*/metrics.jsonl"))  # nothing was trained


def test_the_command_line_changes_config_fields_with_set_and_names_a_bad_one(backend_url: str, tmp_path: Path) -> None:
    environment = dict(os.environ) | {"TINKER_BASE_URL": backend_url, "OMP_NUM_THREADS": "1"}
    config = "experiments/trials/text2sql_tiny.yaml"

    def trials(*arguments: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "autoresearch.trials", config, "--run-dir", str(tmp_path), *arguments]
        return subprocess.run(
            command, cwd=Path(__file__).parents[2], env=environment, capture_output=True, text=True, timeout=300
        )

    scored = trials("--baseline", "--set", "eval_size=3", "--set", "eval_split=test")
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert "baseline tiny-gemma3 on test (3 questions)" in scored.stdout
    for arguments, message in (
        (("--set", "eval_size"), "--set 'eval_size': expected FIELD=VALUE"),
        (("--set", "colour=red"), "colour: unknown field"),
        (("--set", "eval_size=0"), "eval_size"),
    ):
        refused = trials("--baseline", *arguments)
        assert refused.returncode == 1 and message in refused.stderr, refused.stderr[-2000:]


def test_the_endpoint_evaluation_of_a_checkpoint_agrees_with_the_trials_own(
    tiny_trial_config: TrialConfig, backend_url: str, tmp_path: Path
) -> None:
    """`tasks.text2sql evaluate --model endpoint`, through the backend's /v1/completions with the trial's held-out
    subset, few-shot prompt, max_tokens and stops, gives each question the answer and the verdict the trial's own
    evaluation of the same sampler checkpoint gives (the endpoint leaves the stop string out, as OpenAI's does)."""
    with tinker.ServiceClient(base_url=backend_url, api_key="tml-local") as service:
        training = trained_adapter(
            service, "SELECT COUNT(*) FROM employees;", seed=5, steps=1, base_model=tiny_trial_config.base_model
        )
        sampler_path = training.save_weights_for_sampler("for-the-endpoint").result().path
    by_trial = evaluate_checkpoint(tiny_trial_config, backend_url, model_path=sampler_path, api_key="tml-local")

    c = tiny_trial_config
    command = [
        sys.executable, "-m", "tasks.text2sql", "evaluate", "--model", "endpoint", "--base-url", f"{backend_url}/v1",
        "--model-name", sampler_path, "--split", c.eval_split, "--few-shot", str(c.few_shot),
        "--eval-size", str(c.eval_size), "--eval-seed", str(c.eval_seed), "--max-tokens", str(c.max_tokens),
        *(option for stop in c.stop for option in ("--stop", stop)), "--report", str(tmp_path / "report.json"),
    ]  # fmt: skip
    environment = dict(os.environ) | {"OPENAI_API_KEY": "tml-local"}
    finished = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300, check=False)
    assert finished.returncode == 0, finished.stderr[-3000:]
    by_endpoint = HeldOutReport.model_validate_json((tmp_path / "report.json").read_text())

    assert [a.example_id for a in by_endpoint.answers] == [a.example_id for a in by_trial.answers]
    assert [a.correct for a in by_endpoint.answers] == [a.correct for a in by_trial.answers]
    assert by_endpoint.accuracy == by_trial.accuracy
    for endpoint_answer, trial_answer in zip(by_endpoint.answers, by_trial.answers, strict=True):
        rest = trial_answer.completion.removeprefix(endpoint_answer.completion)
        assert trial_answer.completion.startswith(endpoint_answer.completion)
        assert rest == "" or rest.startswith(c.stop), (endpoint_answer.completion, trial_answer.completion)
