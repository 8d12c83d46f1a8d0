"""The attention of a bf16 model on a CPU, computed in fp32.

PyTorch's CPU flash-attention kernel is several times slower in bf16 than in fp32. With the query, keys and values
cast to fp32 first and the output cast back, Qwen2.5-Coder-0.5B's sampling at 32 rows went from 67.8 to 111.3
tokens/s and its forward_backward from 35.6 to 31.2 s (`python -m benchmarks.roofline --model
Qwen/Qwen2.5-Coder-0.5B-Instruct`, docs/performance.md "Qwen in bf16"); fp32 is also the more precise of the two.
The weights and every matmul outside attention stay bf16.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

FP32_SDPA = "sdpa_in_fp32_on_cpu"


def _sdpa_in_fp32(
    module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, **kwargs: object
) -> tuple[Tensor, Tensor | None]:
    """Transformers' SDPA attention, on fp32 copies of bf16 CPU inputs; its output in the inputs' dtype."""
    if query.dtype != torch.bfloat16 or query.device.type != "cpu":
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if attention_mask is not None and attention_mask.is_floating_point():
        attention_mask = attention_mask.float()
    output, weights = sdpa_attention_forward(
        module, query.float(), key.float(), value.float(), attention_mask, **kwargs
    )
    return output.to(query.dtype), weights


def attend_in_fp32(model: PreTrainedModel) -> bool:
    """Make a bf16 model on a CPU that attends through SDPA compute its attention in fp32; whether it now does.

    Same masks as SDPA's; any other model (fp32, another device, another attention implementation) is left as it is.
    """
    if model.dtype != torch.bfloat16 or model.device.type != "cpu" or model.config._attn_implementation != "sdpa":
        return False
    AttentionInterface.register(FP32_SDPA, _sdpa_in_fp32)
    AttentionMaskInterface.register(FP32_SDPA, sdpa_mask)
    model.set_attn_implementation(FP32_SDPA)
    return model.config._attn_implementation == FP32_SDPA
