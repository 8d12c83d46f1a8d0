"""The OpenAI-compatible routes, driven by the official `openai` client: the same tokens and logprobs as Tinker's
`sample` for the same request, sampler checkpoints by their tinker:// path, chat through a given template, streams
that add up to the answer, and JSON schemas that every output follows."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import tinker
from pydantic import BaseModel, ConfigDict
from support.backends import GEMMA_CHAT_TEMPLATE, TINY, tiny_server_config
from support.trained_adapters import trained_adapter
from support.trainer import LOGPROB_ROUNDING, SQL
from tinker import types

from trainer_backend.server import RunningServer, running_server

KEY = "tml-openai-one"
OTHER_KEY = "tml-openai-two"
PROMPT = "Question: how many employees earn more than 50000?\nSQL:"


class Proposal(BaseModel):
    """What the schema below allows, checked again on the client's side."""

    model_config = ConfigDict(extra="forbid")
    learning_rate_exponent: int
    keep: bool
    loss: str


PROPOSAL_SCHEMA = {
    "type": "object",
    "properties": {
        "learning_rate_exponent": {"type": "integer", "minimum": -6, "maximum": -1},
        "keep": {"type": "boolean"},
        "loss": {"enum": ["importance_sampling", "ppo", "dro"]},
    },
    "required": ["learning_rate_exponent", "keep", "loss"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def api_key() -> str:
    return KEY


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("openai")
    config = tiny_server_config(root, api_keys=[KEY, OTHER_KEY], chat_template=GEMMA_CHAT_TEMPLATE)
    with running_server(config) as running:
        yield running


@pytest.fixture(scope="module")
def oai(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def trained_sampler_path(client: tinker.ServiceClient) -> str:
    """Sampler weights a few large steps away from the base, so that they answer differently."""
    training = trained_adapter(client, SQL, seed=1, steps=3)
    return training.save_weights_for_sampler("for-openai").result(timeout=30).path


def tinker_sample(client: tinker.ServiceClient, prompt: list[int], model_path: str | None = None, **params: object):
    sampler = (
        client.create_sampling_client(model_path=model_path).result()
        if model_path
        else client.create_sampling_client(base_model=TINY).result()
    )
    return sampler.sample(
        prompt=types.ModelInput.from_ints(prompt), num_samples=1, sampling_params=types.SamplingParams(**params)
    ).result(timeout=60)


def without_eos(tokens: list[int], eos: int) -> list[int]:
    return tokens[:-1] if tokens and tokens[-1] == eos else tokens


def test_models_lists_the_base_and_the_keys_own_sampler_checkpoints(
    server: RunningServer, oai: openai.OpenAI, trained_sampler_path: str
) -> None:
    mine = [m.id for m in oai.models.list().data]
    assert mine[0] == TINY and trained_sampler_path in mine
    theirs = openai.OpenAI(base_url=f"{server.url}/v1", api_key=OTHER_KEY, max_retries=0).models.list()
    assert [m.id for m in theirs.data] == [TINY]


def test_a_greedy_completion_is_tinkers_sample_of_the_same_prompt(
    oai: openai.OpenAI, client: tinker.ServiceClient, trained_sampler_path: str
) -> None:
    tokenizer = client.create_lora_training_client(base_model=TINY, rank=4).result().get_tokenizer()
    prompt = tokenizer.encode(PROMPT)
    for model, path in ((TINY, None), (trained_sampler_path, trained_sampler_path)):
        reference = tinker_sample(client, prompt, path, max_tokens=12, temperature=0.0).sequences[0]
        answer = oai.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0, logprobs=0)
        tokens = without_eos(list(reference.tokens), tokenizer.eos_token_id)
        assert answer.choices[0].text == tokenizer.decode(tokens, skip_special_tokens=False)
        assert answer.choices[0].logprobs.token_logprobs == pytest.approx(
            reference.logprobs[: len(tokens)], abs=LOGPROB_ROUNDING
        )
        assert answer.usage.prompt_tokens == len(prompt) and answer.usage.completion_tokens == len(tokens)
    base = oai.completions.create(model=TINY, prompt=PROMPT, max_tokens=12, temperature=0).choices[0].text
    trained = oai.completions.create(model=trained_sampler_path, prompt=PROMPT, max_tokens=12, temperature=0)
    assert trained.choices[0].text != base


def test_seeded_samples_repeat_and_a_stream_adds_up_to_the_answer(oai: openai.OpenAI) -> None:
    asked = {"model": TINY, "prompt": PROMPT, "max_tokens": 10, "temperature": 1.0, "seed": 7, "n": 2}
    first = [c.text for c in oai.completions.create(**asked).choices]
    assert first == [c.text for c in oai.completions.create(**asked).choices]
    streamed = ["", ""]
    for chunk in oai.completions.create(**asked, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
    assert streamed == first


def test_a_stream_sends_text_as_the_tokens_are_drawn(oai: openai.OpenAI) -> None:
    """400 tokens that cannot stop early: the first text arrives long before the last."""
    started = time.monotonic()
    arrivals = []
    for chunk in oai.completions.create(
        model=TINY, prompt=PROMPT, max_tokens=400, temperature=1.0, seed=1, stream=True, extra_body={"ignore_eos": True}
    ):
        if chunk.choices[0].text:
            arrivals.append(time.monotonic() - started)
    total = time.monotonic() - started
    assert len(arrivals) > 20
    assert arrivals[0] < 0.5 * total, (arrivals[0], total)


def test_a_stream_with_stop_strings_adds_up_to_the_answer_without_them(oai: openai.OpenAI) -> None:
    asked = {"model": TINY, "prompt": PROMPT, "max_tokens": 30, "temperature": 1.0, "seed": 4}
    free = oai.completions.create(**asked).choices[0].text
    stop = free[10:13]  # a piece of the text the seed gives, so the answer stops there
    answer = oai.completions.create(**asked, stop=[stop]).choices[0]
    assert answer.finish_reason == "stop" and stop not in answer.text and free.startswith(answer.text)
    streamed = "".join(chunk.choices[0].text for chunk in oai.completions.create(**asked, stop=[stop], stream=True))
    assert streamed == answer.text


def test_chat_renders_the_given_template_and_answers_as_the_completion_of_it(
    oai: openai.OpenAI, client: tinker.ServiceClient
) -> None:
    messages = [{"role": "system", "content": "Answer in SQL."}, {"role": "user", "content": "How many employees?"}]
    chat = oai.chat.completions.create(model=TINY, messages=messages, max_tokens=10, temperature=0, logprobs=True)
    rendered = "<bos>" + "".join(f"<start_of_turn>{m['role']}\n{m['content']}<end_of_turn>\n" for m in messages)
    tokenizer = client.create_lora_training_client(base_model=TINY, rank=4).result().get_tokenizer()
    prompt = tokenizer.encode(rendered + "<start_of_turn>model\n", add_special_tokens=False)
    reference = tinker_sample(client, prompt, max_tokens=10, temperature=0.0).sequences[0]
    tokens = without_eos(list(reference.tokens), tokenizer.eos_token_id)
    assert chat.choices[0].message.content == tokenizer.decode(tokens, skip_special_tokens=False)
    assert [t.logprob for t in chat.choices[0].logprobs.content] == pytest.approx(
        reference.logprobs[: len(tokens)], abs=LOGPROB_ROUNDING
    )
    streamed = oai.chat.completions.create(model=TINY, messages=messages, max_tokens=10, temperature=0, stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in streamed) == chat.choices[0].message.content


def test_a_model_without_a_chat_template_points_to_completions(tmp_path: Path) -> None:
    """The tiny model's tokenizer has no template, and this server was given none."""
    with running_server(tiny_server_config(tmp_path)) as plain:
        plain_client = openai.OpenAI(base_url=f"{plain.url}/v1", api_key="tml-anyone", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="/v1/completions"):
            plain_client.chat.completions.create(model=TINY, messages=[{"role": "user", "content": "hi"}])


def test_json_schema_output_always_parses_validates_and_reports_constrained_logprobs(
    oai: openai.OpenAI, client: tinker.ServiceClient
) -> None:
    answer = oai.chat.completions.create(
        model=TINY,
        messages=[{"role": "user", "content": "Propose a learning rate."}],
        max_tokens=120,
        temperature=1.0,
        seed=3,
        n=6,
        logprobs=True,
        response_format={"type": "json_schema", "json_schema": {"name": "proposal", "schema": PROPOSAL_SCHEMA}},
    )
    tokenizer = client.create_lora_training_client(base_model=TINY, rank=4).result().get_tokenizer()
    base = client.create_sampling_client(base_model=TINY).result()
    raised = 0
    for choice in answer.choices:
        assert choice.finish_reason == "stop"
        proposal = Proposal.model_validate_json(choice.message.content)
        assert -6 <= proposal.learning_rate_exponent <= -1
        assert proposal.loss in ("importance_sampling", "ppo", "dro")
        # Each token's logprob is under the constrained distribution: at least the model's own, and above it
        # wherever the schema ruled tokens out.
        prompt = tokenizer.encode(
            "<bos><start_of_turn>user\nPropose a learning rate.<end_of_turn>\n<start_of_turn>model\n",
            add_special_tokens=False,
        )
        completion = tokenizer.encode(choice.message.content, add_special_tokens=False)
        constrained = [t.logprob for t in choice.logprobs.content]
        if [tokenizer.decode([t]) for t in completion] != [t.token for t in choice.logprobs.content]:
            continue  # the text re-tokenizes differently; the token-level comparison needs the same tokens
        unconstrained = base.compute_logprobs(types.ModelInput.from_ints(prompt + completion)).result(timeout=60)
        own = [float(lp) for lp in unconstrained[len(prompt) :]]
        assert all(c >= o - LOGPROB_ROUNDING for c, o in zip(constrained, own, strict=True))
        raised += sum(c > o + 0.01 for c, o in zip(constrained, own, strict=True))
    assert raised > 0


def test_json_object_mode_gives_an_object(oai: openai.OpenAI) -> None:
    answer = oai.completions.create(
        model=TINY, prompt=PROMPT, max_tokens=40, temperature=0, extra_body={"response_format": {"type": "json_object"}}
    )
    text = answer.choices[0].text
    assert answer.choices[0].finish_reason == "length" or isinstance(json.loads(text), dict)
    assert text.startswith("{")


@pytest.mark.parametrize(
    ("model", "extra", "named"),
    [
        (TINY, {"presence_penalty": 0.5}, "presence_penalty"),
        (TINY, {"logit_bias": {"5": 10}}, "logit_bias"),
        (TINY, {"logprobs": 3}, "logprobs=3"),
        (TINY, {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}}, "schema"),
        ("tinker://someone-else:train:0/sampler_weights/x", {}, "not found"),
        ("gpt-4o", {}, "/v1/models"),
    ],
)
def test_what_cannot_be_honoured_exactly_is_refused_by_name(
    oai: openai.OpenAI, model: str, extra: dict[str, object], named: str
) -> None:
    with pytest.raises(openai.APIStatusError) as refused:
        oai.completions.create(model=model, prompt=PROMPT, max_tokens=4, extra_body=extra)
    assert refused.value.status_code in (400, 404) and named in refused.value.message


def test_neutral_values_are_accepted_and_keys_are_checked(server: RunningServer, oai: openai.OpenAI) -> None:
    answer = oai.completions.create(model=TINY, prompt=PROMPT, max_tokens=3, presence_penalty=0, user="someone")
    assert answer.choices[0].text is not None
    stranger = openai.OpenAI(base_url=f"{server.url}/v1", api_key="tml-nobody-at-all", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        stranger.models.list()


def test_a_prompt_of_token_ids_is_the_prompt_those_ids_spell(oai: openai.OpenAI, client: tinker.ServiceClient) -> None:
    tokenizer = client.create_lora_training_client(base_model=TINY, rank=4).result().get_tokenizer()
    by_ids = oai.completions.create(model=TINY, prompt=tokenizer.encode(PROMPT), max_tokens=6, temperature=0)
    by_text = oai.completions.create(model=TINY, prompt=PROMPT, max_tokens=6, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage.prompt_tokens == len(tokenizer.encode(PROMPT))
