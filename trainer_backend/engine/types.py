"""The engine's own types: what it is asked to compute and what it answers, and the settings of an adapter and its
optimizer. The wire layer and the service convert to and from these at their edge; the engine imports nothing
above it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from trainer_backend.errors import UserInputError


@dataclass(frozen=True)
class DecodedDatum:
    """One training example: its input token ids and its loss inputs by name (`target_tokens`, `weights`, ...).

    Integer inputs arrive as int64 tensors and floating ones as float32, as the SDK's public dtypes are.
    """

    model_input_tokens: list[int]
    loss_fn_inputs: dict[str, torch.Tensor]


@dataclass(frozen=True)
class ForwardBackwardResult:
    """What the engine computed for one request: per-datum outputs by name (the SDK reads `logprobs`) and metrics.

    Metric keys are "name:reduction" with a reduction the SDK knows (`REDUCE_MAP`: mean, sum, min, max, slack,
    hash2, unique): the SDK combines the results of a chunked call by that suffix. A 0-d output reaches the client
    with shape [1], as the wire gives every datum a first dimension.
    """

    loss_fn_outputs: list[dict[str, torch.Tensor | np.ndarray]]
    metrics: dict[str, float]


@dataclass(frozen=True)
class LoraSettings:
    """A LoRA adapter's shape: its rank, the layers it adapts, and the seed of its initialisation."""

    rank: int
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = False
    seed: int | None = None


@dataclass(frozen=True)
class AdamSettings:
    """Tinker's AdamParams, applied at each optimizer step (they may change from step to step)."""

    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0

    def validate(self) -> None:
        checks = {
            "learning_rate": self.learning_rate >= 0,
            "beta1": 0 <= self.beta1 < 1,
            "beta2": 0 <= self.beta2 < 1,
            "eps": self.eps > 0,
            "weight_decay": self.weight_decay >= 0,
            "grad_clip_norm": self.grad_clip_norm >= 0,
        }
        for name, ok in checks.items():
            value = getattr(self, name)
            if not ok or not math.isfinite(value):
                raise UserInputError(f"adam_params.{name}={value} is out of range")


class TokenConstraint(Protocol):
    """What one sequence may draw next (a grammar, a JSON schema), advanced with each token it draws.

    The engine draws a constrained row from its logits with every other token masked out, so the token's logprob is
    that of the constrained distribution.
    """

    def allowed(self) -> torch.Tensor:
        """A bool mask over the logits' width: the tokens that may come next."""

    def advance(self, token: int) -> None:
        """Take the drawn token."""

    def finished(self) -> bool:
        """Whether nothing may follow: the sequence ends with the token just taken."""
