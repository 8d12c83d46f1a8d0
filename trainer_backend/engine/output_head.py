"""How a causal LM turns hidden states into logits, so the engine can do that step its own way for any model.

The engine's speed and memory paths (the one-pass token draw, the chunked unembedding in training, the target
log-probs without whole logits) run the decoder on its own and apply the output layer themselves. That is exact
only for a model whose logits are `softcap(hidden @ W.T)`: a linear head without bias on the decoder's last hidden
states, capped by `tanh` when the config has a `final_logit_softcapping` (Gemma). Whether a model is such a model
is a property of its weights and forward, not of its architecture's name, so it is checked: once per model, its
own forward and the split computation score a few tokens, and they must agree.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

# The split computation sums in another order than the model's own head; both are fp32 or bf16 dot products of
# the hidden width. A model whose forward does anything more (a logit scale, a bias) differs by far more.
_AGREEMENT = {torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 5e-3}
_PROBE_TOKENS = 6

_checked: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class LinearOutputHead:
    """A causal LM seen as decoder, then a linear head (maybe wrapped by a LoRA layer), then an optional softcap."""

    decoder: nn.Module  # returns `last_hidden_state`, the normed states the head reads
    head: nn.Module  # the output embedding as the model holds it: an nn.Linear, or PEFT's LoRA layer around one
    softcap: float | None

    @property
    def weight(self) -> Tensor:
        """The base head's weight, `[V, H]`, without any adapter."""
        return getattr(self.head, "base_layer", self.head).weight

    def trained_by(self, adapter: str | None) -> bool:
        """Whether `adapter` has a LoRA layer on the head, which then adds a low-rank term to the logits."""
        return adapter is not None and hasattr(self.head, "lora_A") and adapter in self.head.lora_A

    def logits(self, hidden_RH: Tensor) -> Tensor:
        """The logits of these hidden states through the head as it stands (its active adapters included)."""
        return cap(self.head(hidden_RH), self.softcap)


def cap(logits: Tensor, softcap: float | None) -> Tensor:
    """`tanh(logits / c) * c`, the final-logit softcap, or the logits unchanged when there is none."""
    return logits if softcap is None else torch.tanh(logits / softcap) * softcap


def linear_output_head(causal_lm: PreTrainedModel) -> LinearOutputHead | None:
    """The model as decoder and linear head, or None when its logits are something else (then use its forward).

    `causal_lm` is the model itself, not a `PeftModel` around it: LoRA layers inside it are part of its modules, so
    the head found is the one a forward uses.
    """
    structure = _structure(causal_lm)
    if structure is None:
        return None
    if causal_lm not in _checked:
        _checked[causal_lm] = _agrees_with_forward(causal_lm, structure)
    return structure if _checked[causal_lm] else None


def _structure(causal_lm: PreTrainedModel) -> LinearOutputHead | None:
    get_decoder = getattr(causal_lm, "get_decoder", None)
    decoder = get_decoder() if get_decoder is not None else None
    head = causal_lm.get_output_embeddings()
    base = getattr(head, "base_layer", head)
    if decoder is None or decoder is causal_lm or not isinstance(base, nn.Linear) or base.bias is not None:
        return None
    softcap = getattr(causal_lm.config.get_text_config(), "final_logit_softcapping", None)
    return LinearOutputHead(decoder=decoder, head=head, softcap=softcap)


def _agrees_with_forward(causal_lm: PreTrainedModel, structure: LinearOutputHead) -> bool:
    weight = structure.weight
    tokens_1T = torch.arange(_PROBE_TOKENS, device=weight.device)[None] % weight.shape[0]
    was_training = causal_lm.training
    causal_lm.eval()
    try:
        with torch.inference_mode():
            own_1TV = causal_lm(input_ids=tokens_1T, use_cache=False).logits.float()
            hidden_1TH = structure.decoder(input_ids=tokens_1T, use_cache=False).last_hidden_state
            split_1TV = structure.logits(hidden_1TH).float()
    finally:
        causal_lm.train(was_training)
    scale = float(own_1TV.abs().max().clamp(min=1.0))
    tolerance = _AGREEMENT.get(weight.dtype, 5e-2) * scale
    return own_1TV.shape == split_1TV.shape and float((own_1TV - split_1TV).abs().max()) <= tolerance
