"""The cookbook renderer built from a tokenizer's chat template: its tokens are the template's, turn by turn."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

pytest.importorskip(
    "tinker_cookbook",
    reason='needs the optional `cookbook` extra: pip install -e ".[cookbook]" && '
    "pip install --no-deps tinker-cookbook==0.6.1 tml-renderers==0.2.1",
)

from tinker_cookbook.renderers import Message, ParseTermination, RendererError, TrainOnWhat, get_renderer
from tinker_cookbook.tokenizer_utils import Tokenizer

from tasks.chat_template_renderer import CHAT_TEMPLATE_RENDERER, ChatTemplateRenderer
from tasks.text2sql.task import Text2SqlTask
from trainer_backend.models.tiny import (
    CHATML_TEMPLATE,
    ENDOFTEXT,
    IM_END,
    train_tiny_chatml_tokenizer,
    train_tiny_tokenizer,
)

REPOSITORY = Path(__file__).resolve().parents[2]
ANSWER = "SELECT count(*) FROM singer;"


@pytest.fixture(scope="module")
def chatml() -> Tokenizer:
    return train_tiny_chatml_tokenizer()


@pytest.fixture(scope="module")
def renderer(chatml: Tokenizer) -> ChatTemplateRenderer:
    made = get_renderer(CHAT_TEMPLATE_RENDERER, chatml, model_name="tiny-chatml")
    assert isinstance(made, ChatTemplateRenderer)
    return made


@pytest.fixture(scope="module")
def task_prompt() -> str:
    task = Text2SqlTask.bundled()
    return task.prompt(task.split("dev")[0], ())


def template_tokens(tokenizer: Tokenizer, messages: Sequence[Message], add_generation_prompt: bool) -> list[int]:
    rendered = tokenizer.apply_chat_template(
        [dict(message) for message in messages], add_generation_prompt=add_generation_prompt, tokenize=True
    )
    return list(rendered["input_ids"] if isinstance(rendered, Mapping) else rendered)


def conversation(task_prompt: str) -> list[Message]:
    return [
        Message(role="user", content=task_prompt),
        Message(role="assistant", content="Explore: SELECT name FROM singer;"),
        Message(role="user", content="Result:\nname\nJoe Sharp"),
    ]


def test_every_generation_prompt_of_an_episode_is_the_templates_and_extends_the_one_before(
    chatml: Tokenizer, renderer: ChatTemplateRenderer, task_prompt: str
) -> None:
    messages = conversation(task_prompt)
    first = renderer.build_generation_prompt(messages[:1]).to_ints()
    second = renderer.build_generation_prompt(messages).to_ints()
    assert first == template_tokens(chatml, messages[:1], add_generation_prompt=True)
    assert second == template_tokens(chatml, messages, add_generation_prompt=True)
    assert second[: len(first)] == first
    assert renderer.has_extension_property


def test_a_default_system_turn_of_the_template_opens_the_first_prompt(chatml: Tokenizer, task_prompt: str) -> None:
    # Qwen2.5's template writes its own system turn before a conversation that has none.
    qwen_like = train_tiny_chatml_tokenizer()
    qwen_like.chat_template = (
        "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "{% endif %}" + CHATML_TEMPLATE
    )
    made = ChatTemplateRenderer(qwen_like)
    messages = conversation(task_prompt)
    prompt = made.build_generation_prompt(messages).to_ints()
    assert prompt == template_tokens(qwen_like, messages, add_generation_prompt=True)
    assert qwen_like.decode(prompt).count("You are a helpful assistant.") == 1


def test_a_supervised_example_trains_exactly_what_the_model_samples(
    chatml: Tokenizer, renderer: ChatTemplateRenderer, task_prompt: str
) -> None:
    messages = [Message(role="user", content=task_prompt), Message(role="assistant", content=ANSWER)]
    model_input, weights = renderer.build_supervised_example(messages, TrainOnWhat.LAST_ASSISTANT_MESSAGE)
    tokens = model_input.to_ints()
    whole = template_tokens(chatml, messages, add_generation_prompt=False)
    # The template's newline after the end of the turn opens the next turn; no sample contains it.
    assert tokens == whole[: len(tokens)]
    assert chatml.decode(whole[len(tokens) :]) == "\n"
    trained = [token for token, weight in zip(tokens, weights.tolist(), strict=True) if weight > 0]
    assert chatml.decode(trained) == ANSWER + IM_END
    prompt = renderer.build_generation_prompt(messages[:1]).to_ints()
    assert tokens[: len(prompt)] == prompt


def test_a_sample_ends_at_the_templates_end_of_turn_token(chatml: Tokenizer, renderer: ChatTemplateRenderer) -> None:
    end_of_turn = chatml.convert_tokens_to_ids(IM_END)
    assert renderer.get_stop_sequences() == [end_of_turn]
    answer = chatml.encode(ANSWER, add_special_tokens=False)
    message, termination = renderer.parse_response([*answer, end_of_turn])
    assert (message["content"], termination) == (ANSWER, ParseTermination.STOP_SEQUENCE)
    message, termination = renderer.parse_response(answer[:3])
    assert termination == ParseTermination.MALFORMED
    assert ANSWER.startswith(str(message["content"]))


def test_an_end_of_sequence_token_other_than_the_end_of_turn_also_stops_a_sample(task_prompt: str) -> None:
    tokenizer = train_tiny_chatml_tokenizer()
    tokenizer.eos_token = ENDOFTEXT
    made = ChatTemplateRenderer(tokenizer)
    end_of_turn, eos = tokenizer.convert_tokens_to_ids([IM_END, ENDOFTEXT])
    assert made.get_stop_sequences() == [end_of_turn, eos]
    answer = tokenizer.encode(ANSWER, add_special_tokens=False)
    assert made.parse_response([*answer, eos]) == (Message(role="assistant", content=ANSWER), ParseTermination.EOS)


def test_a_tokenizer_without_a_chat_template_is_refused_naming_the_base_model_renderer() -> None:
    with pytest.raises(RendererError, match=r"no chat template.*'role_colon'"):
        ChatTemplateRenderer(train_tiny_tokenizer())


def test_a_template_whose_turns_end_without_a_special_token_is_refused() -> None:
    # Gemma's template on a tokenizer that does not know <end_of_turn>: a sample could never stop at it.
    tokenizer = train_tiny_tokenizer()
    tokenizer.chat_template = (REPOSITORY / "experiments" / "chat_templates" / "gemma.jinja").read_text()
    with pytest.raises(RendererError, match="not with a special token"):
        ChatTemplateRenderer(tokenizer)


def test_a_template_that_rewrites_earlier_turns_is_refused() -> None:
    # Marks only the last message, so appending a turn changes the one before it.
    tokenizer = train_tiny_chatml_tokenizer()
    tokenizer.chat_template = (
        "{% for message in messages %}<|im_start|>{{ message['role'] }}{% if loop.last %}*{% endif %}\n"
        "{{ message['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(RendererError, match="rewrites earlier turns"):
        ChatTemplateRenderer(tokenizer)
