"""Drawing the next token of each row, with its log-probability under the distribution it was drawn from.

Two ways to the same draw. `draw_from_logits` takes a row's logits and serves every option: temperature, top-k,
top-p. `draw_from_hidden` serves the common case, temperature alone (greedy at 0), without ever holding a row's
softmax: it walks the vocabulary projection chunk by chunk, and while each chunk's logits are in cache it keeps the
chunk's maximum, the position of that maximum and its mass, `sum(exp(logit - chunk max))`. A draw then picks a
chunk by the masses and a token inside the chosen chunk, from one uniform number (inverse transform sampling in
two levels): the same token the one-level draw over the whole vocabulary takes for that number, up to the
rounding of the sums. On a 2-core CPU it took a 32-row decode step of Gemma 3 270M from 399 to 224 ms: the
softmax, exponentials, running sum and transposes over `32 × 262,144` logits had cost as much as the projection.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from trainer_backend.engine.unembedding import VOCABULARY_CHUNK, unembedding_logits


def _accumulation_dtype(device: torch.device) -> torch.dtype:
    """float64 for the chunks' masses where the device has it (Apple's MPS does not).

    With 262,144 tokens of a few millionths each, fp32 sums moved a draw to a neighbouring token for 4 of 256
    uniform numbers against a float64 reference; float64 for none.
    """
    return torch.float32 if device.type == "mps" else torch.float64


def draw_from_logits(
    logits_BV: Tensor, temperature: float, top_k: int, top_p: float, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """One token per row and its logprob under the distribution it was drawn from.

    That distribution is the logits divided by the temperature, cut to the top-k (0: no cut), cut to the top-p
    nucleus, renormalised. At temperature 0 the token is the argmax and its logprob is the model's own
    (temperature 1, unfiltered), as a point mass would report only 0.0.
    """
    logits_BV = logits_BV.float()
    if temperature == 0:
        logprobs_BV = F.log_softmax(logits_BV, dim=-1)
        next_B1 = logprobs_BV.argmax(dim=-1, keepdim=True)
        return next_B1[:, 0], logprobs_BV.gather(1, next_B1)[:, 0]
    scaled_BV = logits_BV / temperature
    vocab_size = scaled_BV.shape[-1]
    top_k = top_k if 0 < top_k < vocab_size else 0
    if top_k == 0 and top_p == 1:
        logprobs_BV = F.log_softmax(scaled_BV, dim=-1)
        uniform_B1 = torch.rand((scaled_BV.shape[0], 1), generator=generator, device=scaled_BV.device)
        next_B1 = inverse_transform(logprobs_BV.exp(), uniform_B1)
        return next_B1[:, 0], logprobs_BV.gather(1, next_B1)[:, 0]
    # Candidates in descending order: the top k, or the whole vocabulary sorted for the nucleus cut.
    if top_k:
        candidates_BK, ids_BK = scaled_BV.topk(top_k, dim=-1)
    else:
        candidates_BK, ids_BK = scaled_BV.sort(dim=-1, descending=True)
    if top_p < 1:
        probs_BK = candidates_BK.softmax(dim=-1)
        # Keep the smallest prefix whose mass reaches top_p: drop a candidate once the mass before it does.
        outside_BK = probs_BK.cumsum(dim=-1) - probs_BK >= top_p
        candidates_BK = candidates_BK.masked_fill(outside_BK, -math.inf)
    logprobs_BK = F.log_softmax(candidates_BK, dim=-1)
    uniform_B1 = torch.rand((candidates_BK.shape[0], 1), generator=generator, device=candidates_BK.device)
    choice_B1 = inverse_transform(logprobs_BK.exp(), uniform_B1)
    return ids_BK.gather(1, choice_B1)[:, 0], logprobs_BK.gather(1, choice_B1)[:, 0]


def inverse_transform(weights_BV: Tensor, uniform_B1: Tensor) -> Tensor:
    """`[B, 1]`: the index of each row whose share of the row's total weight covers its uniform number in [0, 1).

    Inverse transform sampling on the running sum, where `torch.multinomial` would draw one exponential number per
    entry (262,144 per row for Gemma). The weights need not sum to 1. The fp32 running sum moves each entry's chance
    by at most half an ulp of the total; an entry of weight 0 adds nothing to the sum, so it is never drawn.
    """
    cdf_BV = weights_BV.cumsum(dim=-1)
    drawn_B1 = torch.searchsorted(cdf_BV, uniform_B1.to(cdf_BV.dtype) * cdf_BV[:, -1:], right=True)
    # u * total may round up to the total itself: the last entry that has any weight takes it.
    last_possible_B1 = (weights_BV > 0).cumsum(dim=-1).argmax(dim=-1, keepdim=True)
    return torch.minimum(drawn_B1, last_possible_B1)


def draw_from_hidden(
    hidden_RH: Tensor,
    weight_VH: Tensor,
    temperature_R: Tensor,
    uniform_R: Tensor,
    softcap: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Each row's next token from its last hidden state, and its logprob; `draw_from_logits` without top-k or top-p.

    Args:
        hidden_RH: the rows' hidden states after the final norm.
        weight_VH: the unembedding; row r's logits are `softcap(weight_VH @ hidden_RH[r])`.
        temperature_R: each row's temperature; 0 takes the argmax, with its logprob at temperature 1.
        uniform_R: each sampled row's uniform number in [0, 1), drawn from its request's generator (any value on a
            greedy row).
        softcap: the model's final logit soft-capping (`cap * tanh(logits / cap)`), if it has one.
    """
    rows, vocab_size = hidden_RH.shape[0], weight_VH.shape[0]
    device = hidden_RH.device
    # On a CPU the reductions read each chunk's logits from cache; an accelerator takes the vocabulary in one piece.
    chunk = VOCABULARY_CHUNK if device.type == "cpu" else vocab_size
    greedy_R = temperature_R == 0
    scale_R1 = 1.0 / torch.where(greedy_R, 1.0, temperature_R.float())[:, None]
    scaled = bool((scale_R1 != 1).any())
    accumulation = _accumulation_dtype(device)
    logits_by_chunk: list[Tensor] = []
    maxima, argmaxima, masses = [], [], []
    for weight_CH in weight_VH.split(chunk):
        logits_RC = unembedding_logits(hidden_RH, weight_CH).float()
        if softcap is not None:
            logits_RC = torch.tanh(logits_RC / softcap) * softcap
        if scaled:
            logits_RC = logits_RC * scale_R1
        max_R, argmax_R = logits_RC.max(dim=1)
        logits_by_chunk.append(logits_RC)
        maxima.append(max_R)
        argmaxima.append(argmax_R)
        masses.append(torch.exp(logits_RC - max_R[:, None]).sum(dim=1, dtype=accumulation))
    max_RN, argmax_RN, mass_RN = torch.stack(maxima, dim=1), torch.stack(argmaxima, dim=1), torch.stack(masses, dim=1)
    top_R, top_chunk_R = max_RN.max(dim=1)
    # Each chunk's mass relative to the row's maximum: they sum to the softmax's denominator.
    mass_RN *= torch.exp(max_RN - top_R[:, None])
    log_total_R = top_R + mass_RN.sum(dim=1).log()
    row_R = torch.arange(rows, device=device)
    greedy_token_R = top_chunk_R * chunk + argmax_RN[row_R, top_chunk_R]
    # The chunk whose share of the total covers u, then the token whose share of that chunk covers the rest.
    chunk_R1 = inverse_transform(mass_RN, uniform_R[:, None])
    cumulative_RN = mass_RN.cumsum(dim=1)
    before_R1 = torch.where(chunk_R1 > 0, cumulative_RN.gather(1, (chunk_R1 - 1).clamp(min=0)), 0.0)
    share_R1 = ((uniform_R[:, None] * cumulative_RN[:, -1:] - before_R1) / mass_RN.gather(1, chunk_R1)).clamp(0, 1)
    chosen = chunk_R1[:, 0].tolist()
    # The last chunk may be short: pad with impossible tokens so that the rows' chosen chunks stack.
    chosen_RC = torch.stack(
        [
            F.pad(logits_by_chunk[n][r], (0, chunk - len(logits_by_chunk[n][r])), value=-math.inf)
            for r, n in enumerate(chosen)
        ]
    )
    weights_RC = torch.exp((chosen_RC - max_RN.gather(1, chunk_R1)).to(accumulation))
    within_R1 = inverse_transform(weights_RC, share_R1)
    token_R = torch.where(greedy_R, greedy_token_R, (chunk_R1 * chunk + within_R1)[:, 0])
    # A greedy row's logit is its maximum, at temperature 1.
    token_logit_R = torch.where(greedy_R, top_R, chosen_RC.gather(1, within_R1)[:, 0])
    return token_R, (token_logit_R - log_total_R).float()
