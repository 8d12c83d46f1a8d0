"""A study spec's and a trial config's `data:`: a Spider release (written in code) that a study passes to every trial,
which trains on its train split and is judged on its dev split, on the tiny model against a real backend."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import yaml
from support.spider_release import PETS_QUESTIONS, SHOP_QUESTIONS, write_spider_release

from autoresearch.errors import ConfigurationError
from autoresearch.executors.base import write_launch_config
from autoresearch.spec import load_study_spec
from autoresearch.trials.backend import api_key
from autoresearch.trials.config import TrialConfig, load_trial_config, parse_trial_config
from autoresearch.trials.evaluation import evaluate_checkpoint
from autoresearch.trials.rl_loop import run_trial
from autoresearch.trials.run_dir import RunDirectory, TrialResult
from tasks import registry
from tasks.report import HeldOutReport
from tasks.text2sql.dataset import Text2SqlDataset
from tasks.text2sql.reward.rewards import RewardSpec
from tasks.text2sql.reward.scoring import Score
from tasks.text2sql.task import Text2SqlEpisode, Text2SqlTask

TINY_SPEC = Path(__file__).resolve().parents[2] / "experiments" / "text2sql_tiny.yaml"
TRAIN_IDS = {f"spider-train-{i}" for i in range(len(SHOP_QUESTIONS))}
DEV_IDS = {f"spider-dev-{i}" for i in range(len(PETS_QUESTIONS))}


class ScoredTask(Text2SqlTask):
    """The text-to-SQL task as trials open it, keeping the ids of the examples it scores (it scores them itself)."""

    opened: ClassVar[list[ScoredTask]] = []

    def __init__(self, dataset: Text2SqlDataset) -> None:
        super().__init__(dataset)
        self.scored: list[str] = []
        ScoredTask.opened.append(self)

    def score_episodes(self, episodes_B: Sequence[Text2SqlEpisode], reward_spec: RewardSpec) -> list[Score]:
        self.scored += [episode.example.id for episode in episodes_B]
        return super().score_episodes(episodes_B, reward_spec)


def spider_spec(tmp_path: Path, release: Path, **trial: object) -> Path:
    """The shipped tiny study, on the release."""
    data = yaml.safe_load(TINY_SPEC.read_text())
    data["data"] = {"source": "spider", "path": str(release), "cache_dir": str(tmp_path / "cache")}
    data["trial"].update(trial)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def release(tmp_path: Path) -> Path:
    return write_spider_release(tmp_path / "spider")


@dataclass(frozen=True)
class SpiderRun:
    """A trial of a study on the release, run to its end, and what its task scored."""

    release: Path
    config: TrialConfig
    result: TrialResult
    evals: list[dict]
    task: ScoredTask


@pytest.fixture(scope="module")
def spider_run(backend_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SpiderRun]:
    root = tmp_path_factory.mktemp("spider-run")
    release = write_spider_release(root / "spider")
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(registry.TASKS, "text2sql", registry.RegisteredTask(Text2SqlTask, ScoredTask.open))
        patch.setattr(ScoredTask, "opened", [])
        spec = load_study_spec(spider_spec(root, release))
        reward = {"components": [{"kind": "execution_match"}, {"kind": "length_penalty", "weight": 0.1}]}
        # The config a trial process reads, as either executor writes it.
        launched = write_launch_config(root / "launch", spec.trial_config({"batch_size": 2}, reward, run_id="spider"))
        config = load_trial_config(launched)
        result = run_trial(config, backend_url, root / "runs", progress=False)
        [task] = ScoredTask.opened
        yield SpiderRun(release, config, result, RunDirectory(root / "runs" / "spider").evals.read(), task)


@pytest.mark.slow
def test_a_studys_trial_trains_on_the_releases_train_split_and_is_judged_on_its_dev_split(
    spider_run: SpiderRun,
) -> None:
    config, evals = spider_run.config, spider_run.evals
    assert spider_run.task.dataset.name == "spider"
    assert [e["step"] for e in evals] == [0, 1, 2, 3]
    judged = [a["example_id"] for e in evals for a in e["answers"]]
    assert set(judged) <= DEV_IDS and len(judged) == 4 * config.eval_size
    # What was scored beyond the evaluations was the sampled completions of 3 RL steps, on training questions only.
    trained = [example_id for example_id in spider_run.task.scored if example_id not in DEV_IDS]
    assert set(trained) <= TRAIN_IDS and len(trained) == 3 * config.batch_size * config.group_size
    assert spider_run.result.steps_completed == 3 and 0.0 <= spider_run.result.held_out_accuracy <= 1.0


@pytest.mark.slow
def test_the_controllers_baseline_scores_the_releases_dev_questions(spider_run: SpiderRun, backend_url: str) -> None:
    baseline = evaluate_checkpoint(spider_run.config, backend_url)
    assert [a.example_id for a in baseline.answers] == [a["example_id"] for a in spider_run.evals[0]["answers"]]


@pytest.mark.slow
def test_the_trained_adapter_is_scored_on_the_release_by_the_evaluate_command(
    spider_run: SpiderRun, backend_url: str, tmp_path: Path
) -> None:
    """As docs/text2sql.md tells a user to: the trial's sampler weights through the backend's /v1, with its key."""
    report = tmp_path / "report.json"
    command = [
        sys.executable, "-m", "tasks.text2sql", "evaluate", "--source", "spider", "--path", str(spider_run.release),
        "--split", "dev", "--model", "endpoint", "--base-url", f"{backend_url}/v1",
        "--model-name", spider_run.result.sampler_path, "--api", "chat", "--few-shot", "0", "--max-tokens", "16",
        "--eval-size", str(spider_run.config.eval_size), "--report", str(report),
    ]  # fmt: skip
    # HOME: the command keeps its DuckDB copies of the release in the user's cache.
    env = {**os.environ, "OPENAI_API_KEY": api_key(), "HOME": str(tmp_path)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    scored = HeldOutReport.model_validate_json(report.read_text())
    assert [a.example_id for a in scored.answers] == [a["example_id"] for a in spider_run.evals[-1]["answers"]]


def test_a_study_spec_passes_its_data_source_to_every_trial(tmp_path: Path, release: Path) -> None:
    spec = load_study_spec(spider_spec(tmp_path, release))
    source = {"source": "spider", "path": str(release), "cache_dir": str(tmp_path / "cache")}
    assert spec.data.model_dump(mode="json") == source
    configs = [spec.trial_config({"batch_size": 1}, run_id="t-0"), spec.warmup_config("warmup")]
    assert all(config.data == spec.data for config in configs)
    # Trial processes (a subprocess, a Kubernetes Job) read it from the config they are launched with.
    assert load_trial_config(write_launch_config(tmp_path / "t-0", configs[0])).data == spec.data
    # A spec without `data:` trains on the task's own data.
    bundled = load_study_spec(TINY_SPEC)
    assert bundled.data.model_dump(mode="json") == {"source": "bundled", "path": None, "cache_dir": None}
    assert bundled.trial_config({}).data == bundled.data


def test_a_study_spec_on_a_folder_that_is_no_release_is_refused_with_the_fix(tmp_path: Path, release: Path) -> None:
    missing = tmp_path / "spider_data"
    with pytest.raises(ConfigurationError, match=rf"data: {missing}: no such folder; give the folder the Spider"):
        load_study_spec(spider_spec(tmp_path, missing))
    (release / "dev.json").unlink()
    (release / "train_spider.json").unlink()
    with pytest.raises(ConfigurationError, match=r"data: .*: no Spider split file"):
        load_study_spec(spider_spec(tmp_path, release))


def test_the_shipped_spider_study_reads_the_release_from_the_environment(
    tmp_path: Path, release: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped = TINY_SPEC.with_name("text2sql_spider.yaml")
    monkeypatch.setenv("SPIDER_RELEASE", str(release))
    spec = load_study_spec(shipped)
    assert spec.data.path == release
    shapes = {g: spec.trial_config({"group_size": g}) for g in (4, 8, 16)}
    assert {g: (c.batch_size, c.group_size) for g, c in shapes.items()} == {4: (16, 4), 8: (8, 8), 16: (4, 16)}
    assert all(c.eval_size == 400 and c.data == spec.data for c in shapes.values())
    monkeypatch.delenv("SPIDER_RELEASE")
    with pytest.raises(ConfigurationError, match=r"data\.path: refers to SPIDER_RELEASE, .* \(export SPIDER_RELEASE="):
        load_study_spec(shipped)
    monkeypatch.setenv("SPIDER_RELEASE", str(tmp_path / "elsewhere"))
    with pytest.raises(ConfigurationError, match="no such folder; give the folder the Spider"):
        load_study_spec(shipped)


def test_the_shipped_spider_trial_config_is_the_bundled_recipe_on_the_release_from_the_environment(
    tmp_path: Path, release: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trials = TINY_SPEC.parent / "trials"
    monkeypatch.setenv("SPIDER_RELEASE", str(release))
    spider = load_trial_config(trials / "text2sql_qwen_spider.yaml")
    bundled = load_trial_config(trials / "text2sql_qwen.yaml")
    assert spider.data is not None and spider.data.path == release
    assert spider.model_copy(update={"data": bundled.data, "eval_size": bundled.eval_size}) == bundled
    assert spider.eval_size == 400
    monkeypatch.delenv("SPIDER_RELEASE")
    with pytest.raises(ConfigurationError, match=r"data\.path: refers to SPIDER_RELEASE, .* \(export SPIDER_RELEASE="):
        load_trial_config(trials / "text2sql_qwen_spider.yaml")


def test_a_studys_trials_cannot_set_their_own_data(tmp_path: Path, release: Path) -> None:
    path = spider_spec(tmp_path, release, data={"source": "bundled"})
    with pytest.raises(ConfigurationError, match="trial: data are set by the study"):
        load_study_spec(path)


def test_a_trial_configs_data_source_is_validated_by_its_task(release: Path) -> None:
    config = parse_trial_config({"data": {"source": "spider", "path": str(release)}})
    assert parse_trial_config(config.model_dump(mode="json")) == config
    with pytest.raises(
        ConfigurationError, match=r"data\.source: Input should be 'bundled', 'synthesized', 'spider' or 'bird'"
    ):
        parse_trial_config({"data": {"source": "wikisql", "path": str(release)}})
    with pytest.raises(ConfigurationError, match=r"data: path: required with source bird"):
        parse_trial_config({"data": {"source": "bird"}})
