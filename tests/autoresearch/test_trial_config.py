"""Trial configs: the shipped ones validate, bad ones are refused by field, a resumed run keeps its config."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoresearch.errors import ConfigurationError, ResumeError
from autoresearch.trials.config import TrialConfig, load_trial_config, parse_trial_config
from autoresearch.trials.data import TrainingOrder, held_out_subset, training_examples
from autoresearch.trials.run_dir import RunDirectory
from tasks.text2sql.dataset import Text2SqlDataset
from tasks.text2sql.task import Text2SqlTask

EXPERIMENTS = Path(__file__).parents[2] / "experiments" / "trials"


def test_the_shipped_configs_validate() -> None:
    gemma = load_trial_config(EXPERIMENTS / "text2sql_gemma.yaml")
    tiny = load_trial_config(EXPERIMENTS / "text2sql_tiny.yaml")
    assert gemma.base_model == "google/gemma-3-270m" and not gemma.train_unembed
    # The measured recipe: a supervised warm-up before RL, scored on the whole dev split where RL starts and after.
    assert gemma.warmup_steps > 0 and gemma.warmup_batch_size and gemma.eval_size == 332 and gemma.eval_interval > 0
    assert tiny.base_model == "tiny-gemma3" and tiny.steps <= 5 and tiny.max_tokens <= 32


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"lr": 1e-4}, "lr: unknown field (fields: task, data, run_id, seed"),
        ({"loss": "hinge"}, "loss: Input should be 'importance_sampling', 'ppo', 'cispo' or 'dro'"),
        ({"loss": "ppo", "loss_fn_config": {"beta": 0.1}}, "'beta' does not apply to loss 'ppo' (allowed: clip_low"),
        ({"group_size": 1}, "group_size: Input should be greater than or equal to 2"),
        ({"eval_split": "train"}, "eval_split: must differ from train_split"),
        ({"run_id": "../escape"}, "run_id: String should match pattern"),
        ({"reward_spec": {"components": [{"kind": "vibes"}]}}, "reward component kinds: execution_match"),
        ({"reward_spec": {"components": [{"kind": "format", "wieght": 1}]}}, "components.0.format.wieght: unknown"),
        ({"task": "chess"}, "task: no task 'chess'; tasks: text2sql"),
    ],
)
def test_an_invalid_config_is_refused_naming_the_field(fields: dict, message: str) -> None:
    with pytest.raises(ConfigurationError) as error:
        parse_trial_config(fields)
    assert message in str(error.value)


def test_a_config_file_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "trial.yaml"
    path.write_text("steps: -1\n")
    with pytest.raises(ConfigurationError, match=r"trial\.yaml: steps: Input should be greater than or equal to 0"):
        load_trial_config(path)
    with pytest.raises(ConfigurationError, match="no such trial config"):
        load_trial_config(tmp_path / "missing.yaml")


def test_a_resumed_run_may_only_change_its_length_and_intervals(tmp_path: Path) -> None:
    directory = RunDirectory(tmp_path / "run")
    config = TrialConfig(run_id="run", steps=10)
    directory.check_config(config)
    directory.check_config(config.model_copy(update={"steps": 20, "eval_interval": 5}))
    with pytest.raises(ResumeError, match="learning_rate, loss differ"):
        directory.check_config(config.model_copy(update={"learning_rate": 1e-3, "loss": "ppo"}))


def test_the_training_order_is_fixed_by_the_seed_and_covers_each_epoch(bundled: Text2SqlDataset) -> None:
    examples = bundled.split("train")[:10]
    order = TrainingOrder(examples, seed=3)
    first_epoch = order.batch(0, 10)
    assert sorted(e.id for e in first_epoch) == sorted(e.id for e in examples)
    assert order.batch(4, 8) == TrainingOrder(examples, seed=3).batch(4, 8)
    assert order.batch(0, 10) != TrainingOrder(examples, seed=4).batch(0, 10)
    assert order.batch(10, 10) != first_epoch  # the next epoch is another permutation


def test_training_stops_at_the_hardest_difficulty_asked_for_and_a_wrong_level_is_named(
    text2sql: Text2SqlTask,
) -> None:
    every = training_examples(text2sql, TrialConfig(run_id="all"), excluded=())
    up_to_medium = training_examples(text2sql, TrialConfig(run_id="m", hardest_train_difficulty="medium"), ())
    assert {e.difficulty for e in every} > {"easy", "medium"} == {e.difficulty for e in up_to_medium}
    assert [e for e in every if e.difficulty in ("easy", "medium")] == up_to_medium
    with pytest.raises(ConfigurationError, match=r"'easiest' is not a difficulty level .* easy, medium, hard, extra"):
        training_examples(text2sql, TrialConfig(run_id="x", hardest_train_difficulty="easiest"), ())
    easy_ids = {e.id for e in every if e.difficulty == "easy"}
    with pytest.raises(ConfigurationError, match="no question of split 'train' is 'easy' or easier"):
        training_examples(text2sql, TrialConfig(run_id="e", hardest_train_difficulty="easy"), excluded=easy_ids)


def test_the_held_out_subset_is_fixed_and_refuses_more_than_the_split(text2sql: Text2SqlTask) -> None:
    subset = held_out_subset(text2sql, "dev", 8, seed=0)
    assert subset == held_out_subset(text2sql, "dev", 8, seed=0)
    assert subset != held_out_subset(text2sql, "dev", 8, seed=1)
    assert {e.id for e in subset} <= {e.id for e in text2sql.split("dev")}
    # The task's errors become the trial's, naming the config field.
    with pytest.raises(ConfigurationError, match="eval_size: 10000 exceeds the 332 examples"):
        held_out_subset(text2sql, "dev", 10_000, seed=0)
    with pytest.raises(ConfigurationError, match="eval_split: no split 'validation'"):
        held_out_subset(text2sql, "validation", 8, seed=0)
