"""Token sampling with exact log-probabilities: the engine behind the Tinker API's `sample`.

`sample` prefills the prompt once, copies its KV cache across the `num_samples` rows, and then decodes one
token per step for the rows still running; a row that stops leaves the batch (and the cache) at once.

Semantics, matched to the Tinker SDK 0.38 and the tinker-cookbook:

- The logprob of a sampled token is its log-probability under the distribution it was drawn from: the
  model's logits divided by the temperature, cut to the top-k, cut to the top-p nucleus, renormalised.
  The cookbook's `tests/validate_temperature_logprobs.py` checks that Tinker's sampled logprobs scale with
  1/temperature, and its `importance_sampling` loss reads them as the sampling policy q. At temperature 0
  the token is the argmax and its logprob is the model's own (temperature 1, unfiltered), as a point mass
  would report only 0.0.
- Prompt logprobs are the model's own (temperature 1, unfiltered), as the SDK's `compute_logprobs` presents
  them; position 0 has no context and gets None (`SampleResponse.prompt_logprobs`).
- A stop token (an EOS id or one of `stop_token_ids`) is kept as the last returned token: the cookbook's
  `parse_response_for_stop_token` expects exactly one in every response that stopped. A stop string ends the
  sequence at the token that completes it, which is kept too, so the tokens are exactly what was sampled.
- `stop_reason` is "stop" when a stop token or string ended the sequence, else "length" (`StopReason`).
- `top_k` of -1 (the SDK's "no limit") or 0 disables top-k.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from peft import PeftModel
from torch import Tensor
from transformers import Cache, PreTrainedModel

from trainer_backend.errors import UserInputError

StopReason = Literal["stop", "length"]
TopkLogprobs = tuple[tuple[int, float], ...]

# The prompt is scored a chunk of positions at a time so that its fp32 logits stay near this size: Gemma 3's
# 262,144-entry vocabulary makes a whole 4k-token prompt's logits 4 GiB.
_PROMPT_LOGITS_BYTES = 256 * 2**20
# Tokens decoded when looking for a stop string, per character of the longest one: byte-fallback tokenizers
# can spend up to four tokens on one character, and the margin keeps the window's first, possibly partial,
# character away from the match.
_STOP_WINDOW_TOKENS_PER_CHAR = 4
_STOP_WINDOW_MARGIN = 8


class SamplingInputError(UserInputError, ValueError):
    """A sampling request the engine cannot serve; the message names the field and its value."""


@dataclass(frozen=True)
class SamplingRequest:
    """One prompt and how to sample from it; the HTTP layer builds it from the SDK's `SampleRequest`."""

    prompt_tokens: tuple[int, ...]
    num_samples: int = 1
    max_tokens: int = 16
    temperature: float = 1.0  # 0 samples greedily
    top_k: int = -1  # -1 or 0: no limit
    top_p: float = 1.0  # in (0, 1]; 1 keeps the whole distribution
    seed: int | None = None  # the same seed and request give the same tokens; None draws a fresh seed
    stop_token_ids: tuple[int, ...] = ()  # in addition to the model's EOS ids, which `sample` takes separately
    stop_strings: tuple[str, ...] = ()
    prompt_logprobs: bool = False
    topk_prompt_logprobs: int = 0  # k > 0 returns the k most likely tokens at each prompt position


@dataclass(frozen=True)
class SampledSequence:
    """One completion: its tokens, each token's logprob under the sampling distribution, and why it ended."""

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    stop_reason: StopReason


@dataclass(frozen=True)
class SamplingResult:
    """The completions of one request, and the prompt's scores when asked for (None at position 0)."""

    sequences: tuple[SampledSequence, ...]
    prompt_logprobs: tuple[float | None, ...] | None
    topk_prompt_logprobs: tuple[TopkLogprobs | None, ...] | None


def sample(
    model: PreTrainedModel | PeftModel,
    request: SamplingRequest,
    eos_token_ids: tuple[int, ...],
    decode: Callable[[Sequence[int]], str],
    max_context_length: int,
) -> SamplingResult:
    """Sample `request.num_samples` completions of the prompt from `model`, with their logprobs.

    Args:
        model: a causal LM, or a `PeftModel` whose adapter for this request is already active. It runs in
            eval mode and is put back in its previous mode afterwards.
        request: the prompt and the sampling parameters.
        eos_token_ids: ids that end a sequence besides `request.stop_token_ids`; pass () when the client
            disabled stopping (the SDK's `stop=[]`).
        decode: token ids to text, used only to look for `request.stop_strings`.
        max_context_length: the most tokens, prompt and completion together, the model may see.

    Returns:
        The completions in sample order, and prompt logprobs if the request asked for them.

    Raises:
        SamplingInputError: an empty prompt, out-of-vocabulary ids, a parameter out of range, or a prompt
            plus `max_tokens` longer than `max_context_length`.
    """
    vocab_size = model.get_output_embeddings().weight.shape[0]
    _validate(request, vocab_size, max_context_length)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            device = model.get_input_embeddings().weight.device
            prompt_1P = torch.tensor([request.prompt_tokens], dtype=torch.long, device=device)
            scores_wanted = request.prompt_logprobs or request.topk_prompt_logprobs > 0
            if scores_wanted:
                cache, logits_1V, prompt_logprobs, topk_prompt_logprobs = _prefill_scoring(
                    model, prompt_1P, request.topk_prompt_logprobs
                )
            else:
                output = model(input_ids=prompt_1P, use_cache=True, logits_to_keep=1)
                cache, logits_1V = output.cache, output.logits[:, -1]
                prompt_logprobs = topk_prompt_logprobs = None
            generator = torch.Generator(device=device)
            if request.seed is None:
                generator.seed()
            else:
                # manual_seed takes [-2**63, 2**64); any Python int maps into it.
                generator.manual_seed(request.seed % 2**64)
            sequences = _decode(model, cache, logits_1V, request, frozenset(eos_token_ids), decode, generator)
    finally:
        model.train(was_training)
    return SamplingResult(
        sequences=sequences,
        prompt_logprobs=prompt_logprobs if request.prompt_logprobs else None,
        topk_prompt_logprobs=topk_prompt_logprobs if request.topk_prompt_logprobs > 0 else None,
    )


def _validate(request: SamplingRequest, vocab_size: int, max_context_length: int) -> None:
    prompt = request.prompt_tokens
    if not prompt:
        raise SamplingInputError("prompt_tokens must not be empty")
    for field, ids in (("prompt_tokens", prompt), ("stop_token_ids", request.stop_token_ids)):
        for index, token in enumerate(ids):
            if not 0 <= token < vocab_size:
                raise SamplingInputError(f"{field}[{index}] = {token} is outside the vocabulary [0, {vocab_size})")
    if request.num_samples < 1:
        raise SamplingInputError(f"num_samples must be at least 1, got {request.num_samples}")
    if request.max_tokens < 1:
        raise SamplingInputError(f"max_tokens must be at least 1, got {request.max_tokens}")
    if len(prompt) + request.max_tokens > max_context_length:
        raise SamplingInputError(
            f"prompt length {len(prompt)} + max_tokens {request.max_tokens} = {len(prompt) + request.max_tokens} "
            f"exceeds the model's context length {max_context_length}"
        )
    if not (math.isfinite(request.temperature) and request.temperature >= 0):
        raise SamplingInputError(f"temperature must be a finite number >= 0, got {request.temperature}")
    if request.top_k < -1:
        raise SamplingInputError(f"top_k must be -1 or 0 (no limit) or a positive count, got {request.top_k}")
    if not 0 < request.top_p <= 1:
        raise SamplingInputError(f"top_p must be in (0, 1], got {request.top_p}")
    if request.topk_prompt_logprobs < 0:
        raise SamplingInputError(f"topk_prompt_logprobs must be >= 0, got {request.topk_prompt_logprobs}")
    for index, stop in enumerate(request.stop_strings):
        if not stop:
            raise SamplingInputError(f"stop_strings[{index}] is empty; it would stop every sequence at once")


def _prefill_scoring(
    model: PreTrainedModel | PeftModel, prompt_1P: Tensor, topk: int
) -> tuple[Cache, Tensor, tuple[float | None, ...], tuple[TopkLogprobs | None, ...]]:
    """Prefill chunk by chunk through the cache, scoring each chunk's positions before its logits are freed."""
    length = prompt_1P.shape[1]
    vocab_size = model.get_output_embeddings().weight.shape[0]
    chunk = max(1, _PROMPT_LOGITS_BYTES // (4 * vocab_size))
    topk = min(topk, vocab_size)
    cache: Cache | None = None
    logprobs: list[float | None] = [None]
    topk_logprobs: list[TopkLogprobs | None] = [None]
    for start in range(0, length, chunk):
        output = model(input_ids=prompt_1P[:, start : start + chunk], cache=cache, use_cache=True)
        cache = output.cache
        # Row j of this chunk's logits predicts prompt position start + j + 1; the prompt's last row predicts
        # the first sampled token and has no target here.
        targets_C = prompt_1P[0, start + 1 : start + chunk + 1]
        logprobs_CV = F.log_softmax(output.logits[0, : targets_C.shape[0]].float(), dim=-1)
        logprobs.extend(logprobs_CV.gather(1, targets_C[:, None])[:, 0].tolist())
        if topk > 0:
            values_CK, ids_CK = logprobs_CV.topk(topk, dim=-1)
            topk_logprobs.extend(
                tuple(zip(ids_row, values_row, strict=True))
                for ids_row, values_row in zip(ids_CK.tolist(), values_CK.tolist(), strict=True)
            )
    return cache, output.logits[:, -1], tuple(logprobs), tuple(topk_logprobs)


def _decode(
    model: PreTrainedModel | PeftModel,
    cache: Cache,
    logits_1V: Tensor,
    request: SamplingRequest,
    eos_token_ids: frozenset[int],
    decode: Callable[[Sequence[int]], str],
    generator: torch.Generator,
) -> tuple[SampledSequence, ...]:
    count = request.num_samples
    stop_ids = eos_token_ids | frozenset(request.stop_token_ids)
    window = max(map(len, request.stop_strings), default=0) * _STOP_WINDOW_TOKENS_PER_CHAR + _STOP_WINDOW_MARGIN
    tokens: list[list[int]] = [[] for _ in range(count)]
    logprobs: list[list[float]] = [[] for _ in range(count)]
    reasons: list[StopReason] = ["length"] * count
    # running[r] is the sample that batch row r (of the logits and the cache) belongs to.
    running = list(range(count))
    if count > 1:
        cache.batch_repeat_interleave(count)
    logits_BV = logits_1V.expand(count, -1)
    for step in range(request.max_tokens):
        next_B, next_logprobs_B = _draw(logits_BV, request, generator)
        kept_rows = []
        for row, (sample_index, token, logprob) in enumerate(
            zip(running, next_B.tolist(), next_logprobs_B.tolist(), strict=True)
        ):
            tokens[sample_index].append(token)
            logprobs[sample_index].append(logprob)
            sequence = tokens[sample_index]
            if token in stop_ids or (
                request.stop_strings and any(stop in decode(sequence[-window:]) for stop in request.stop_strings)
            ):
                reasons[sample_index] = "stop"
            else:
                kept_rows.append(row)
        if not kept_rows or step == request.max_tokens - 1:
            break
        if len(kept_rows) < len(running):
            rows_B = torch.tensor(kept_rows, device=next_B.device)
            cache.batch_select_indices(rows_B)
            next_B = next_B[rows_B]
            running = [running[row] for row in kept_rows]
        logits_BV = model(input_ids=next_B[:, None], cache=cache, use_cache=True).logits[:, -1]
    return tuple(
        SampledSequence(tokens=tuple(t), logprobs=tuple(lp), stop_reason=reason)
        for t, lp, reason in zip(tokens, logprobs, reasons, strict=True)
    )


def _draw(logits_BV: Tensor, request: SamplingRequest, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """One token per row and its logprob under the distribution it was drawn from (see the module docstring)."""
    logits_BV = logits_BV.float()
    if request.temperature == 0:
        logprobs_BV = F.log_softmax(logits_BV, dim=-1)
        next_B1 = logprobs_BV.argmax(dim=-1, keepdim=True)
        return next_B1[:, 0], logprobs_BV.gather(1, next_B1)[:, 0]
    scaled_BV = logits_BV / request.temperature
    vocab_size = scaled_BV.shape[-1]
    top_k = request.top_k if 0 < request.top_k < vocab_size else 0
    if top_k == 0 and request.top_p == 1:
        logprobs_BV = F.log_softmax(scaled_BV, dim=-1)
        next_B1 = torch.multinomial(logprobs_BV.exp(), 1, generator=generator)
        return next_B1[:, 0], logprobs_BV.gather(1, next_B1)[:, 0]
    # Candidates in descending order: the top k, or the whole vocabulary sorted for the nucleus cut.
    if top_k:
        candidates_BK, ids_BK = scaled_BV.topk(top_k, dim=-1)
    else:
        candidates_BK, ids_BK = scaled_BV.sort(dim=-1, descending=True)
    if request.top_p < 1:
        probs_BK = candidates_BK.softmax(dim=-1)
        # Keep the smallest prefix whose mass reaches top_p: drop a candidate once the mass before it does.
        outside_BK = probs_BK.cumsum(dim=-1) - probs_BK >= request.top_p
        candidates_BK = candidates_BK.masked_fill(outside_BK, -math.inf)
    logprobs_BK = F.log_softmax(candidates_BK, dim=-1)
    choice_B1 = torch.multinomial(logprobs_BK.exp(), 1, generator=generator)
    return ids_BK.gather(1, choice_B1)[:, 0], logprobs_BK.gather(1, choice_B1)[:, 0]
