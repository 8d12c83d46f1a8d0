"""Datums and the training batch made of scored groups, checked by hand on tiny examples."""

from __future__ import annotations

import pytest

from autoresearch.trials.data import Prompt
from autoresearch.trials.datums import rl_datum, supervised_datum
from autoresearch.trials.rollouts import Completion, Group
from autoresearch.trials.training_batch import build_training_batch, select_samples
from tasks.text2sql.dataset import Difficulty, Example
from tasks.text2sql.reward.scoring import Score
from tasks.text2sql.sql.sandbox import ExecutionStatus

EXAMPLE = Example(id="q1", db_id="db", question="How many?", gold_sql="SELECT 1", difficulty=Difficulty.EASY)


def lists(datum) -> dict[str, list]:
    inputs = {key: value.tolist() for key, value in datum.loss_fn_inputs.items()}
    return {"model_input": datum.model_input.to_ints(), **inputs}


def group(rewards: list[float], prompt: tuple[int, ...] = (10, 11, 12)) -> Group:
    completions = tuple(Completion(tokens=(20 + i, 30 + i), logprobs=(-0.5, -0.25), text="") for i in range(4))
    scores = tuple(Score(r, {"execution_match": r}, r == 1.0, ExecutionStatus.OK, "") for r in rewards)
    return Group(prompt=Prompt(EXAMPLE, prompt), completions=completions[: len(rewards)], scores=scores)


def test_an_rl_datum_is_the_sequence_shifted_by_one_with_inert_prompt_positions() -> None:
    datum = rl_datum(
        prompt_tokens=[10, 11, 12],
        completion_tokens=[20, 21],
        completion_logprobs=[-0.5, -0.25],
        completion_advantages=[0.5, 0.5],
    )
    assert lists(datum) == {
        "model_input": [10, 11, 12, 20],
        "target_tokens": [11, 12, 20, 21],
        "logprobs": [0.0, 0.0, -0.5, -0.25],
        "advantages": [0.0, 0.0, 0.5, 0.5],
    }


def test_prompt_logprobs_fill_the_prompt_positions_when_given() -> None:
    datum = rl_datum([10, 11, 12], [20, 21], [-0.5, -0.25], [0.5, 0.5], prompt_logprobs=[None, -1.0, -2.0])
    assert lists(datum)["logprobs"] == [-1.0, -2.0, -0.5, -0.25]
    assert lists(datum)["advantages"] == [0.0, 0.0, 0.5, 0.5]


def test_a_supervised_datum_weights_only_the_completion() -> None:
    datum = supervised_datum([10, 11, 12], [20, 21])
    assert lists(datum) == {
        "model_input": [10, 11, 12, 20],
        "target_tokens": [11, 12, 20, 21],
        "weights": [0.0, 0.0, 1.0, 1.0],
    }


def test_a_batch_trains_on_groups_with_signal_and_drops_the_rest() -> None:
    samples = select_samples([group([1.0, 0.0, 0.0, 1.0]), group([0.0, 0.0, 0.0, 0.0])], normalize_std=False)
    batch = build_training_batch(samples, base_logprobs=None, kl_coef=0.0)
    assert batch.groups_kept == 1 and len(batch.datums) == 4 and batch.completion_tokens == 8
    assert batch.kl is None
    assert [lists(d)["advantages"] for d in batch.datums] == [
        [0.0, 0.0, 0.5, 0.5],
        [0.0, 0.0, -0.5, -0.5],
        [0.0, 0.0, -0.5, -0.5],
        [0.0, 0.0, 0.5, 0.5],
    ]
    assert lists(batch.datums[1])["target_tokens"] == [11, 12, 21, 31]


def test_a_batch_with_a_kl_penalty_reports_the_mean_log_ratio() -> None:
    samples = select_samples([group([1.0, 0.0])], normalize_std=False)
    # The base model is less sure of both tokens of both completions: log ratio +0.5 and +0.25.
    batch = build_training_batch(samples, base_logprobs=[[-1.0, -0.5], [-1.0, -0.5]], kl_coef=0.2)
    assert batch.kl == pytest.approx(0.375)
    assert lists(batch.datums[0])["advantages"] == pytest.approx([0.0, 0.0, 0.5 - 0.1, 0.5 - 0.05])
    assert lists(batch.datums[1])["advantages"] == pytest.approx([0.0, 0.0, -0.5 - 0.1, -0.5 - 0.05])


def test_an_episode_trains_its_turns_and_not_the_observations_between_them() -> None:
    # Turn (20, 21), observation (90, 91, 92), turn (22,): only the three sampled tokens carry the advantage.
    trained = (True, True, False, False, False, True)
    episodes = tuple(
        Completion(
            tokens=(20, 21, 90, 91, 92, 22), logprobs=(-0.5, -0.5, 0.0, 0.0, 0.0, -0.25), text="", trained=trained
        )
        for _ in range(2)
    )
    scores = tuple(Score(r, {"execution_match": r}, r == 1.0, ExecutionStatus.OK, "") for r in (1.0, 0.0))
    batch = build_training_batch(
        select_samples([Group(Prompt(EXAMPLE, (10, 11)), episodes, scores)], normalize_std=False), None, 0.0
    )
    assert batch.completion_tokens == 2 * 3
    assert episodes[0].turns == 2 and Completion((1, 2), (0.0, 0.0), "").turns == 1
    first = lists(batch.datums[0])
    assert first["target_tokens"] == [11, 20, 21, 90, 91, 92, 22]
    assert first["advantages"] == [0.0, 0.5, 0.5, 0.0, 0.0, 0.0, 0.5]
    assert first["logprobs"] == [0.0, -0.5, -0.5, 0.0, 0.0, 0.0, -0.25]
