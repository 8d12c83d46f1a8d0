"""Per-token log-probabilities of target tokens, without materialising the whole batch's logits.

Gemma 3's vocabulary has 262,144 entries: fp32 logits for 8 × 128 tokens take 1 GB, and autograd would keep
two or three such tensors alive until backward. `target_logprobs` projects the hidden states onto the
vocabulary a chunk of tokens at a time, so forward and backward each hold at most one chunk's logits.

When the unembedding is frozen (no gradient, no adapter on it, the usual LoRA setup), each chunk's gradient
with respect to the hidden states is computed in the forward pass, while its logits exist: the derivative of
a log-prob with respect to its hidden state is one `[H]` vector per target, so backward needs no logits at all
and costs two vocabulary matmuls per token in all, as the plain computation does. Each chunk of tokens goes through
the vocabulary a slice at a time (`_vocabulary_pass`), so its logits never exist whole either. Otherwise each chunk
runs under activation checkpointing and backward recomputes its logits (three matmuls).
`full_logits_target_logprobs` is the plain computation, kept for tests and benchmarks.

Most positions of an RL or supervised datum carry no gradient (a prompt's targets have zero advantage or zero
weight), yet their log-probs are still returned. `gradient_rows` names the positions the loss can send a gradient
to; the others get their log-prob from one vocabulary matmul and store nothing for backward.

Targets are `[B, T]` (one token per position) or `[B, T, K]` (K tokens per position, as a Tinker datum's 2-D
`target_tokens`). A negative target (for instance -100 on padding) marks an ignored position: its log-prob is
0.0 and it sends no gradient. Callers still weight or mask the result; the sentinel only keeps padding cheap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from trainer_backend.engine.onednn_linear import linear
from trainer_backend.engine.unembedding import VOCABULARY_CHUNK, unembedding_logits
from trainer_backend.errors import UserInputError


@dataclass(frozen=True)
class LowRankDelta:
    """A LoRA adapter on the unembedding: logits gain `scale * (h @ A.T) @ B.T`, never a dense [V, H] delta."""

    a_RH: Tensor
    b_VR: Tensor
    scale: float


def target_logprobs(
    hidden_states: Tensor,
    lm_head_weight: Tensor,
    targets: Tensor,
    chunk_tokens: int = 256,
    final_logit_softcapping: float | None = None,
    lm_head_delta: LowRankDelta | None = None,
    gradient_rows: Tensor | None = None,
) -> Tensor:
    """log_softmax(hidden_states @ lm_head_weight.T)[targets], computed `chunk_tokens` positions at a time.

    Args:
        hidden_states: `[B, T, H]`, the final (normed) hidden states.
        lm_head_weight: `[V, H]`, the unembedding; it gets a gradient only if it requires one.
        targets: `[B, T]` or `[B, T, K]` integer token ids; negative ids are ignored positions.
        chunk_tokens: positions (of the flattened `B * T`) whose logits exist at once.
        final_logit_softcapping: Gemma's cap c, applied as `tanh(logits / c) * c` before the softmax.
        lm_head_delta: a LoRA adapter trained on the unembedding, applied chunk by chunk.
        gradient_rows: `[B, T]` bool, the positions whose log-probs may receive a nonzero gradient; None: all.
            With a frozen unembedding the others skip the gradient work, and a gradient sent to one of them
            raises in backward (the caller's promise was wrong), so the shortcut can never change a result.

    Returns:
        float32 log-probabilities shaped like `targets`, differentiable with respect to `hidden_states`.

    Raises:
        UserInputError: a target token is outside the vocabulary (targets come from the request).
        ValueError: on mismatched shapes, non-integer targets, or `chunk_tokens < 1`.
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be at least 1, got {chunk_tokens}")
    hidden_NH, targets_NK = _flatten(hidden_states, lm_head_weight, targets)
    if lm_head_delta is None and not lm_head_weight.requires_grad:
        if gradient_rows is None:
            live_N = torch.ones(hidden_NH.shape[0], dtype=torch.bool, device=hidden_NH.device)
        else:
            live_N = gradient_rows.reshape(-1).to(device=hidden_NH.device, dtype=torch.bool)
        logprobs_NK = _FrozenUnembeddingLogprobs.apply(
            hidden_NH, lm_head_weight, targets_NK, final_logit_softcapping, chunk_tokens, live_N
        )
        return logprobs_NK.reshape(targets.shape)
    pieces = [
        # Nothing inside a chunk is saved for backward, which recomputes it; no RNG is involved, so skip
        # stashing RNG state.
        checkpoint(
            _logprobs,
            hidden_nH,
            lm_head_weight,
            targets_nK,
            final_logit_softcapping,
            lm_head_delta,
            use_reentrant=False,
            preserve_rng_state=False,
        )
        for hidden_nH, targets_nK in zip(hidden_NH.split(chunk_tokens), targets_NK.split(chunk_tokens), strict=True)
    ]
    return torch.cat(pieces).reshape(targets.shape)


def full_logits_target_logprobs(
    hidden_states: Tensor,
    lm_head_weight: Tensor,
    targets: Tensor,
    chunk_tokens: int = 256,
    final_logit_softcapping: float | None = None,
    lm_head_delta: LowRankDelta | None = None,
    gradient_rows: Tensor | None = None,
) -> Tensor:
    """The same values as `target_logprobs`, through the full `[B * T, V]` logits at once.

    `chunk_tokens` and `gradient_rows` are accepted and ignored, so the two functions are interchangeable in
    benchmarks.
    """
    hidden_NH, targets_NK = _flatten(hidden_states, lm_head_weight, targets)
    logprobs_NK = _logprobs(hidden_NH, lm_head_weight, targets_NK, final_logit_softcapping, lm_head_delta)
    return logprobs_NK.reshape(targets.shape)


def _flatten(hidden_states: Tensor, lm_head_weight: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    if hidden_states.dim() != 3:
        raise ValueError(f"hidden_states must be [B, T, H], got shape {tuple(hidden_states.shape)}")
    batch, length, width = hidden_states.shape
    if lm_head_weight.dim() != 2 or lm_head_weight.shape[1] != width:
        raise ValueError(f"lm_head_weight must be [V, {width}], got shape {tuple(lm_head_weight.shape)}")
    if targets.dim() not in (2, 3) or tuple(targets.shape[:2]) != (batch, length):
        raise ValueError(f"targets must be [{batch}, {length}] or [{batch}, {length}, K], got {tuple(targets.shape)}")
    if targets.dtype.is_floating_point or targets.dtype.is_complex or targets.dtype == torch.bool:
        raise ValueError(f"targets must be integer token ids, got dtype {targets.dtype}")
    vocab = lm_head_weight.shape[0]
    if targets.numel() and int(targets.max()) >= vocab:
        raise UserInputError(f"target token {int(targets.max())} is outside the model's vocabulary of {vocab} tokens")
    per_position = targets.shape[2] if targets.dim() == 3 else 1
    return hidden_states.reshape(batch * length, width), targets.reshape(batch * length, per_position).long()


def _logprobs(
    hidden_nH: Tensor, weight_VH: Tensor, targets_nK: Tensor, softcap: float | None, delta: LowRankDelta | None
) -> Tensor:
    # The matmul stays in the model's dtype (an fp32 copy of Gemma's unembedding would be gigabytes); the
    # softmax runs in fp32 because bf16 log-probs are too coarse for importance ratios.
    logits_nV = unembedding_logits(hidden_nH, weight_VH).float()
    if delta is not None:
        low_rank_nR = F.linear(hidden_nH.to(delta.a_RH.dtype), delta.a_RH)
        logits_nV = logits_nV + delta.scale * F.linear(low_rank_nR, delta.b_VR).float()
    if softcap is not None:
        logits_nV = torch.tanh(logits_nV / softcap) * softcap
    ignored_nK = targets_nK < 0
    # logit[target] - logsumexp avoids a second [n, V] tensor for the full log_softmax.
    picked_nK = logits_nV.gather(1, targets_nK.clamp(min=0))
    logprobs_nK = picked_nK - torch.logsumexp(logits_nV, dim=-1, keepdim=True)
    return logprobs_nK.masked_fill(ignored_nK, 0.0)


class _FrozenUnembeddingLogprobs(torch.autograd.Function):
    """Target log-probs through a frozen unembedding, with their hidden-state gradients taken chunk by chunk.

    For logits z = cap(h W^T) and target t, d log_softmax(z)[t] / dh = W^T ((e_t - p) * cap'), one vector per
    target, so forward stores `[N, K, H]` gradients instead of anything of vocabulary size, and only for the live
    rows (`live_N`); the other rows cost one vocabulary matmul and store nothing.
    """

    @staticmethod
    def forward(
        ctx, hidden_NH: Tensor, weight_VH: Tensor, targets_NK: Tensor, softcap: float | None, chunk: int, live_N: Tensor
    ):
        needs_grad = ctx.needs_input_grad[0]
        logprobs_NK = hidden_NH.new_zeros(targets_NK.shape, dtype=torch.float32)
        live_L = live_N.nonzero()[:, 0] if needs_grad else live_N.new_zeros(0, dtype=torch.long)
        # A position whose targets are all ignored (padding) keeps its 0.0 without a pass over the vocabulary.
        scored_N = (targets_NK >= 0).any(dim=1)
        without_gradient_N = ~live_N if needs_grad else torch.ones_like(live_N)
        dead_D = (without_gradient_N & scored_N).nonzero()[:, 0]
        for rows_d in dead_D.split(chunk):
            logprobs_NK[rows_d] = _vocabulary_pass(hidden_NH[rows_d], weight_VH, targets_NK[rows_d], softcap, False)[0]
        gradients = []
        for rows_n in live_L.split(chunk):
            logprobs_nK, gradient_nKH = _vocabulary_pass(
                hidden_NH[rows_n], weight_VH, targets_NK[rows_n], softcap, True
            )
            logprobs_NK[rows_n] = logprobs_nK
            gradients.append(gradient_nKH)
        if needs_grad:
            width = (targets_NK.shape[1], hidden_NH.shape[1])
            ctx.save_for_backward(torch.cat(gradients) if gradients else hidden_NH.new_zeros((0, *width)), live_L)
            ctx.hidden_shape = hidden_NH.shape
            ctx.hidden_dtype = hidden_NH.dtype
        return logprobs_NK

    @staticmethod
    def backward(ctx, upstream_NK: Tensor):
        gradient_LKH, live_L = ctx.saved_tensors
        upstream_LK = upstream_NK[live_L].float()
        outside_NK = upstream_NK.clone()
        outside_NK[live_L] = 0
        if bool(outside_NK.ne(0).any()):
            raise RuntimeError("a gradient reached a position outside gradient_rows; the caller's mask is wrong")
        hidden_grad_NH = upstream_NK.new_zeros(ctx.hidden_shape, dtype=ctx.hidden_dtype)
        hidden_grad_NH[live_L] = torch.einsum("lk,lkh->lh", upstream_LK, gradient_LKH).to(ctx.hidden_dtype)
        return hidden_grad_NH, None, None, None, None, None


def _vocabulary_pass(
    hidden_nH: Tensor, weight_VH: Tensor, targets_nK: Tensor, softcap: float | None, with_gradients: bool
) -> tuple[Tensor, Tensor | None]:
    """The target log-probs of n positions and, if asked, their `[n, K, H]` hidden-state gradients, in one pass over
    the vocabulary.

    Each `VOCABULARY_CHUNK` of logits is reduced while it is in cache: its part of the softmax's denominator and of
    the softmax's expectation of the unembedding rows (the gradient's `W^T p`), both rescaled whenever a chunk raises
    the running maximum (the online softmax). Whole `[n, V]` logits (Qwen's V is 151,936) were written to memory and
    read back by every step of the softmax and its gradient.
    """
    rows = hidden_nH.shape[0]
    ignored_nK = targets_nK < 0
    safe_nK = targets_nK.clamp(min=0)
    picked_nK = hidden_nH.new_zeros(targets_nK.shape, dtype=torch.float32)
    picked_slope_nK = torch.ones_like(picked_nK)
    maximum_n1 = hidden_nH.new_full((rows, 1), -math.inf, dtype=torch.float32)
    total_n1 = hidden_nH.new_zeros((rows, 1), dtype=torch.float32)
    expected_nH = hidden_nH.new_zeros(hidden_nH.shape, dtype=torch.float32) if with_gradients else None
    for start in range(0, weight_VH.shape[0], VOCABULARY_CHUNK):
        weight_CH = weight_VH[start : start + VOCABULARY_CHUNK]
        logits_nC = unembedding_logits(hidden_nH, weight_CH).float()
        # d cap(u) / du = 1 - tanh(u / c)^2, per logit, for the gradient (none asked: no slope).
        slope_nC = None
        if softcap is not None:
            capped_nC = torch.tanh(logits_nC / softcap)
            if with_gradients:
                slope_nC = 1.0 - capped_nC.square()
            logits_nC = capped_nC * softcap
        inside_nK = (safe_nK >= start) & (safe_nK < start + len(weight_CH))
        within_nK = (safe_nK - start).clamp(0, len(weight_CH) - 1)
        picked_nK = torch.where(inside_nK, logits_nC.gather(1, within_nK), picked_nK)
        if slope_nC is not None:
            picked_slope_nK = torch.where(inside_nK, slope_nC.gather(1, within_nK), picked_slope_nK)
        raised_n1 = torch.maximum(maximum_n1, logits_nC.amax(dim=1, keepdim=True))
        rescale_n1 = torch.exp(maximum_n1 - raised_n1)
        maximum_n1 = raised_n1
        # In place: the chunk's logits are not needed again.
        weights_nC = logits_nC.sub_(maximum_n1).exp_()
        total_n1 = total_n1 * rescale_n1 + weights_nC.sum(dim=1, keepdim=True)
        if expected_nH is not None:
            if slope_nC is not None:
                weights_nC.mul_(slope_nC)
            expected_nH = expected_nH * rescale_n1 + linear(weights_nC.to(weight_CH.dtype), weight_CH.T).float()
    logprobs_nK = (picked_nK - maximum_n1 - total_n1.log()).masked_fill(ignored_nK, 0.0)
    if expected_nH is None:
        return logprobs_nK, None
    picked_nKH = weight_VH[safe_nK].float() * picked_slope_nK.unsqueeze(-1)
    gradient_nKH = (picked_nKH - (expected_nH / total_n1).unsqueeze(1)).masked_fill(ignored_nK.unsqueeze(-1), 0.0)
    return logprobs_nK, gradient_nKH
