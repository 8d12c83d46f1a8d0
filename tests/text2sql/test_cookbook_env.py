"""The task as a tinker-cookbook RL environment: prompts, rewards, and the cookbook's own RL loop on our backend."""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import pickle
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip(
    "tinker_cookbook",
    reason='needs the optional `cookbook` extra: pip install -e ".[cookbook]" && '
    "pip install --no-deps tinker-cookbook==0.6.1 tml-renderers==0.2.1",
)

import chz
import tinker
from support.backends import tiny_server_config
from tinker_cookbook.rl import train
from tinker_cookbook.rl.types import StepResult
from tinker_cookbook.tokenizer_utils import Tokenizer, register_tokenizer, unregister_tokenizer

from tasks.errors import SplitError
from tasks.text2sql.cookbook import (
    BASE_MODEL_RENDERER,
    Text2SqlDatasetBuilder,
    Text2SqlEnv,
    Text2SqlGroupBuilder,
    Text2SqlRLDataset,
)
from tasks.text2sql.errors import CookbookSetupError
from tasks.text2sql.prompts import tables_used
from tasks.text2sql.reward.rewards import ExecutionMatch, Format, LengthPenalty, ResultOverlap, RewardSpec
from trainer_backend.models.tiny import IM_END, TINY_MODEL_NAME, train_tiny_chatml_tokenizer, train_tiny_tokenizer
from trainer_backend.server import running_server

# Unit tests render with the tiny model's tokenizer under a name of their own; the loop test registers the server's.
TOKENIZER = "text2sql-tests/tiny-tokenizer"
# A tokenizer with a chat template (ChatML, Qwen2's), as an instruct model's.
CHAT_TOKENIZER = "text2sql-tests/tiny-chatml-tokenizer"
# Every component at its best for the gold query: 1 + 0.2 + 0.1.
SPEC = RewardSpec(components=(ExecutionMatch(weight=1.0), ResultOverlap(weight=0.2), Format(weight=0.1)))
GOLD_REWARD = 1.3


def registered(name: str, tokenizer: Tokenizer) -> Iterator[Tokenizer]:
    """`tokenizer`, known to the cookbook as `name` until the fixture ends."""
    register_tokenizer(name, lambda: tokenizer)
    yield tokenizer
    unregister_tokenizer(name)


@pytest.fixture(scope="module")
def tokenizer() -> Iterator[Tokenizer]:
    yield from registered(TOKENIZER, train_tiny_tokenizer())


@pytest.fixture(scope="module")
def chat_tokenizer() -> Iterator[Tokenizer]:
    yield from registered(CHAT_TOKENIZER, train_tiny_chatml_tokenizer())


def build(**overrides: object) -> tuple[Text2SqlRLDataset, Text2SqlRLDataset | None]:
    """The (training, held-out) datasets of a builder with small batches and SPEC, changed by `overrides`."""
    settings = {"model_name_for_tokenizer": TOKENIZER, "batch_size": 2, "group_size": 2, "reward_spec": SPEC}
    return asyncio.run(Text2SqlDatasetBuilder(**{**settings, **overrides})())


def first_group() -> Text2SqlGroupBuilder:
    return build()[0].get_batch(0)[0]


def first_env() -> Text2SqlEnv:
    envs = asyncio.run(first_group().make_envs())
    assert len(envs) == 2
    return envs[0]


def step_with(env: Text2SqlEnv, tokenizer: Tokenizer, text: str) -> StepResult:
    """Step with the tokens a model would sample for `text`, the renderer's stop sequence included."""
    action = tokenizer.encode(f" {text}\n\nUser:", add_special_tokens=False)
    return asyncio.run(env.step(action))


def test_the_observation_is_the_task_prompt_as_the_user_turn(tokenizer: Tokenizer) -> None:
    env = first_env()
    observation, stop = asyncio.run(env.initial_observation())
    text = tokenizer.decode(observation.to_ints())
    assert f"Question: {env.example.question}" in text
    assert "CREATE TABLE" in text
    assert text.endswith("SQL:\n\nAssistant:")
    assert stop == ["\n\nUser:"]


def test_a_tokenizer_with_a_chat_template_gets_its_own_chat_format_and_stop_token(
    chat_tokenizer: Tokenizer,
) -> None:
    group = build(model_name_for_tokenizer=CHAT_TOKENIZER)[0].get_batch(0)[0]
    env = asyncio.run(group.make_envs())[0]
    observation, stop = asyncio.run(env.initial_observation())
    user_turn = [{"role": "user", "content": env.prompt}]
    template = chat_tokenizer.apply_chat_template(user_turn, add_generation_prompt=True, return_dict=True)
    assert observation.to_ints() == template["input_ids"]
    end_of_turn = chat_tokenizer.convert_tokens_to_ids(IM_END)
    assert stop == [end_of_turn]
    # Rollout workers rebuild the renderer from its registered name.
    env = asyncio.run(pickle.loads(pickle.dumps(group)).make_envs())[0]
    action = [*chat_tokenizer.encode(f"{env.example.gold_sql};", add_special_tokens=False), end_of_turn]
    result = asyncio.run(env.step(action))
    assert result.reward == pytest.approx(GOLD_REWARD)
    assert result.next_stop_condition == [end_of_turn]


def test_the_gold_sql_earns_the_specs_gold_reward(tokenizer: Tokenizer) -> None:
    env = first_env()
    result = step_with(env, tokenizer, f"{env.example.gold_sql};")
    assert result.episode_done
    assert result.reward == pytest.approx(GOLD_REWARD)
    assert result.metrics["execution_match"] == 1.0
    assert result.metrics["reward/result_overlap"] == pytest.approx(0.2)
    assert result.metrics["reward/format"] == pytest.approx(0.1)
    assert result.metrics["status/ok"] == 1.0


def test_garbage_earns_nothing(tokenizer: Tokenizer) -> None:
    env = first_env()
    result = step_with(env, tokenizer, "I am not sure what the answer is.")
    assert result.reward == 0.0
    assert result.metrics["execution_match"] == 0.0
    assert result.metrics["status/ok"] == 0.0


def test_an_agentic_env_shows_each_exploration_as_a_user_turn_and_rewards_the_answer(tokenizer: Tokenizer) -> None:
    spec = RewardSpec.parse({"components": [{"kind": "execution_match"}, {"kind": "turn_penalty", "weight": 0.1}]})
    group = build(agentic=True, max_turns=3, few_shot=1, reward_spec=spec)[0].get_batch(0)[0]
    [env, _] = asyncio.run(group.make_envs())
    assert isinstance(env, Text2SqlEnv) and env.episode.limits.max_turns == 3
    observation, _ = asyncio.run(env.initial_observation())
    prompt = tokenizer.decode(observation.to_ints())
    assert "up to 2 exploratory queries" in prompt and "Explore: SELECT * FROM" in prompt
    assert prompt.endswith(f"Question: {env.example.question}\n\nAssistant:")
    table = sorted(tables_used(env.example.gold_sql))[0]
    explored = step_with(env, tokenizer, f"Explore: SELECT COUNT(*) AS n FROM {table};")
    assert not explored.episode_done and explored.reward == 0.0
    shown = tokenizer.decode(explored.next_observation.to_ints())
    # The conversation so far, then the query's result (a row count) as the next user turn.
    assert shown.startswith(prompt)
    assert re.search(r"\n\nUser: Result:\nn\n\d+\n\nAssistant:$", shown), shown[-200:]
    answered = step_with(env, tokenizer, f"Answer: {env.example.gold_sql};")
    assert answered.episode_done and answered.reward == pytest.approx(1.0 - 0.1)
    assert answered.metrics["turns"] == 2.0 and answered.metrics["answered"] == 1.0
    assert answered.logs["transcript"].startswith("Explore: SELECT COUNT(*)")


def test_a_chat_models_agentic_env_is_a_conversation_whose_last_query_answers(chat_tokenizer: Tokenizer) -> None:
    group = build(model_name_for_tokenizer=CHAT_TOKENIZER, agentic=True, max_turns=2)[0].get_batch(0)[0]
    [env, _] = asyncio.run(group.make_envs())
    assert group.chat and env.prompt.startswith("Write one DuckDB SQL query that answers the question.")
    end_of_turn = chat_tokenizer.convert_tokens_to_ids(IM_END)
    # A bare query, as a coder model writes it, is run and shown; with the turns spent, it is the answer.
    draft = [*chat_tokenizer.encode(f"{env.example.gold_sql};", add_special_tokens=False), end_of_turn]
    shown = asyncio.run(env.step(draft))
    assert not shown.episode_done
    assert chat_tokenizer.decode(shown.next_observation.to_ints()).endswith(
        f"This is your last reply: write `Answer:` followed by your final query.{IM_END}\n<|im_start|>assistant\n"
    )
    answered = asyncio.run(env.step([*chat_tokenizer.encode("It is right.", add_special_tokens=False), end_of_turn]))
    assert answered.episode_done and answered.metrics["execution_match"] == 1.0 and answered.metrics["turns"] == 2.0
    assert not build(agentic=True, max_turns=2)[0].get_batch(0)[0].chat  # role_colon: the base models' transcript


def test_the_held_out_split_is_the_test_dataset_with_one_rollout_per_question(tokenizer: Tokenizer) -> None:
    train_dataset, eval_dataset = build(eval_limit=3)
    assert eval_dataset is not None
    held_out = [group for index in range(len(eval_dataset)) for group in eval_dataset.get_batch(index)]
    assert len(held_out) == 3
    assert all(group.group_size == 1 for group in held_out)
    assert {group.example.db_id for group in held_out}.isdisjoint({e.db_id for e in train_dataset.examples})
    assert build(eval_split=None)[1] is None


def test_few_shot_prompts_never_show_the_question_being_asked(tokenizer: Tokenizer) -> None:
    train_dataset, _ = build(few_shot=2)
    shown = train_dataset.few_shot[0]
    position = train_dataset.examples.index(shown)
    group = train_dataset.get_batch(position // 2)[position % 2]
    assert group.example == shown
    assert group.prompt.count("Question:") == 3
    assert group.prompt.count(f"Question: {shown.question}") == 1


def test_the_seed_shuffles_the_training_order(tokenizer: Tokenizer) -> None:
    first, again, other = (build(seed=seed)[0].examples for seed in (1, 1, 2))
    assert first == again
    assert first != other
    assert sorted(e.id for e in first) == sorted(e.id for e in other)


def test_group_builders_survive_pickling_for_rollout_workers(tokenizer: Tokenizer) -> None:
    group = first_group()
    copy = pickle.loads(pickle.dumps(group))
    env = asyncio.run(copy.make_envs())[0]
    assert step_with(env, tokenizer, f"{group.example.gold_sql};").reward == pytest.approx(GOLD_REWARD)


def test_the_reward_spec_is_json_on_the_command_line(tokenizer: Tokenizer) -> None:
    made = chz.entrypoint(
        Text2SqlDatasetBuilder,
        argv=[
            f"model_name_for_tokenizer={TOKENIZER}",
            "batch_size=4",
            "group_size=8",
            'reward_spec={"components": [{"kind": "execution_match", "databases": "primary"}]}',
        ],
    )
    assert made.reward_spec == RewardSpec(components=(ExecutionMatch(databases="primary"),))


def test_a_renderer_that_does_not_fit_the_tokenizer_is_refused_by_name(tokenizer: Tokenizer) -> None:
    with pytest.raises(CookbookSetupError, match=f"'qwen3'.*{BASE_MODEL_RENDERER}"):
        build(renderer_name="qwen3")


def test_an_unknown_split_names_the_splits_that_exist(tokenizer: Tokenizer) -> None:
    with pytest.raises(SplitError, match=r"no split .validation.*dev"):
        build(split="validation")


def test_without_the_extra_the_import_error_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tinker_cookbook", None)
    monkeypatch.delitem(sys.modules, "tasks.text2sql.cookbook")
    with pytest.raises(ModuleNotFoundError, match=r"tinker_cookbook is missing.*\.\[cookbook\]"):
        importlib.import_module("tasks.text2sql.cookbook")


@pytest.fixture
def root_logging_restored() -> Iterator[None]:
    """The cookbook's loop replaces the root logger's handlers with its own; put pytest's back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for handler in root.handlers:
        if handler not in handlers:
            handler.close()
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.slow
@pytest.mark.parametrize("agentic", [False, True], ids=["single-turn", "agentic"])
def test_the_cookbooks_own_rl_loop_trains_on_the_task_against_our_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, root_logging_restored: None, agentic: bool
) -> None:
    monkeypatch.setenv("TINKER_API_KEY", "tml-tests")
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    server_config = tiny_server_config(tmp_path / "backend")
    log_path = tmp_path / "run"
    with running_server(server_config) as server:
        # The loop loads its tokenizer by model name from the Hugging Face Hub; the tiny model is not there, so
        # register the tokenizer our server hands the SDK instead (get_info names its folder).
        with tinker.ServiceClient(base_url=server.url) as service:
            served = service.create_lora_training_client(base_model=TINY_MODEL_NAME, rank=4).result().get_tokenizer()
        register_tokenizer(TINY_MODEL_NAME, lambda: served)
        try:
            config = train.Config(
                learning_rate=1e-3,
                dataset_builder=Text2SqlDatasetBuilder(
                    model_name_for_tokenizer=TINY_MODEL_NAME,
                    batch_size=2,
                    group_size=2,
                    eval_limit=2,
                    # A random model never answers right; a length penalty from the first character gives the
                    # group different rewards, so each step is a real importance-sampling update.
                    reward_spec=RewardSpec(components=(ExecutionMatch(), LengthPenalty(free_chars=0, scale_chars=100))),
                    agentic=agentic,
                    max_turns=2,
                ),
                model_name=TINY_MODEL_NAME,
                recipe_name="text2sql_cookbook_test",
                renderer_name=BASE_MODEL_RENDERER,
                max_tokens=16,
                log_path=str(log_path),
                base_url=server.url,
                loss_fn="importance_sampling",
                lora_rank=4,
                max_steps=2,
                eval_every=2,
                save_every=0,
            )
            asyncio.run(train.main(config))
        finally:
            unregister_tokenizer(TINY_MODEL_NAME)

    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]
    trained = [row for row in rows if "env/all/reward/total" in row]
    assert [row["step"] for row in trained] == [0, 1]
    for row in trained:
        assert row["env/all/total_episodes"] == 4
        assert "env/all/execution_match" in row
        if agentic:
            # Every episode took one or two turns (an exploration, then the limit or an answer).
            assert 1.0 <= row["env/all/turns"] <= 2.0 and "env/all/answered" in row
        else:
            assert row["env/all/reward/length_penalty"] < 0
        # Sampled logprobs and the training forward's agree: the loop stays on-policy against our backend.
        assert abs(row["optim/kl_sample_train_v1"]) < 1e-3
    evaluated = [row for row in rows if "test/env/all/execution_match" in row]
    assert [row["step"] for row in evaluated] == [0, 2]
    assert all(row["test/env/all/total_episodes"] == 2 for row in evaluated)
    checkpoints = [json.loads(line) for line in (log_path / "checkpoints.jsonl").read_text().splitlines()]
    assert checkpoints[-1]["name"] == "final"
    assert checkpoints[-1]["sampler_path"].startswith("tinker://")
