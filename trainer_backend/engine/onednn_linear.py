"""Linear layers on an x86 CPU through oneDNN, which runs them up to twice as fast as the GEMM PyTorch picks.

PyTorch sends a float32 `F.linear` on a CPU to MKL's sgemm. On this project's AMD EPYC CPU, MKL does not run
AVX-512 kernels; oneDNN's matmul (`torch.ops.mkldnn._linear_pointwise`, the kernel torch.compile's CPU backend emits
for linear layers) does. At Gemma 3 270M's shapes on 2 cores, `python -m benchmarks.roofline` measured MKL at 158 to
208 GFLOP/s and oneDNN at 234 to 467, and a 32-row decode step went from 224 to 137 ms. The results are the same dot
products summed in another order.

A bf16 `F.linear` already is oneDNN's matmul, but on a weight in PyTorch's row-major layout, which oneDNN reorders
into its blocked one at every call. A frozen bf16 weight (the base model's, under LoRA) is reordered once instead
(`packed_weight`), and its product is the same bits.

`linear` is `F.linear` through oneDNN where it applies, differentiable in all three arguments; `route_linears`
makes a model's own `nn.Linear` layers call it. LoRA layers wrap the routed layers and keep their own small ones.
"""

from __future__ import annotations

import platform

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

# Measured on x86 in float32, what the engine computes in on a CPU without bf16 instructions. A bf16 `F.linear`
# on a CPU already is oneDNN's matmul; elsewhere PyTorch's own choice stands.
_ONEDNN_HERE = torch.backends.mkldnn.is_available() and platform.machine().lower() in ("x86_64", "amd64")
# Asked once: a routed layer checks whether to pack at every forward, 168 times a decode step for Qwen.
_BF16_HERE = _ONEDNN_HERE and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def applies(weight: Tensor) -> bool:
    """Whether `linear` with this weight goes through oneDNN: a float32 tensor on an x86 CPU."""
    return _ONEDNN_HERE and weight.device.type == "cpu" and weight.dtype == torch.float32


def _packable(weight: Tensor) -> bool:
    return _BF16_HERE and weight.device.type == "cpu" and weight.dtype == torch.bfloat16


def packs(weight: Tensor) -> bool:
    """Whether a routed layer reorders this weight once: a frozen bf16 tensor on an x86 CPU with bf16 instructions."""
    return not weight.requires_grad and _packable(weight)


def packed_weight(weight_OI: Tensor) -> Tensor:
    """`weight_OI` in oneDNN's blocked layout: an opaque tensor that only `linear` reads. `packs(weight_OI)` holds."""
    # A tensor made under inference mode could not meet autograd later; the packed copy is a constant, made outside it.
    with torch.inference_mode(False), torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(weight_OI, None)


def _project(input_NI: Tensor, weight_OI: Tensor, bias_O: Tensor | None) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(input_NI, weight_OI, bias_O, "none", [], "")


class _OneDnnLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input_NI: Tensor, weight_OI: Tensor, bias_O: Tensor | None, packed_OI: Tensor | None) -> Tensor:
        ctx.save_for_backward(input_NI if ctx.needs_input_grad[1] else None, weight_OI)
        return _project(input_NI, weight_OI if packed_OI is None else packed_OI, bias_O)

    @staticmethod
    def backward(ctx, upstream_NO: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None, None]:
        input_NI, weight_OI = ctx.saved_tensors
        upstream_NO = upstream_NO.contiguous()
        # The input gradient is a linear layer of the transposed weight: a view, which oneDNN reads in place.
        input_grad = _project(upstream_NO, weight_OI.t(), None) if ctx.needs_input_grad[0] else None
        weight_grad = upstream_NO.T @ input_NI if ctx.needs_input_grad[1] else None
        bias_grad = upstream_NO.sum(dim=0) if ctx.needs_input_grad[2] else None
        return input_grad, weight_grad, bias_grad, None


def linear(
    input_XI: Tensor, weight_OI: Tensor, bias_O: Tensor | None = None, packed_OI: Tensor | None = None
) -> Tensor:
    """`F.linear(input_XI, weight_OI, bias_O)`, through oneDNN where `applies(weight_OI)` and the dtypes agree, or
    where `packed_OI` is `packed_weight(weight_OI)` and the input has the weight's dtype."""
    if input_XI.dtype != weight_OI.dtype or (packed_OI is None and not applies(weight_OI)):
        return F.linear(input_XI, weight_OI, bias_O)
    input_NI = input_XI.reshape(-1, input_XI.shape[-1]).contiguous()
    tracked = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (input_XI, weight_OI, bias_O))
    if tracked:
        output_NO = _OneDnnLinear.apply(input_NI, weight_OI, bias_O, packed_OI)
    else:
        output_NO = _project(input_NI, weight_OI if packed_OI is None else packed_OI, bias_O)
    return output_NO.reshape(*input_XI.shape[:-1], weight_OI.shape[0])


class RoutedLinear(nn.Linear):
    """An `nn.Linear` whose forward is `linear`; `route_linears` turns a model's layers into it in place.

    A weight that `packs` is reordered at its first use and again whenever it is replaced or changed in place,
    unless `route_linears` left it unpacked.
    """

    packs_weight = True

    def forward(self, input: Tensor) -> Tensor:
        return linear(input, self.weight, self.bias, self._packed())

    def _packed(self) -> Tensor | None:
        weight = self.weight
        if not (self.packs_weight and packs(weight)):
            return None
        # Set by the first call: `route_linears` changes an existing layer's class, so no __init__ runs.
        source, version, packed = getattr(self, "_packing", (None, -1, None))
        if source is not weight or version != weight._version:
            packed = packed_weight(weight)
            self._packing = (weight, weight._version, packed)
        return packed


def route_linears(model: nn.Module, unpacked: nn.Module | None = None) -> int:
    """Make every plain `nn.Linear` of `model` whose weight oneDNN runs (an fp32 one, or a bf16 one it can pack when
    frozen) go through it; how many were changed. `unpacked`, one of them, keeps its weight in PyTorch's layout
    alone, where a packed copy would cost memory for little use."""
    changed = 0
    for module in model.modules():
        # A sharded weight (FSDP2's, `sharding/`) is gathered whole only while its layer runs: a packed copy would be
        # whole all the time, and stale after the next gather.
        if type(module) is not nn.Linear or isinstance(module.weight, DTensor):
            continue
        if applies(module.weight) or _packable(module.weight):
            module.__class__ = RoutedLinear
            if module is unpacked:
                module.packs_weight = False
            changed += 1
    return changed
