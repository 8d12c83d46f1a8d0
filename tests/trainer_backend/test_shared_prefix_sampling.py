"""Sampling prompts that share a prefix (an evaluation's questions over one schema): the prefix is prefilled once.

The two-pass prefill must answer every request as it is answered alone, through its own adapter, and must stay
out of the way where it cannot be exact (a sliding window shorter than the context) or saves nothing.
"""

from __future__ import annotations

import itertools
import threading

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from support.tiny_models import peaked_tiny_gemma, randomise_lora_b
from support.trainer import LOGPROB_ROUNDING, assert_answered_alike

from trainer_backend.engine import sampling
from trainer_backend.engine.prefixes import GROUP_OVERHEAD_TOKENS, plan_shared_prefill
from trainer_backend.engine.sampling import BoundSamplingRequest, sample_batch
from trainer_backend.engine.types import SamplingRequest, SamplingResult

VOCAB = 97
CONTEXT = 256
# Two "schemas" of different lengths, each followed by several "questions".
SCHEMA_A = tuple((5 * i + 1) % VOCAB for i in range(40))
SCHEMA_B = tuple((11 * i + 7) % VOCAB for i in range(55))
QUESTIONS = [tuple((3 * i + q) % VOCAB for i in range(4 + 3 * q)) for q in range(5)]


def letters(ids: tuple[int, ...] | list[int]) -> str:
    return "".join(chr(ord("a") + token % 26) for token in ids)


@pytest.fixture
def forward_passes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Grows by one with every forward pass a generation of this test's thread makes (prefill passes and decode
    steps); servers of other tests in the same process may still be sampling on theirs."""
    passes: list[int] = []
    forward = sampling._next_token_scores
    test_thread = threading.current_thread()

    def counted(*args: object, **kwargs: object) -> object:
        if threading.current_thread() is test_thread:
            passes.append(1)
        return forward(*args, **kwargs)

    monkeypatch.setattr(sampling, "_next_token_scores", counted)
    return passes


@pytest.fixture(scope="module")
def two_adapters() -> PeftModel:
    """A model whose window covers every prompt here, with adapters "one" and "two" of different weights."""
    torch.manual_seed(1)
    base = peaked_tiny_gemma(VOCAB, CONTEXT, sliding_window=CONTEXT)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8), adapter_name="one")
    model.add_adapter("two", LoraConfig(r=2, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    randomise_lora_b(model)
    return model.eval()


def schema_jobs() -> list[BoundSamplingRequest]:
    """Questions over two schemas, through the base model and two adapters, greedy and sampled."""
    jobs = []
    for index, question in enumerate(QUESTIONS):
        adapter = ("one", "two", None)[index % 3]
        for schema in (SCHEMA_A, SCHEMA_B):
            request = SamplingRequest(
                prompt_tokens=schema + question,
                num_samples=1 + index % 2,
                max_tokens=6 + index,
                temperature=0 if index % 2 == 0 else 0.9,
                seed=index,
            )
            jobs.append(BoundSamplingRequest(request, adapter, ()))
    return jobs


def test_prompts_sharing_a_schema_are_answered_as_each_alone(
    two_adapters: PeftModel, forward_passes: list[int]
) -> None:
    jobs = schema_jobs()
    plan = plan_shared_prefill([job.request.prompt_tokens for job in jobs], [job.adapter for job in jobs])
    # The batch really takes the two-pass path: one prefix row per (schema, adapter), not one per prompt.
    assert plan is not None and len(plan.prefixes) < len(jobs)
    together = sample_batch(two_adapters, jobs, letters, CONTEXT)
    # Two prefill passes, then one pass per token after the first of the longest completion.
    assert len(forward_passes) == 2 + max(job.request.max_tokens for job in jobs) - 1
    for job, batched in zip(jobs, together, strict=True):
        (alone,) = sample_batch(two_adapters, [job], letters, CONTEXT)
        assert_answered_alike(batched, alone)


def test_greedy_tokens_after_a_shared_prefix_are_the_full_forward_argmax(two_adapters: PeftModel) -> None:
    jobs = [
        BoundSamplingRequest(SamplingRequest(prompt_tokens=SCHEMA_A + q, temperature=0, max_tokens=8), "two", ())
        for q in QUESTIONS
    ]
    assert plan_shared_prefill([job.request.prompt_tokens for job in jobs], ["two"] * len(jobs)) is not None
    results = sample_batch(two_adapters, jobs, letters, CONTEXT)
    two_adapters.set_adapter("two")
    for job, result in zip(jobs, results, strict=True):
        assert isinstance(result, SamplingResult)
        (sequence,) = result.sequences
        context = list(job.request.prompt_tokens)
        for token, logprob in zip(sequence.tokens, sequence.logprobs, strict=True):
            with torch.no_grad():
                logits_V = two_adapters(input_ids=torch.tensor([context]), use_cache=False).logits[0, -1]
            logprobs_V = torch.log_softmax(logits_V.float(), dim=-1)
            assert token == int(logprobs_V.argmax())
            assert logprob == pytest.approx(float(logprobs_V[token]), abs=LOGPROB_ROUNDING)
            context.append(token)


def test_a_sliding_window_shorter_than_the_context_keeps_the_one_pass_prefill(forward_passes: list[int]) -> None:
    model = peaked_tiny_gemma(VOCAB, CONTEXT, sliding_window=16)
    jobs = [
        BoundSamplingRequest(SamplingRequest(prompt_tokens=SCHEMA_A + q, temperature=0, max_tokens=4))
        for q in QUESTIONS
    ]
    assert plan_shared_prefill([job.request.prompt_tokens for job in jobs], [None] * len(jobs)) is not None
    results = sample_batch(model, jobs, letters, CONTEXT)
    # One prefill pass, then one pass per token after the first.
    assert len(forward_passes) == 1 + 3
    assert all(isinstance(result, SamplingResult) for result in results)


def test_a_prefix_is_shared_only_within_an_adapter_and_leaves_every_prompt_a_token() -> None:
    prompts = [SCHEMA_A + QUESTIONS[0], SCHEMA_A + QUESTIONS[1], SCHEMA_A + QUESTIONS[2], SCHEMA_A]
    plan = plan_shared_prefill(prompts, ["x", "x", "y", "x"])
    assert plan is not None
    for index, prompt in enumerate(prompts):
        prefix = plan.prefixes[plan.prefix_of[index]]
        assert prefix + plan.suffixes[index] == prompt and plan.suffixes[index]
    # "y" has its own row: its keys and values differ from "x"'s.
    assert plan.prefix_adapters[plan.prefix_of[2]] == "y"
    assert plan.prefix_of[2] not in {plan.prefix_of[i] for i in (0, 1, 3)}
    assert plan.prefix_of[0] == plan.prefix_of[1] == plan.prefix_of[3]


def test_no_two_pass_prefill_where_it_computes_no_fewer_positions() -> None:
    distinct = [tuple((k * i + k) % VOCAB for i in range(30)) for k in range(2, 6)]
    assert plan_shared_prefill(distinct, [None] * 4) is None
    # A shared prefix no longer than the overhead of a group is not shared.
    short = [tuple(range(GROUP_OVERHEAD_TOKENS)) + q for q in QUESTIONS]
    assert plan_shared_prefill(short, [None] * len(short)) is None
    assert plan_shared_prefill([(1,), (1, 2)], [None, None]) is None


@pytest.fixture
def prefilled_positions(two_adapters: PeftModel) -> list[int]:
    """The input positions of every forward pass this test's thread makes through `two_adapters`."""
    positions: list[int] = []
    test_thread = threading.current_thread()

    def count(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        if threading.current_thread() is test_thread:
            positions.append(inputs[0].numel())

    hook = two_adapters.get_input_embeddings().register_forward_pre_hook(count)
    yield positions
    hook.remove()


def scoring_jobs(adapters: tuple[str | None, ...]) -> list[BoundSamplingRequest]:
    """An RL step's completions scored for a KL penalty: each prompt with several completions, one token to sample."""
    jobs = []
    for index, (schema, question) in enumerate(itertools.product((SCHEMA_A, SCHEMA_B), QUESTIONS[:3])):
        prompt = schema + question
        for completion in range(3):
            tokens = prompt + tuple((7 * i + completion + index) % VOCAB for i in range(2 + completion))
            request = SamplingRequest(
                prompt_tokens=tokens,
                max_tokens=1,
                seed=len(jobs),
                prompt_logprobs=True,
                topk_prompt_logprobs=index % 2 * 2,
            )
            jobs.append(BoundSamplingRequest(request, adapters[index % len(adapters)], ()))
    return jobs


def assert_scored_alike(one: object, other: object) -> None:
    assert_answered_alike(one, other)
    assert isinstance(one, SamplingResult) and isinstance(other, SamplingResult)
    assert one.prompt_logprobs is not None and other.prompt_logprobs is not None
    assert one.prompt_logprobs[0] is None and other.prompt_logprobs[0] is None
    assert one.prompt_logprobs[1:] == pytest.approx(other.prompt_logprobs[1:], abs=LOGPROB_ROUNDING)
    if one.topk_prompt_logprobs is None:
        assert other.topk_prompt_logprobs is None
        return
    assert other.topk_prompt_logprobs is not None
    for mine, theirs in zip(one.topk_prompt_logprobs[1:], other.topk_prompt_logprobs[1:], strict=True):
        assert [token for token, _ in mine] == [token for token, _ in theirs]
        assert [value for _, value in mine] == pytest.approx([value for _, value in theirs], abs=LOGPROB_ROUNDING)


def test_scored_prompts_that_begin_alike_share_their_prefix_pass_and_score_as_each_alone(
    two_adapters: PeftModel, prefilled_positions: list[int]
) -> None:
    jobs = scoring_jobs(("one", None, "two"))
    together = sample_batch(two_adapters, jobs, letters, CONTEXT)
    # Each group of one adapter and one top-k computes its shared prefix once: far fewer positions than the prompts.
    assert sum(prefilled_positions) < 0.5 * sum(len(job.request.prompt_tokens) for job in jobs)
    for job, batched in zip(jobs, together, strict=True):
        (alone,) = sample_batch(two_adapters, [job], letters, CONTEXT)
        assert_scored_alike(batched, alone)


def test_scores_after_a_shared_prefix_are_those_of_a_full_forward(two_adapters: PeftModel) -> None:
    jobs = scoring_jobs(("two",))
    results = sample_batch(two_adapters, jobs, letters, CONTEXT)
    two_adapters.set_adapter("two")
    for job, result in zip(jobs, results, strict=True):
        assert isinstance(result, SamplingResult) and result.prompt_logprobs is not None
        tokens = torch.tensor([job.request.prompt_tokens])
        with torch.no_grad():
            logprobs_PV = torch.log_softmax(two_adapters(input_ids=tokens, use_cache=False).logits[0].float(), dim=-1)
        expected = logprobs_PV[:-1].gather(1, tokens[0, 1:, None])[:, 0]
        assert result.prompt_logprobs[1:] == pytest.approx(expected.tolist(), abs=LOGPROB_ROUNDING)


def test_scored_prompts_share_a_prefix_through_a_sliding_window_as_each_alone() -> None:
    model = peaked_tiny_gemma(VOCAB, CONTEXT, sliding_window=16)
    jobs = scoring_jobs((None,))
    for job, batched in zip(jobs, sample_batch(model, jobs, letters, CONTEXT), strict=True):
        (alone,) = sample_batch(model, [job], letters, CONTEXT)
        assert_scored_alike(batched, alone)
