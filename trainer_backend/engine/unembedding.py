"""The vocabulary projection of a few rows of hidden states, computed the fastest way the device has.

It is the largest matmul of every decode step and of every training pass (Gemma's unembedding is `[262144, 640]`).
On an x86 CPU it goes through oneDNN (`onednn_linear`): 186 GFLOP/s for 32 rows on this project's 2-core CPU. On a
CPU without it, `F.linear(h, W)` ran at 47 and the same product as `W_chunk @ h.T` over 4,096-row chunks of `W` at
84, so that layout is kept there (`benchmarks/roofline.py`). The results are the same dot products, summed in
another order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from trainer_backend.engine.onednn_linear import applies, linear

# Vocabulary rows per chunk: measured best of 4k, 16k and 64k at 4 to 64 rows on a 2-core AVX2 CPU.
VOCABULARY_CHUNK = 4096


def unembedding_logits(hidden_RH: Tensor, weight_VH: Tensor) -> Tensor:
    """`hidden_RH @ weight_VH.T` as an `[R, V]` tensor in the weight's dtype (on a CPU without oneDNN, a view of
    a contiguous `[V, R]` product), differentiable in both."""
    hidden_RH = hidden_RH.to(weight_VH.dtype)
    if applies(weight_VH):
        return linear(hidden_RH, weight_VH)
    if hidden_RH.device.type != "cpu":
        return F.linear(hidden_RH, weight_VH)
    hidden_HR = hidden_RH.T.contiguous()
    if torch.is_grad_enabled() and (hidden_RH.requires_grad or weight_VH.requires_grad):
        # `mm(out=...)` does not record autograd; the concatenation does.
        return torch.cat([torch.mm(chunk_CH, hidden_HR) for chunk_CH in weight_VH.split(VOCABULARY_CHUNK)]).T
    logits_VR = hidden_HR.new_empty((weight_VH.shape[0], hidden_HR.shape[1]))
    for start in range(0, weight_VH.shape[0], VOCABULARY_CHUNK):
        end = start + VOCABULARY_CHUNK
        torch.mm(weight_VH[start:end], hidden_HR, out=logits_VR[start:end])
    return logits_VR.T
