"""Study specs: the shipped ones load, and every kind of mistake is refused with the field named."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from support.loopback import free_port

from autoresearch.errors import ConfigurationError
from autoresearch.spec import load_study_spec
from autoresearch.study import open_study

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


@pytest.mark.parametrize("name", ["text2sql.yaml", "text2sql_tiny.yaml"])
def test_the_shipped_specs_load_and_make_valid_trial_configs(name: str) -> None:
    spec = load_study_spec(EXPERIMENTS / name)
    config = spec.trial_config({}, run_id="t-0")
    assert config.steps == spec.budget.steps_per_trial and config.base_model == spec.base_model
    assert config.eval_split == spec.eval_split and config.eval_size == spec.eval_size and config.run_id == "t-0"
    assert config.task == spec.task == "text2sql"


def test_a_proposal_fills_the_base_trial_config(tmp_path: Path) -> None:
    spec = load_study_spec(EXPERIMENTS / "text2sql_tiny.yaml")
    reward = {"components": [{"kind": "execution_match"}, {"kind": "format", "weight": 0.2}]}
    config = spec.trial_config({"learning_rate": 3e-3, "loss": "ppo", "batch_size": 2}, reward)
    assert (config.learning_rate, config.loss, config.batch_size, config.lora_rank) == (3e-3, "ppo", 2, 4)
    assert [c.kind for c in config.reward_spec.components] == ["execution_match", "format"]
    with pytest.raises(ConfigurationError, match="batch_size"):
        spec.trial_config({"batch_size": 0})
    agentic = spec.trial_config({"mode": "agentic", "max_turns": 3})
    assert (agentic.mode, agentic.max_turns) == ("agentic", 3)


def test_samples_per_step_fixes_the_batch_from_the_group_size(tmp_path: Path) -> None:
    spec = load_study_spec(
        write(
            tmp_path,
            search_space__samples_per_step=16,
            search_space__params__batch_size=None,
            search_space__params__group_size={"choices": [2, 4, 8]},
            trial__group_size=None,
        )
    )
    shapes = {g: spec.trial_config({"group_size": g}) for g in (2, 4, 8)}
    assert {g: (c.batch_size, c.group_size) for g, c in shapes.items()} == {2: (8, 2), 4: (4, 4), 8: (2, 8)}
    with pytest.raises(ConfigurationError, match=r"batch_size follows from search_space\.samples_per_step"):
        load_study_spec(
            write(
                tmp_path,
                search_space__samples_per_step=16,
                search_space__params__batch_size=None,
                search_space__params__group_size={"choices": [2, 4]},
                trial__group_size=None,
                trial__batch_size=4,
            )
        )


def test_a_searched_clip_reaches_the_loss_that_has_one_and_max_tokens_is_searched(tmp_path: Path) -> None:
    spec = load_study_spec(
        write(
            tmp_path,
            search_space__params__clip_low_threshold={"low": 0.5, "high": 0.9},
            search_space__params__clip_high_threshold={"low": 1.1, "high": 2.0},
            search_space__params__max_tokens={"low": 32, "high": 128, "step": 32},
            trial__max_tokens=None,
        )
    )
    clip = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.3}
    ppo = spec.trial_config({"loss": "ppo", "max_tokens": 64, **clip})
    assert (ppo.loss_fn_config, ppo.max_tokens) == (clip, 64)
    # Importance sampling has no clip: the sampled thresholds are not its to use.
    assert spec.trial_config({"loss": "importance_sampling", **clip}).loss_fn_config == {}


def write(tmp_path: Path, **changes: object) -> Path:
    data = yaml.safe_load((EXPERIMENTS / "text2sql_tiny.yaml").read_text())
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        target = data
        for key in parents:
            target = target.setdefault(key, {})
        if value is None:
            target.pop(leaf, None)
        else:
            target[leaf] = value
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"search_space__params__eps": {"low": 1e-9, "high": 1e-6}}, "'eps' cannot be searched"),
        ({"search_space__samples_per_step": 8}, "samples_per_step: search group_size as choices"),
        (
            {
                "search_space__samples_per_step": 8,
                "search_space__params__group_size": {"choices": [2, 3]},
                "trial__group_size": None,
            },
            "samples_per_step: 8 is not a multiple of group_size \\[3\\]",
        ),
        (
            {
                "search_space__samples_per_step": 8,
                "search_space__params__group_size": {"choices": [2, 4]},
                "trial__group_size": None,
            },
            "samples_per_step: batch_size follows from group_size",
        ),
        ({"search_space__params__learning_rate": {"low": 1e-2, "high": 1e-4}}, "low < high"),
        ({"search_space__params__learning_rate": {"low": 0.0, "high": 1e-2, "log": True}}, "low > 0"),
        ({"search_space__params__lora_rank": {"low": 1.5, "high": 9.0}}, "lora_rank: takes whole numbers"),
        ({"search_space__params__loss": {"low": 1, "high": 2}}, "loss: takes a list of choices"),
        ({"search_space__params__batch_size": {"choices": [1, "two"]}}, "batch_size: every choice must be a int"),
        ({"search_space__reward__components__execution_match": {"low": 0, "high": 1}}, "always in the reward"),
        ({"search_space__reward__components__style": {"low": 0, "high": 1}}, "style"),
        ({"trial__steps": 5}, "steps are set by the study"),
        ({"task": "chess"}, "task: no task 'chess'; tasks: text2sql"),
        ({"trial__task": "text2sql"}, "task are set by the study"),
        ({"trial__init_from": {"path": "tinker://r/weights/w", "examples_seen": 0}}, "init_from are set by the study"),
        ({"shared_warmup": True}, "shared_warmup: the base trial config has no warm-up"),
        (
            {
                "shared_warmup": True,
                "trial__warmup_steps": 2,
                "trial__lora_rank": None,
                "search_space__params__lora_rank": {"choices": [4, 8]},
            },
            "lora_rank are fixed by the shared warm-up",
        ),
        ({"shared_warmup": True, "trial__warmup_steps": 2}, "batch_size is searched; set trial.warmup_batch_size"),
        (
            {
                "shared_warmup": True,
                "trial__warmup_steps": 2,
                "trial__warmup_batch_size": 2,
                "search_space__params__mode": {"choices": ["single_turn", "agentic"]},
            },
            "mode are fixed by the shared warm-up",
        ),
        ({"search_space__params__mode": {"choices": ["agentic", 3]}}, "mode: every choice must be a str"),
        ({"trial__batch_size": 2}, "batch_size are searched"),
        ({"trial__lora_rank": 0}, "lora_rank"),
        ({"trial__colour": "red"}, "colour: unknown field"),
        ({"backend": "gpu-box:8000"}, "backend: must be 'local', an http"),
        ({"backend": ["http://a:8000", "b:8000"]}, "got 'b:8000'"),
        ({"backend": ["http://a:8000", "http://a:8000"]}, "lists a backend twice"),
        ({"backend": []}, "needs at least one backend URL"),
        ({"executor": {"kind": "slurm"}}, "executor: Input tag 'slurm'"),
        ({"executor": {"kind": "kubernetes", "image": "x", "runs_claim": "runs"}}, "need the URL of a backend"),
        (
            {"backend": "http://b:8000", "executor": {"kind": "kubernetes", "image": "x"}},
            "executor.kubernetes.runs_claim",
        ),
        ({"storage": "postgresql+psycopg://u:${UNSET_PASSWORD_FOR_TEST}@db/optuna"}, "UNSET_PASSWORD_FOR_TEST"),
        ({"budget__concurrency": 0}, "budget.concurrency"),
        ({"budget": None}, "budget: Field required"),
        ({"llm": {"base_url": "localhost:1234", "model": "m"}}, "llm.base_url"),
        ({"study": "bad name!"}, "study"),
    ],
)
def test_a_bad_spec_is_refused_naming_the_field(tmp_path: Path, changes: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(")):
        load_study_spec(write(tmp_path, **changes))


def test_backends_and_storage_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_DB_PASSWORD", "s3cret")
    spec = load_study_spec(
        write(
            tmp_path,
            backend=["http://trainer-backend-0.trainer-backend:8000", "http://trainer-backend-1.trainer-backend:8000"],
            storage="postgresql+psycopg://optuna:${TEST_DB_PASSWORD}@postgres:5432/optuna",
            executor={"kind": "kubernetes", "image": "rl-posttrain:dev", "runs_claim": "runs"},
        )
    )
    assert spec.backend_urls == (
        "http://trainer-backend-0.trainer-backend:8000",
        "http://trainer-backend-1.trainer-backend:8000",
    )
    assert spec.storage_url() == "postgresql+psycopg://optuna:s3cret@postgres:5432/optuna"
    assert "s3cret" not in spec.storage  # what gets printed keeps the reference
    assert spec.executor.kind == "kubernetes" and spec.executor.backoff_limit == 0
    assert load_study_spec(write(tmp_path, backend="local")).backend_urls == ()
    assert load_study_spec(write(tmp_path, backend="http://gpu:8000")).backend_urls == ("http://gpu:8000",)


def test_a_missing_or_malformed_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="no such study spec"):
        load_study_spec(tmp_path / "absent.yaml")
    (tmp_path / "broken.yaml").write_text("study: [unclosed")
    with pytest.raises(ConfigurationError, match="not valid YAML"):
        load_study_spec(tmp_path / "broken.yaml")


def test_an_unreachable_storage_is_named_without_its_password(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_DB_PASSWORD", "hunter2")
    url = f"postgresql+psycopg://optuna:${{TEST_DB_PASSWORD}}@127.0.0.1:{free_port()}/optuna"
    spec = load_study_spec(write(tmp_path, storage=url))
    with pytest.raises(ConfigurationError) as refused:
        open_study(spec)
    assert str(refused.value).startswith(f"cannot reach the study's storage {url}: ")
    assert "hunter2" not in str(refused.value)
