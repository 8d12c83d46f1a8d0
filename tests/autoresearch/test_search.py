"""Candidates against the search space, and Optuna's view of it (a real in-memory Optuna study)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from autoresearch.errors import CandidateError
from autoresearch.search import (
    candidate_from_params,
    check_candidate,
    distributions,
    reward_spec,
    trial_config_of,
)
from autoresearch.spec import load_study_spec

SPEC = load_study_spec(Path(__file__).resolve().parents[2] / "experiments" / "text2sql_tiny.yaml")


def test_every_searched_name_has_a_distribution() -> None:
    found = distributions(SPEC)
    assert set(found) == {"learning_rate", "batch_size", "loss", "reward.format", "reward.length_penalty"}
    assert found["learning_rate"].log and found["loss"].choices == ("importance_sampling", "ppo")


def test_reward_spec_keeps_execution_match_and_drops_zero_weights() -> None:
    spec = reward_spec(SPEC, {"format": 0.2, "length_penalty": 0.0}).model_dump(mode="json")
    assert spec["components"][0] == {"kind": "execution_match", "weight": 1.0, "databases": "all"}
    assert spec["components"][1:] == [{"kind": "format", "weight": 0.2}]


@pytest.mark.parametrize(
    ("params", "weights", "reason"),
    [
        ({"learning_rate": 0.5}, {}, r"learning_rate=0.5 is outside the search space \(float in \[0.0001, 0.01\], log"),
        ({"batch_size": 3}, {}, r"batch_size=3 is outside the search space \(one of \[1, 2\]\)"),
        ({"loss": "dro"}, {}, "loss='dro' is outside"),
        ({"batch_size": "2"}, {}, "batch_size='2' is outside"),
        ({"max_tokens": 8}, {}, "'max_tokens' is not searched"),
        ({}, {"schema_linking": 0.1}, "'reward.schema_linking' is not searched"),
        ({}, {"format": 0.9}, r"reward.format=0.9 is outside the search space \(float in \[0, 0.5\]\)"),
    ],
)
def test_a_candidate_outside_the_space_is_refused_with_the_reason(params: dict, weights: dict, reason: str) -> None:
    with pytest.raises(CandidateError, match=reason):
        check_candidate(SPEC, params, weights)


def test_an_enqueued_candidate_comes_back_from_optuna_with_the_rest_sampled() -> None:
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0))
    check_candidate(SPEC, {"learning_rate": 2e-3, "loss": "ppo"}, {"format": 0.25})
    study.enqueue_trial({"learning_rate": 2e-3, "loss": "ppo", "reward.format": 0.25})
    trial = study.ask(distributions(SPEC))
    candidate = candidate_from_params(trial.params, "try PPO with a format bonus", "llm")
    assert candidate.params["learning_rate"] == 2e-3 and candidate.params["loss"] == "ppo"
    assert candidate.params["batch_size"] in (1, 2) and candidate.reward_weights["format"] == 0.25
    assert 0.0 <= candidate.reward_weights["length_penalty"] <= 0.2
    config = trial_config_of(SPEC, candidate, "tiny-0")
    assert config.run_id == "tiny-0" and config.loss == "ppo" and config.learning_rate == 2e-3
    assert trial.params == candidate.optuna_params()
