"""Agentic episodes in the chat format: an episode's tokens are what the chat template renders of the whole
conversation, only the model's replies are trained, the cookbook environment renders the same conversation, and the
Qwen agentic recipe differs from the single-turn one only in its mode. Scripted replies on the tiny ChatML tokenizer
with the bare ChatML template and with Qwen2.5's, and Qwen2.5's end of sequence (another token than the one that
ends a turn)."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from autoresearch.trials.config import load_trial_config
from autoresearch.trials.data import PromptRenderer
from autoresearch.trials.rollouts import EpisodeRollout
from tasks.chat_template import Tokenizer
from tasks.text2sql.dataset import Example
from tasks.text2sql.task import Text2SqlTask
from trainer_backend.models.tiny import ENDOFTEXT, IM_END, train_tiny_chatml_tokenizer

EXPERIMENTS = Path(__file__).parents[2] / "experiments" / "trials"
# Qwen2.5-Coder-0.5B-Instruct's chat template, as its tokenizer carries it (Apache-2.0).
QWEN2_5_CHAT_TEMPLATE = Path(__file__).parents[1] / "support" / "qwen2_5_chat_template.jinja"


@pytest.fixture(scope="module", params=["ChatML", "Qwen2.5"])
def chatml(request: pytest.FixtureRequest) -> Tokenizer:
    """The tiny ChatML tokenizer with the bare ChatML template, or with Qwen2.5's own (a default system turn first)."""
    tokenizer = train_tiny_chatml_tokenizer()
    tokenizer.eos_token = ENDOFTEXT
    if request.param == "Qwen2.5":
        tokenizer.chat_template = QWEN2_5_CHAT_TEMPLATE.read_text()
    return tokenizer


@pytest.fixture(scope="module")
def renderer(text2sql: Text2SqlTask, chatml: Tokenizer) -> PromptRenderer:
    return PromptRenderer(text2sql, chatml, few_shot=1, shots_split="train", max_turns=3, prompt_format="chat")


@pytest.fixture
def flights(text2sql: Text2SqlTask) -> Example:
    return text2sql.split("dev")[0]


def play(renderer: PromptRenderer, example: Example, replies: list[tuple[str, bool]]) -> EpisodeRollout:
    """An episode whose replies are sampled as `replies` say: each text, and whether the sample ran through the
    end-of-turn token (True) or was cut at a stop string (False)."""
    rollout = EpisodeRollout(renderer.episode(example))
    end_of_turn = renderer.tokenizer.convert_tokens_to_ids(IM_END)
    for index, (text, through_end_of_turn) in enumerate(replies):
        closing = [end_of_turn] if through_end_of_turn else []
        tokens = renderer.tokenizer.encode(text, add_special_tokens=False) + closing
        rollout.take_turn(tokens, [-0.5 - index] * len(tokens), renderer)
    return rollout


def conversation(renderer: PromptRenderer, example: Example, rollout: EpisodeRollout) -> list[dict[str, str]]:
    """The episode as chat messages: the task's prompt, then each reply and what the task answered it with."""
    messages = [{"role": "user", "content": renderer.task.prompt(example, renderer.shots, 3, chat=True)}]
    turns = rollout.episode.turns
    for index, turn in enumerate(turns):
        messages.append({"role": "assistant", "content": turn.text})
        if index < len(turns) - 1:  # the model read what the task answered, and replied
            messages.append({"role": "user", "content": turn.observation})
    return messages


REPLIES = [
    ("SELECT no_such_column FROM flights;", False),
    ("```sql\nSELECT COUNT(*) AS n FROM flights\n```", True),
]


def test_a_chat_episode_is_what_the_chat_template_renders_of_the_conversation(
    renderer: PromptRenderer, chatml: Tokenizer, flights: Example
) -> None:
    rollout = play(renderer, flights, [*REPLIES, (f"Answer: {flights.gold_sql};", False)])
    assert rollout.episode.done and rollout.episode.answer == flights.gold_sql
    messages = conversation(renderer, flights, rollout)
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert messages[2]["content"].startswith("Error: ") and messages[4]["content"].startswith("Result:\nn\n")
    template = chatml.apply_chat_template(messages, return_dict=True)["input_ids"]
    episode = [*renderer.prompt(flights).tokens, *rollout.tokens]
    # The last reply was cut at ';': the template closes it, and the newline after it opens a turn that never comes.
    assert template == [*episode, *chatml.encode(f"{IM_END}\n", add_special_tokens=False)]


def test_only_the_replies_are_trained(renderer: PromptRenderer, chatml: Tokenizer, flights: Example) -> None:
    rollout = play(renderer, flights, [*REPLIES, (f"Answer: {flights.gold_sql};", False)])
    completion = rollout.completion()
    assert completion.turns == 3 and completion.trained is not None
    pairs = zip(completion.tokens, completion.trained, strict=True)
    runs = [[token for token, _ in run] for trained, run in itertools.groupby(pairs, lambda pair: pair[1]) if trained]
    assert [chatml.decode(run) for run in runs] == [
        REPLIES[0][0],
        f"{REPLIES[1][0]}{IM_END}",
        f"Answer: {flights.gold_sql};",
    ]
    # The sampler's log-probs on the replies, none on what the task wrote.
    logprobs = [lp for lp, trained in zip(completion.logprobs, completion.trained, strict=True) if not trained]
    assert logprobs and set(logprobs) == {0.0}


def test_the_cookbook_environment_renders_the_same_conversation(
    renderer: PromptRenderer, text2sql: Text2SqlTask, chatml: Tokenizer, flights: Example
) -> None:
    pytest.importorskip("tinker_cookbook", reason="compares with the cookbook's environment (the `cookbook` extra)")
    from tasks.chat_template_renderer import ChatTemplateRenderer
    from tasks.text2sql.cookbook import Text2SqlEnv

    prompt = renderer.task.prompt(flights, renderer.shots, 3, chat=True)
    database = text2sql.dataset.database(flights.db_id)
    env = Text2SqlEnv(
        flights, prompt, database, ChatTemplateRenderer(chatml), text2sql.default_reward_spec, max_turns=3, chat=True
    )
    observation, _ = asyncio.run(env.initial_observation())
    assert observation.to_ints() == list(renderer.prompt(flights).tokens)
    # The cookbook's samples stop at the end-of-turn token.
    replies = [(text, True) for text, _ in REPLIES]
    rollout = play(renderer, flights, replies)
    for text, _ in replies:
        action = [*chatml.encode(text, add_special_tokens=False), chatml.convert_tokens_to_ids(IM_END)]
        step = asyncio.run(env.step(action))
    assert not step.episode_done
    assert step.next_observation.to_ints() == [*renderer.prompt(flights).tokens, *rollout.tokens]


def test_auto_renders_agentic_episodes_in_the_chat_format_of_a_tokenizer_with_a_template(
    text2sql: Text2SqlTask, chatml: Tokenizer, flights: Example
) -> None:
    renderer = PromptRenderer(text2sql, chatml, few_shot=0, shots_split="train", max_turns=3, prompt_format="auto")
    assert renderer.format == "chat"
    text = chatml.decode(renderer.prompt(flights).tokens)
    assert "<|im_start|>user\nWrite one DuckDB SQL query that answers the question." in text
    assert text.endswith(f"{IM_END}\n<|im_start|>assistant\n")
    assert chatml.decode(renderer.gold_completion(flights)) == f"Answer: {flights.gold_sql};{IM_END}"


def test_the_qwen_agentic_recipe_is_the_single_turn_one_in_agentic_mode() -> None:
    agentic = load_trial_config(EXPERIMENTS / "text2sql_qwen_agentic.yaml")
    single_turn = load_trial_config(EXPERIMENTS / "text2sql_qwen.yaml")
    assert (agentic.mode, agentic.max_turns, agentic.prompt_format) == ("agentic", 3, "chat")
    changed = {"mode", "max_turns", "prompt_format"}
    assert agentic.model_dump(exclude=changed) == single_turn.model_dump(exclude=changed)
