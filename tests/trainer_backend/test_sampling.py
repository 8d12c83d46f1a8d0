"""The sampling engine against plain full forwards of tiny random models, with and without a LoRA adapter.

Every test runs on a Gemma 3 (softcapped logits; its sliding window of 8 is shorter than prompt plus completion, so
the sliding layers' cache eviction is exercised) and on a Qwen2 (biases on q/k/v, an untied head); every check
recomputes the logits without a cache, through the model's own forward.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
import torch.nn.functional as F
from peft import LoraConfig, PeftModel, get_peft_model
from support.tiny_models import TINY_ARCHITECTURES, peaked_tiny_model, randomise_lora_b
from support.trainer import LOGPROB_ROUNDING, assert_answered_alike
from transformers import PreTrainedModel, Qwen2ForCausalLM

from trainer_backend.engine import sampling
from trainer_backend.engine.output_head import linear_output_head
from trainer_backend.engine.sampling import BoundSamplingRequest, sample, sample_batch
from trainer_backend.engine.types import SampledSequence, SamplingInputError, SamplingRequest, SamplingResult

VOCAB = 97
CONTEXT = 256
PROMPT = (2, 11, 5, 40, 7, 93, 3, 18, 60, 1)


def letters(ids: Sequence[int]) -> str:
    return "".join(chr(ord("a") + token % 26) for token in ids)


@pytest.fixture(scope="module", params=TINY_ARCHITECTURES)
def model(request: pytest.FixtureRequest) -> PreTrainedModel:
    return peaked_tiny_model(request.param, VOCAB, CONTEXT, sliding_window=8)


def run(
    model: torch.nn.Module, eos: tuple[int, ...] = (), adapter: str | None = None, **fields: object
) -> SamplingResult:
    return sample(model, SamplingRequest(prompt_tokens=PROMPT, **fields), eos, letters, CONTEXT, adapter)


def full_forward_logprobs(model: torch.nn.Module, ids: Sequence[int]) -> torch.Tensor:
    """log_softmax of the logits at every position, from one forward without a cache."""
    with torch.no_grad():
        logits_TV = model(input_ids=torch.tensor([list(ids)]), use_cache=False).logits[0]
    return F.log_softmax(logits_TV.float(), dim=-1)


def reference_sampling_logprobs(logits_V: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The distribution sampled from, by masking the full vocabulary (the engine works on sorted candidates)."""
    scaled_V = logits_V / temperature
    if top_k > 0:
        scaled_V = scaled_V.masked_fill(scaled_V < scaled_V.topk(top_k).values[-1], -torch.inf)
    if top_p < 1:
        probs_V = scaled_V.softmax(dim=-1)
        order_V = probs_V.argsort(descending=True)
        mass_before_V = probs_V[order_V].cumsum(dim=-1) - probs_V[order_V]
        scaled_V[order_V[mass_before_V >= top_p]] = -torch.inf
    return F.log_softmax(scaled_V, dim=-1)


def assert_greedy_follows_full_forward(model: torch.nn.Module, sequence: SampledSequence) -> None:
    """Each greedy token after PROMPT is the argmax of a full forward, with that forward's log-prob."""
    context = list(PROMPT)
    for token, logprob in zip(sequence.tokens, sequence.logprobs, strict=True):
        logprobs_V = full_forward_logprobs(model, context)[-1]
        assert token == int(logprobs_V.argmax())
        assert logprob == pytest.approx(float(logprobs_V[token]), abs=LOGPROB_ROUNDING)
        context.append(token)


def adapted_copy(model: PreTrainedModel, target_modules: list[str], seed: int) -> PeftModel:
    """A copy of `model` with a LoRA adapter "default" on `target_modules`, its B matrices random (not zero)."""
    torch.manual_seed(seed)
    # get_peft_model injects into the module it is given, so the shared base stays untouched on a copy.
    base = type(model)(model.config)
    base.load_state_dict(model.state_dict())
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=target_modules))
    randomise_lora_b(peft_model)
    return peft_model.eval()


def test_greedy_follows_full_forward_argmax_past_the_sliding_window(model: PreTrainedModel) -> None:
    (sequence,) = run(model, temperature=0, max_tokens=24).sequences
    assert len(PROMPT) + len(sequence.tokens) > 3 * (model.config.sliding_window or 0)
    assert_greedy_follows_full_forward(model, sequence)


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"), [(1.0, -1, 1.0), (0.7, -1, 1.0), (1.3, 5, 1.0), (0.8, -1, 0.9), (1.0, 6, 0.8)]
)
def test_sampled_logprobs_are_those_of_the_sampling_distribution(
    model: PreTrainedModel, temperature: float, top_k: int, top_p: float
) -> None:
    result = run(model, num_samples=4, max_tokens=12, temperature=temperature, top_k=top_k, top_p=top_p, seed=7)
    for sequence in result.sequences:
        full_TV = full_forward_logprobs(model, PROMPT + sequence.tokens)
        for step, (token, logprob) in enumerate(zip(sequence.tokens, sequence.logprobs, strict=True)):
            # At temperature 1 the model's log_softmax is its own logits' up to a constant, so this reference
            # is the raw full-forward log-softmax when no filter is on.
            expected_V = reference_sampling_logprobs(full_TV[len(PROMPT) - 1 + step], temperature, top_k, top_p)
            assert logprob == pytest.approx(float(expected_V[token]), abs=LOGPROB_ROUNDING)


def test_rows_that_stop_early_leave_the_batch_without_disturbing_the_others(model: PreTrainedModel) -> None:
    stops = tuple(range(0, VOCAB, 9))
    result = run(model, num_samples=8, max_tokens=14, stop_token_ids=stops, seed=3)
    assert {sequence.stop_reason for sequence in result.sequences} == {"stop", "length"}
    for sequence in result.sequences:
        full_TV = full_forward_logprobs(model, PROMPT + sequence.tokens)
        expected = full_TV[len(PROMPT) - 1 : -1].gather(1, torch.tensor(sequence.tokens)[:, None])[:, 0]
        assert sequence.logprobs == pytest.approx(expected.tolist(), abs=LOGPROB_ROUNDING)
        assert (sequence.stop_reason == "stop") == (sequence.tokens[-1] in stops)
        assert not set(sequence.tokens[:-1]) & set(stops)


def test_same_seed_gives_same_samples_and_other_seeds_differ(model: PreTrainedModel) -> None:
    first = run(model, num_samples=4, max_tokens=16, seed=123)
    assert run(model, num_samples=4, max_tokens=16, seed=123) == first
    assert run(model, num_samples=4, max_tokens=16, seed=124).sequences != first.sequences


def test_samples_of_one_request_are_independent(model: PreTrainedModel) -> None:
    result = run(model, num_samples=8, max_tokens=16, temperature=1.5, seed=5)
    assert len({sequence.tokens for sequence in result.sequences}) == 8


def test_top_k_one_is_greedy(model: PreTrainedModel) -> None:
    greedy = run(model, temperature=0, max_tokens=16).sequences[0]
    top_one = run(model, num_samples=3, temperature=1.0, top_k=1, max_tokens=16, seed=9).sequences
    assert all(sequence.tokens == greedy.tokens for sequence in top_one)
    assert all(logprob == 0.0 for sequence in top_one for logprob in sequence.logprobs)


def test_max_tokens_ends_the_sequence_with_reason_length(model: PreTrainedModel) -> None:
    result = run(model, num_samples=2, max_tokens=5, seed=1)
    assert [len(sequence.tokens) for sequence in result.sequences] == [5, 5]
    assert [sequence.stop_reason for sequence in result.sequences] == ["length", "length"]


def test_a_stop_token_or_eos_ends_the_sequence_and_is_kept(model: PreTrainedModel) -> None:
    greedy = run(model, temperature=0, max_tokens=20).sequences[0].tokens
    stop = greedy[6]
    expected = greedy[: greedy.index(stop) + 1]
    by_stop_id = run(model, temperature=0, max_tokens=20, stop_token_ids=(stop,)).sequences[0]
    by_eos = run(model, eos=(stop,), temperature=0, max_tokens=20).sequences[0]
    for sequence in (by_stop_id, by_eos):
        assert sequence.tokens == expected
        assert sequence.stop_reason == "stop"


def test_a_stop_string_ends_the_sequence_at_the_token_completing_it(model: PreTrainedModel) -> None:
    greedy = run(model, temperature=0, max_tokens=24).sequences[0].tokens
    stop = letters(greedy[9:12])
    end = next(length for length in range(1, len(greedy) + 1) if stop in letters(greedy[:length]))
    sequence = run(model, temperature=0, max_tokens=24, stop_strings=("zzzzzz", stop)).sequences[0]
    assert sequence.tokens == greedy[:end]
    assert sequence.stop_reason == "stop"


def test_prompt_logprobs_match_a_full_forward_when_scored_in_chunks(
    model: PreTrainedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Three positions per chunk, so chunks straddle the sliding window and the prompt's end.
    monkeypatch.setattr(sampling, "_PROMPT_LOGITS_BYTES", 3 * 4 * VOCAB)
    result = run(model, temperature=0, max_tokens=4, prompt_logprobs=True, topk_prompt_logprobs=3)
    full_TV = full_forward_logprobs(model, PROMPT + result.sequences[0].tokens)
    assert result.prompt_logprobs is not None
    assert result.topk_prompt_logprobs is not None
    assert result.prompt_logprobs[0] is None
    assert result.topk_prompt_logprobs[0] is None
    expected = [float(full_TV[position - 1, PROMPT[position]]) for position in range(1, len(PROMPT))]
    assert result.prompt_logprobs[1:] == pytest.approx(expected, abs=LOGPROB_ROUNDING)
    for position in range(1, len(PROMPT)):
        values_K, ids_K = full_TV[position - 1].topk(3)
        got_ids, got_values = zip(*result.topk_prompt_logprobs[position], strict=True)
        assert list(got_ids) == ids_K.tolist()
        assert list(got_values) == pytest.approx(values_K.tolist(), abs=LOGPROB_ROUNDING)
    # Chunked prefill leaves the cache as a single prefill would: decoding still follows the full forward.
    assert result.sequences[0].tokens[0] == int(full_TV[len(PROMPT) - 1].argmax())
    assert result.sequences[0].tokens[-1] == int(full_TV[-2].argmax())


def test_prompt_scores_are_absent_unless_requested(model: PreTrainedModel) -> None:
    result = run(model, max_tokens=2, topk_prompt_logprobs=2)
    assert result.prompt_logprobs is None
    assert result.topk_prompt_logprobs is not None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"prompt_tokens": ()}, "prompt_tokens must not be empty"),
        ({"prompt_tokens": (1, VOCAB)}, f"prompt_tokens[1] = {VOCAB} is outside the vocabulary"),
        ({"prompt_tokens": (-1,)}, "prompt_tokens[0] = -1 is outside the vocabulary"),
        ({"stop_token_ids": (500,)}, "stop_token_ids[0] = 500 is outside the vocabulary"),
        ({"num_samples": 0}, "num_samples must be at least 1, got 0"),
        ({"max_tokens": 0}, "max_tokens must be at least 1, got 0"),
        ({"max_tokens": CONTEXT}, f"max_tokens {CONTEXT} = {CONTEXT + len(PROMPT)} exceeds the model's context"),
        ({"temperature": -0.5}, "temperature must be a finite number >= 0, got -0.5"),
        ({"temperature": float("nan")}, "temperature must be a finite number >= 0, got nan"),
        ({"top_k": -2}, "top_k must be -1 or 0 (no limit) or a positive count, got -2"),
        ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0"),
        ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5"),
        ({"topk_prompt_logprobs": -1}, "topk_prompt_logprobs must be >= 0, got -1"),
        ({"stop_strings": ("ab", "")}, "stop_strings[1] is empty"),
    ],
)
def test_invalid_requests_name_the_field_and_value(
    model: PreTrainedModel, fields: dict[str, object], message: str
) -> None:
    request = SamplingRequest(**{"prompt_tokens": PROMPT, **fields})
    with pytest.raises(SamplingInputError) as raised:
        sample(model, request, (), letters, CONTEXT)
    assert message in str(raised.value)
    assert isinstance(raised.value, ValueError)


def test_the_model_is_returned_in_its_previous_mode(model: PreTrainedModel) -> None:
    model.train()
    try:
        run(model, max_tokens=2)
        assert model.training
    finally:
        model.eval()


@pytest.fixture
def lora_model(model: PreTrainedModel) -> PeftModel:
    return adapted_copy(model, ["q_proj", "v_proj"], seed=1)


def test_sampling_goes_through_a_lora_adapter(model: PreTrainedModel, lora_model: PeftModel) -> None:
    adapted = run(lora_model, adapter="default", temperature=0, max_tokens=16).sequences[0]
    assert_greedy_follows_full_forward(lora_model, adapted)
    assert adapted.tokens != run(model, temperature=0, max_tokens=16).sequences[0].tokens


@pytest.fixture
def two_adapter_model(lora_model: PeftModel) -> PeftModel:
    """The LoRA model with a second adapter ("other") of different weights beside "default"."""
    torch.manual_seed(2)
    lora_model.add_adapter("other", LoraConfig(r=2, lora_alpha=8, target_modules=["q_proj", "o_proj", "down_proj"]))
    randomise_lora_b(lora_model, "other")
    return lora_model.eval()


def mixed_jobs() -> list[BoundSamplingRequest]:
    """Prompts of different lengths (one past the sliding window), through no adapter and two adapters."""
    long_prompt = tuple((7 * i + 3) % VOCAB for i in range(40))
    return [
        BoundSamplingRequest(SamplingRequest(prompt_tokens=PROMPT, temperature=0, max_tokens=12), None, ()),
        BoundSamplingRequest(SamplingRequest(prompt_tokens=long_prompt, temperature=0, max_tokens=20), "default", ()),
        BoundSamplingRequest(
            SamplingRequest(prompt_tokens=PROMPT[:4], num_samples=3, temperature=0.8, max_tokens=15, seed=11),
            "other",
            (5,),
        ),
        BoundSamplingRequest(
            SamplingRequest(prompt_tokens=PROMPT[3:], temperature=1.0, top_p=0.9, top_k=20, max_tokens=18, seed=3),
            "default",
            (),
        ),
        BoundSamplingRequest(
            SamplingRequest(prompt_tokens=long_prompt[:25], num_samples=2, max_tokens=9, seed=5), None, ()
        ),
        BoundSamplingRequest(
            SamplingRequest(prompt_tokens=PROMPT, max_tokens=10, seed=8, prompt_logprobs=True, topk_prompt_logprobs=2),
            "other",
            (),
        ),
    ]


def test_a_mixed_batch_answers_each_request_as_it_would_be_answered_alone(two_adapter_model: PeftModel) -> None:
    jobs = mixed_jobs()
    together = sample_batch(two_adapter_model, jobs, letters, CONTEXT)
    for job, batched in zip(jobs, together, strict=True):
        (alone,) = sample_batch(two_adapter_model, [job], letters, CONTEXT)
        assert_answered_alike(batched, alone)
        assert batched.prompt_logprobs == alone.prompt_logprobs
    # The adapters really differ: the same greedy request gives other tokens through each.
    greedy = SamplingRequest(prompt_tokens=PROMPT, temperature=0, max_tokens=12)
    outputs = sample_batch(
        two_adapter_model,
        [BoundSamplingRequest(greedy, name, ()) for name in (None, "default", "other")],
        letters,
        CONTEXT,
    )
    assert len({result.sequences[0].tokens for result in outputs}) == 3


def test_a_bad_request_in_a_batch_gets_its_error_and_the_others_their_samples(two_adapter_model: PeftModel) -> None:
    good = BoundSamplingRequest(SamplingRequest(prompt_tokens=PROMPT, temperature=0, max_tokens=5), "default", ())
    bad = BoundSamplingRequest(SamplingRequest(prompt_tokens=(1, VOCAB + 3), max_tokens=5), "other", ())
    first, second, third = sample_batch(two_adapter_model, [good, bad, good], letters, CONTEXT)
    assert isinstance(second, SamplingInputError) and f"prompt_tokens[1] = {VOCAB + 3}" in str(second)
    # The same request twice in one batch: two rows of the same matmuls, which a GEMM may round differently.
    assert_answered_alike(first, third)


def test_every_architecture_draws_from_hidden_states_through_its_linear_head(model: PreTrainedModel) -> None:
    head = linear_output_head(model)
    assert head is not None
    assert head.softcap == getattr(model.config, "final_logit_softcapping", None)
    with torch.inference_mode():
        scores, _ = sampling._next_token_scores(model, [None], input_ids=torch.tensor([PROMPT]))
        # The fast path: the rows' hidden states and the head's weight, no [rows, vocabulary] logits.
        assert scores.logits_RV is None and scores.hidden_RH is not None
        logits_1V = scores.logits()
    torch.testing.assert_close(logits_1V, full_forward_logits(model, PROMPT)[-1:], atol=1e-4, rtol=0)


def full_forward_logits(model: torch.nn.Module, ids: Sequence[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([list(ids)]), use_cache=False).logits[0]


def test_a_lora_on_the_head_samples_through_its_low_rank_logits(model: PreTrainedModel) -> None:
    head_lora = adapted_copy(model, ["q_proj", "lm_head"], seed=3)
    adapted = run(head_lora, adapter="default", temperature=0, max_tokens=12).sequences[0]
    assert_greedy_follows_full_forward(head_lora, adapted)


class ScaledLogitsQwen2(Qwen2ForCausalLM):
    """A model whose logits are more than a linear head over its hidden states (as Cohere's logit scale is)."""

    def forward(self, *args: object, **kwargs: object) -> object:
        output = super().forward(*args, **kwargs)
        output.logits = output.logits * 0.5
        return output


def test_a_model_whose_logits_are_not_its_head_samples_through_its_own_forward() -> None:
    plain = peaked_tiny_model("qwen2", VOCAB, CONTEXT, sliding_window=8)
    scaled = ScaledLogitsQwen2(plain.config).eval()
    scaled.load_state_dict(plain.state_dict())
    assert linear_output_head(plain) is not None
    assert linear_output_head(scaled) is None
    result = run(scaled, num_samples=2, max_tokens=10, seed=4)
    for sequence in result.sequences:
        full_TV = full_forward_logprobs(scaled, PROMPT + sequence.tokens)
        expected = full_TV[len(PROMPT) - 1 : -1].gather(1, torch.tensor(sequence.tokens)[:, None])[:, 0]
        assert sequence.logprobs == pytest.approx(expected.tolist(), abs=LOGPROB_ROUNDING)
