"""The vocabulary projection of a few rows of hidden states, laid out the way a CPU's GEMM runs it fastest.

`F.linear(h, W)` with Gemma's `[262144, 640]` unembedding ran at 47 GFLOP/s for 32 rows on this project's 2-core
CPU; the same product as `W_chunk @ h.T` over 4,096-row chunks of `W`, written into a `[V, R]` result, runs at 84
(`benchmarks/roofline.py`). It is the largest matmul of every decode step and of every training pass. The result is
the same dot products, summed in another order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

# Vocabulary rows per chunk: measured best of 4k, 16k and 64k at 4 to 64 rows on a 2-core AVX2 CPU.
VOCABULARY_CHUNK = 4096


def vocabulary_major_logits(hidden_RH: Tensor, weight_VH: Tensor) -> Tensor:
    """`weight_VH @ hidden_RH.T`: the logits as a contiguous `[V, R]` tensor, in the weight's dtype."""
    if hidden_RH.device.type != "cpu":
        return F.linear(hidden_RH, weight_VH).T
    hidden_HR = hidden_RH.to(weight_VH.dtype).T.contiguous()
    if torch.is_grad_enabled() and (hidden_RH.requires_grad or weight_VH.requires_grad):
        # `mm(out=...)` does not record autograd; the concatenation does.
        return torch.cat([torch.mm(chunk_CH, hidden_HR) for chunk_CH in weight_VH.split(VOCABULARY_CHUNK)])
    logits_VR = hidden_HR.new_empty((weight_VH.shape[0], hidden_HR.shape[1]))
    for start in range(0, weight_VH.shape[0], VOCABULARY_CHUNK):
        end = start + VOCABULARY_CHUNK
        torch.mm(weight_VH[start:end], hidden_HR, out=logits_VR[start:end])
    return logits_VR


def unembedding_logits(hidden_RH: Tensor, weight_VH: Tensor) -> Tensor:
    """`hidden_RH @ weight_VH.T` as a contiguous `[R, V]` tensor, in the weight's dtype."""
    if hidden_RH.device.type != "cpu":
        return F.linear(hidden_RH, weight_VH)
    return vocabulary_major_logits(hidden_RH, weight_VH).T.contiguous()
