"""A trial renders its prompts in the model's chat format when the model has one: a real trial on the tiny Qwen2
(ChatML template) against a real backend, with the tokens it sends recorded on their way into the SDK."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import tinker
from support.backends import tiny_server_config

from autoresearch.errors import ConfigurationError
from autoresearch.trials.config import TrialConfig
from autoresearch.trials.data import PromptRenderer
from autoresearch.trials.rl_loop import run_trial
from autoresearch.trials.run_dir import RunDirectory
from tasks.text2sql.task import Text2SqlTask
from trainer_backend.models.tiny import ENDOFTEXT, TINY_QWEN2_NAME, train_tiny_chatml_tokenizer, train_tiny_tokenizer
from trainer_backend.server import running_server

USER_TURN = "<|im_start|>user\n"
GENERATION_PROMPT = "<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def chat_backend_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = tiny_server_config(tmp_path_factory.mktemp("backend"), base_model=TINY_QWEN2_NAME)
    with running_server(config) as server:
        yield server.url


@dataclass
class SdkTraffic:
    """What a trial hands the SDK: the prompts it samples, and the datums it trains on by loss function."""

    sampled_prompts: list[list[int]] = field(default_factory=list)
    trained: defaultdict[str, list[tinker.types.Datum]] = field(default_factory=lambda: defaultdict(list))


@pytest.fixture
def sdk_traffic(monkeypatch: pytest.MonkeyPatch) -> SdkTraffic:
    """The tokens a trial sends, recorded on their way into the SDK's sampling and training clients."""
    traffic = SdkTraffic()
    sample, forward_backward = tinker.SamplingClient.sample, tinker.TrainingClient.forward_backward

    def recording_sample(self, prompt, *args, **kwargs):
        traffic.sampled_prompts.append(prompt.to_ints())
        return sample(self, prompt, *args, **kwargs)

    def recording_forward_backward(self, data, loss_fn, *args, **kwargs):
        traffic.trained[loss_fn].extend(data)
        return forward_backward(self, data, loss_fn, *args, **kwargs)

    monkeypatch.setattr(tinker.SamplingClient, "sample", recording_sample)
    monkeypatch.setattr(tinker.TrainingClient, "forward_backward", recording_forward_backward)
    return traffic


def test_a_trial_on_a_chat_model_samples_and_warms_up_in_its_chat_format(
    chat_backend_url: str, tiny_trial_config: TrialConfig, tmp_path: Path, sdk_traffic: SdkTraffic
) -> None:
    config = tiny_trial_config.model_copy(
        update={"run_id": "chat", "base_model": TINY_QWEN2_NAME, "steps": 1, "eval_size": 2, "eval_interval": 1}
    )
    result = run_trial(config, chat_backend_url, tmp_path, progress=False)

    assert result.prompt_format == "chat"
    tokenizer = train_tiny_chatml_tokenizer()
    sampled_prompts, trained = sdk_traffic.sampled_prompts, sdk_traffic.trained["cross_entropy"]
    assert sampled_prompts
    for prompt in sampled_prompts:
        text = tokenizer.decode(prompt)
        # The task's prompt whole, as the one user turn, with the assistant's turn opened after it.
        assert text.startswith(USER_TURN + "Write one DuckDB SQL query") and text.endswith("SQL:" + GENERATION_PROMPT)
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert trained
    for datum in trained:
        weights = datum.loss_fn_inputs["weights"].to_numpy()
        targets = datum.loss_fn_inputs["target_tokens"].to_numpy()
        answer = [int(t) for t, w in zip(targets, weights, strict=True) if w > 0]
        # The warm-up's target is the assistant's answer, closed by the token that ends a sampled answer.
        assert answer[-1] == end_of_turn and end_of_turn not in answer[:-1]
        assert tokenizer.decode(answer[:-1]).startswith("SELECT ")
        assert tokenizer.decode(datum.model_input.to_ints()).endswith(
            "SQL:" + GENERATION_PROMPT + tokenizer.decode(answer[:-1])
        )


def test_auto_renders_plain_text_for_a_tokenizer_without_a_chat_template(text2sql: Text2SqlTask) -> None:
    tokenizer = train_tiny_tokenizer()
    renderer = PromptRenderer(text2sql, tokenizer, few_shot=0, shots_split="train", prompt_format="auto")
    example = text2sql.split("dev")[0]
    assert renderer.format == "plain"
    assert list(renderer.prompt(example).tokens) == tokenizer.encode(text2sql.prompt(example))


def test_chat_asked_of_a_tokenizer_without_a_template_names_the_fix(text2sql: Text2SqlTask) -> None:
    with pytest.raises(ConfigurationError, match=r"no chat template; use prompt_format: plain"):
        PromptRenderer(text2sql, train_tiny_tokenizer(), few_shot=0, shots_split="train", prompt_format="chat")


@pytest.mark.slow
def test_an_agentic_trial_on_a_chat_model_plays_its_episodes_as_conversations(
    chat_backend_url: str,
    tiny_trial_config: TrialConfig,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    sdk_traffic: SdkTraffic,
) -> None:
    # A random tiny model never writes SQL. So that every episode takes all its turns through the real sandbox, the
    # environment runs a query of its own for each reply (one that differs by turn, and by the reply's length so
    # that rewards differ within a group); the tokens sampled and trained are still the model's.
    episode = Text2SqlTask.episode

    def every_reply_a_query(self: Text2SqlTask, example: object, max_turns: int = 1, chat: bool = False) -> object:
        played = episode(self, example, max_turns, chat)
        step = played.step
        if max_turns > 1:
            played.step = lambda text: step(f"SELECT {len(played.turns)} AS turn, '{'x' * len(text)}' AS reply;")
        return played

    monkeypatch.setattr(Text2SqlTask, "episode", every_reply_a_query)
    update = {"run_id": "agentic-chat", "base_model": TINY_QWEN2_NAME, "mode": "agentic", "max_turns": 3}
    config = tiny_trial_config.model_copy(
        update={**update, "prompt_format": "chat", "steps": 1, "eval_size": 2, "eval_interval": 1}
    )
    result = run_trial(config, chat_backend_url, tmp_path, progress=False)

    assert result.prompt_format == "chat" and result.steps_completed == 1
    [metrics] = RunDirectory(tmp_path / "agentic-chat").metrics.read()
    assert metrics["turns_mean"] == 3
    tokenizer = train_tiny_chatml_tokenizer()
    texts = [tokenizer.decode(prompt) for prompt in sdk_traffic.sampled_prompts]
    first = [text for text in texts if text.count(USER_TURN) == 1]
    later = [text for text in texts if text.count(USER_TURN) > 1]
    opening = USER_TURN + "Write one DuckDB SQL query that answers the question."
    assert first and all(text.startswith(opening) for text in first)
    # Each later turn's prompt is the conversation so far: the query's result as a user turn, the reply opened.
    assert later and all(text.endswith(GENERATION_PROMPT) for text in texts)
    assert all(f"{USER_TURN}Result:\nturn | reply\n" in text for text in later)
    trained = [datum for loss_fn, data in sdk_traffic.trained.items() if loss_fn != "cross_entropy" for datum in data]
    assert trained
    for datum in trained:
        targets = datum.loss_fn_inputs["target_tokens"].to_numpy()
        advantages = datum.loss_fn_inputs["advantages"].to_numpy()
        replies = tokenizer.decode([int(t) for t, a in zip(targets, advantages, strict=True) if a != 0])
        context = tokenizer.decode([int(t) for t, a in zip(targets, advantages, strict=True) if a == 0])
        # The results were read, never trained on.
        assert "Result:" not in replies and context.count(f"{USER_TURN}Result:\nturn | reply\n") == 2


def test_a_trial_renders_a_chat_prompt_and_its_answer_as_the_cookbook_environment_does(text2sql: Text2SqlTask) -> None:
    pytest.importorskip("tinker_cookbook", reason="compares with the cookbook's renderer (the `cookbook` extra)")
    from tinker_cookbook.renderers import TrainOnWhat

    from tasks.chat_template_renderer import ChatTemplateRenderer

    tokenizer = train_tiny_chatml_tokenizer()
    # Qwen2.5's case: the template ends a turn with <|im_end|>, the tokenizer's end of sequence is another token.
    tokenizer.eos_token = ENDOFTEXT
    renderer = PromptRenderer(text2sql, tokenizer, few_shot=1, shots_split="train", prompt_format="chat")
    cookbook = ChatTemplateRenderer(tokenizer)
    example = text2sql.split("dev")[0]
    user = {"role": "user", "content": text2sql.prompt(example, renderer.shots)}
    assert list(renderer.prompt(example).tokens) == cookbook.build_generation_prompt([user]).to_ints()
    answer = {"role": "assistant", "content": f"{example.gold_sql};"}
    tokens, weights = cookbook.build_supervised_example([user, answer], TrainOnWhat.LAST_ASSISTANT_MESSAGE)
    trained = [token for token, weight in zip(tokens.to_ints(), weights.tolist(), strict=True) if weight > 0]
    assert list(renderer.gold_completion(example)) == trained
