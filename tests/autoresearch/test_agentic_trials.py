"""The trial's agentic mode: episodes that explore before they answer, on the tiny model against a real backend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tinker

from autoresearch.errors import ConfigurationError
from autoresearch.trials.backend import api_key
from autoresearch.trials.config import TrialConfig, parse_trial_config
from autoresearch.trials.data import PromptRenderer
from autoresearch.trials.rl_loop import run_trial
from autoresearch.trials.rollouts import EpisodeRollout
from autoresearch.trials.run_dir import RunDirectory
from tasks.text2sql.task import Text2SqlTask


@pytest.fixture(scope="module")
def renderer(backend_url: str, text2sql: Text2SqlTask) -> PromptRenderer:
    with tinker.ServiceClient(base_url=backend_url, api_key=api_key()) as service:
        tokenizer = service.create_lora_training_client(base_model="tiny-gemma3", rank=1).result().get_tokenizer()
    return PromptRenderer(text2sql, tokenizer, few_shot=1, shots_split="train", max_turns=3)


def test_an_episode_rollout_holds_its_turns_and_the_observations_between_them(
    renderer: PromptRenderer, text2sql: Text2SqlTask
) -> None:
    example = text2sql.split("dev")[0]
    rollout = EpisodeRollout(text2sql.episode(example, 3))
    explore = renderer.tokenizer.encode("Explore: SELECT COUNT(*) AS n FROM flights;", add_special_tokens=False)
    rollout.take_turn(explore, [-0.1] * len(explore), renderer)
    assert not rollout.episode.done
    observed = rollout.tokens[len(explore) :]
    assert renderer.decode(observed) == "\nResult:\nn\n500\n"
    assert rollout.trained == [True] * len(explore) + [False] * len(observed)
    assert rollout.logprobs == pytest.approx([-0.1] * len(explore) + [0.0] * len(observed))
    answer = renderer.tokenizer.encode(f"Answer: {example.gold_sql};", add_special_tokens=False)
    rollout.take_turn(answer, [-0.2] * len(answer), renderer)
    assert rollout.episode.done
    completion = rollout.completion()
    assert completion.trained_tokens == len(explore) + len(answer)
    assert completion.text == rollout.episode.transcript()
    assert text2sql.judge_episodes([rollout.episode]) == [True]


def test_the_agentic_prompt_and_its_warm_up_target_answer_in_the_turn_format(
    renderer: PromptRenderer, text2sql: Text2SqlTask
) -> None:
    example = text2sql.split("train")[5]
    assert renderer.decode(renderer.prompt(example).tokens).rstrip().endswith(f"Question: {example.question}")
    assert renderer.decode(renderer.gold_completion(example)) == f"Answer: {example.gold_sql};"


def test_an_agentic_trial_trains_and_evaluates_episodes(
    tiny_trial_config: TrialConfig, backend_url: str, tmp_path: Path
) -> None:
    config = tiny_trial_config.model_copy(
        update={"run_id": "agentic", "mode": "agentic", "max_turns": 2, "few_shot": 1, "steps": 2, "eval_size": 3}
    )
    result = run_trial(config, backend_url, tmp_path, progress=False)
    assert result.steps_completed == 2
    directory = RunDirectory(tmp_path / "agentic")
    metrics = directory.metrics.read()
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["completion_tokens_mean"] > 0 and 1 <= m["turns_mean"] <= 2 for m in metrics)
    evals = directory.evals.read()
    assert evals[-1]["step"] == 2 and len(evals[-1]["answers"]) == 3
    assert json.loads(directory.result_path.read_text())["held_out_accuracy"] == evals[-1]["accuracy"]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"mode": "agentic", "loss": "dro"}, "cannot train with loss 'dro'"),
        ({"mode": "agentic", "kl_coef": 0.1}, "no KL penalty yet"),
        ({"mode": "agentic", "max_turns": 1}, "max_turns: Input should be greater than or equal to 2"),
        ({"mode": "chatty"}, "mode: Input should be 'single_turn' or 'agentic'"),
    ],
)
def test_an_agentic_config_that_cannot_work_is_refused(fields: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_trial_config(fields)
