"""Study specs: the shipped ones load, and every kind of mistake is refused with the field named."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from autoresearch.spec import load_study_spec
from autoresearch.trials.errors import ConfigurationError

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


@pytest.mark.parametrize("name", ["text2sql.yaml", "text2sql_tiny.yaml"])
def test_the_shipped_specs_load_and_make_valid_trial_configs(name: str) -> None:
    spec = load_study_spec(EXPERIMENTS / name)
    config = spec.trial_config({}, run_id="t-0")
    assert config.steps == spec.budget.steps_per_trial and config.base_model == spec.base_model
    assert config.eval_split == spec.eval_split and config.eval_size == spec.eval_size and config.run_id == "t-0"


def test_a_proposal_fills_the_base_trial_config(tmp_path: Path) -> None:
    spec = load_study_spec(EXPERIMENTS / "text2sql_tiny.yaml")
    reward = {"components": [{"kind": "execution_match"}, {"kind": "format", "weight": 0.2}]}
    config = spec.trial_config({"learning_rate": 3e-3, "loss": "ppo", "batch_size": 2}, reward)
    assert (config.learning_rate, config.loss, config.batch_size, config.lora_rank) == (3e-3, "ppo", 2, 4)
    assert [c.kind for c in config.reward_spec.components] == ["execution_match", "format"]
    with pytest.raises(ConfigurationError, match="batch_size"):
        spec.trial_config({"batch_size": 0})


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
        ({"search_space__params__max_tokens": {"low": 1, "high": 9}}, "'max_tokens' cannot be searched"),
        ({"search_space__params__learning_rate": {"low": 1e-2, "high": 1e-4}}, "low < high"),
        ({"search_space__params__learning_rate": {"low": 0.0, "high": 1e-2, "log": True}}, "low > 0"),
        ({"search_space__params__lora_rank": {"low": 1.5, "high": 9.0}}, "lora_rank: takes whole numbers"),
        ({"search_space__params__loss": {"low": 1, "high": 2}}, "loss: takes a list of choices"),
        ({"search_space__params__batch_size": {"choices": [1, "two"]}}, "batch_size: every choice must be a int"),
        ({"search_space__reward__components__execution_match": {"low": 0, "high": 1}}, "always in the reward"),
        ({"search_space__reward__components__style": {"low": 0, "high": 1}}, "style"),
        ({"trial__steps": 5}, "steps are set by the study"),
        ({"trial__batch_size": 2}, "batch_size are searched"),
        ({"trial__lora_rank": 0}, "lora_rank"),
        ({"trial__colour": "red"}, "colour: unknown field"),
        ({"backend": "gpu-box:8000"}, "backend: must be 'local' or an http"),
        ({"budget__concurrency": 0}, "budget.concurrency"),
        ({"budget": None}, "budget: Field required"),
        ({"llm": {"base_url": "localhost:1234", "model": "m"}}, "llm.base_url"),
        ({"study": "bad name!"}, "study"),
    ],
)
def test_a_bad_spec_is_refused_naming_the_field(tmp_path: Path, changes: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(")):
        load_study_spec(write(tmp_path, **changes))


def test_a_missing_or_malformed_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="no such study spec"):
        load_study_spec(tmp_path / "absent.yaml")
    (tmp_path / "broken.yaml").write_text("study: [unclosed")
    with pytest.raises(ConfigurationError, match="not valid YAML"):
        load_study_spec(tmp_path / "broken.yaml")
