"""The attention of a bf16 model on a CPU, computed in fp32.

PyTorch's CPU flash-attention kernel is several times slower in bf16 than in fp32. With the query, keys and values
cast to fp32 first and the output cast back, Qwen2.5-Coder-0.5B's sampling at 32 rows went from 67.8 to 111.3
tokens/s and its forward_backward from 35.6 to 31.2 s (`python -m benchmarks.roofline --model
Qwen/Qwen2.5-Coder-0.5B-Instruct`, docs/performance.md "Qwen in bf16"); fp32 is also the more precise of the two.
The weights and every matmul outside attention stay bf16. Grouped-query heads under a mask read their shared keys
and values in place, where Transformers would copy them once per query head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

FP32_SDPA = "sdpa_in_fp32_on_cpu"


def sdpa_in_fp32(
    module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, **kwargs: object
) -> tuple[Tensor, Tensor | None]:
    """Transformers' SDPA attention, on fp32 copies of bf16 CPU inputs; its output in the inputs' dtype."""
    if query.dtype != torch.bfloat16 or query.device.type != "cpu":
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if attention_mask is not None and attention_mask.is_floating_point():
        attention_mask = attention_mask.float()
    query_32, key_32, value_32 = query.float(), key.float(), value.float()
    if _grouped_with_a_mask(module, query, attention_mask, kwargs):
        output, weights = _grouped_attention(query_32, key_32, value_32, attention_mask, kwargs), None
    else:
        output, weights = sdpa_attention_forward(module, query_32, key_32, value_32, attention_mask, **kwargs)
    return output.to(query.dtype), weights


def _grouped_with_a_mask(module: nn.Module, query: Tensor, mask: Tensor | None, options: dict[str, object]) -> bool:
    """Whether this is a grouped-query attention of several queries under a mask, with nothing SDPA lacks."""
    grouped = getattr(module, "num_key_value_groups", 1) > 1
    plain = all(options.get(name) is None for name in ("softcap", "position_bias")) and not options.get(
        "output_attentions", False
    )
    return grouped and mask is not None and query.shape[2] > 1 and plain


def _grouped_attention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor, options: dict[str, object]) -> Tensor:
    """`[B, T, heads, D]` attention output, each key-value head serving its group of query heads in place.

    Transformers copies the keys and values once per query head whenever there is a mask (`repeat_kv`), since
    CUDA's fused kernels take no mask with grouped heads; PyTorch's CPU kernel does (`enable_gqa`), and gives the same
    output bits without the copies: Qwen's 14 query heads share 2 key-value heads, so a training bucket's attention
    wrote and read seven copies of its keys and values, forward and backward.
    """
    output = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=mask,
        dropout_p=float(options.get("dropout") or 0.0),
        scale=options.get("scaling"),
        enable_gqa=True,
    )
    return output.transpose(1, 2).contiguous()


def attend_in_fp32(model: PreTrainedModel) -> bool:
    """Make a bf16 model on a CPU that attends through SDPA compute its attention in fp32; whether it now does.

    Same masks as SDPA's; any other model (fp32, another device, another attention implementation) is left as it is.
    """
    if model.dtype != torch.bfloat16 or model.device.type != "cpu" or model.config._attn_implementation != "sdpa":
        return False
    AttentionInterface.register(FP32_SDPA, sdpa_in_fp32)
    AttentionMaskInterface.register(FP32_SDPA, sdpa_mask)
    model.set_attn_implementation(FP32_SDPA)
    return model.config._attn_implementation == FP32_SDPA
