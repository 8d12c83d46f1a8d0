"""The engine's own types: what it is asked to compute and what it answers, and the settings of an adapter and its
optimizer. The wire layer and the service convert to and from these at their edge; the engine imports nothing
above it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

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


StopReason = Literal["stop", "length"]
TopkLogprobs = tuple[tuple[int, float], ...]
# Completion tokens when a request names none: Tinker's `sample` (its SamplingParams leave max_tokens None) and
# OpenAI's /v1/completions, whose own default this is.
DEFAULT_MAX_TOKENS = 16


class SamplingInputError(UserInputError, ValueError):
    """A sampling request the engine cannot serve; the message names the field and its value."""


@dataclass(frozen=True)
class SamplingRequest:
    """One prompt, the weights to sample it from, and how; the service builds it from the wire's `SampleRequest` (or an
    OpenAI-compatible request), and every sampler serves it as it is."""

    prompt_tokens: tuple[int, ...]
    num_samples: int = 1
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 1.0  # 0 samples greedily
    top_k: int = -1  # -1 or 0: no limit
    top_p: float = 1.0  # in (0, 1]; 1 keeps the whole distribution
    seed: int | None = None  # the same seed and request give the same tokens; None draws a fresh seed
    # Whether the model's EOS ids end a sequence: False for Tinker's `stop=[]` and OpenAI's `ignore_eos`.
    stop_at_eos: bool = True
    stop_token_ids: tuple[int, ...] = ()  # in addition to the model's EOS ids
    stop_strings: tuple[str, ...] = ()
    prompt_logprobs: bool = False
    topk_prompt_logprobs: int = 0  # k > 0 returns the k most likely tokens at each prompt position
    # Makes each sample's constraint (structured output); a sample ends when its constraint is finished.
    constraint: Callable[[], TokenConstraint] | None = None
    # Called with (sample index, token) as each token is drawn, on the engine's thread (streaming).
    on_token: Callable[[int, int], None] | None = None
    # A sampler checkpoint folder whose weights it samples; None for the base model.
    weights_folder: Path | None = None

    @property
    def scores_prompt(self) -> bool:
        """Whether it asks for its prompt's log-probs: every prompt position's logits, so a prefill of its own."""
        return self.prompt_logprobs or self.topk_prompt_logprobs > 0

    def check(self, vocab_size: int, max_context_length: int) -> None:
        """Raises SamplingInputError naming the field when the request cannot be served: an empty prompt, token ids
        outside the vocabulary, a count or a sampling parameter out of range, or a prompt plus `max_tokens` past the
        model's context. The service checks at its edge (a 400 before anything is queued), the engine again for the
        callers in process."""
        prompt = self.prompt_tokens
        if not prompt:
            raise SamplingInputError("prompt_tokens must not be empty")
        for field, ids in (("prompt_tokens", prompt), ("stop_token_ids", self.stop_token_ids)):
            for index, token in enumerate(ids):
                if not 0 <= token < vocab_size:
                    raise SamplingInputError(f"{field}[{index}] = {token} is outside the vocabulary [0, {vocab_size})")
        if self.num_samples < 1:
            raise SamplingInputError(f"num_samples must be at least 1, got {self.num_samples}")
        if self.max_tokens < 1:
            raise SamplingInputError(f"max_tokens must be at least 1, got {self.max_tokens}")
        self.check_fits(max_context_length)
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise SamplingInputError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < -1:
            raise SamplingInputError(f"top_k must be -1 or 0 (no limit) or a positive count, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise SamplingInputError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.topk_prompt_logprobs < 0:
            raise SamplingInputError(f"topk_prompt_logprobs must be >= 0, got {self.topk_prompt_logprobs}")
        for index, stop in enumerate(self.stop_strings):
            if not stop:
                raise SamplingInputError(f"stop_strings[{index}] is empty; it would stop every sequence at once")

    def check_fits(self, max_context_length: int) -> None:
        """Raises SamplingInputError, naming both numbers, when the prompt plus `max_tokens` is past the context."""
        prompt, total = len(self.prompt_tokens), len(self.prompt_tokens) + self.max_tokens
        if total > max_context_length:
            room = max_context_length - prompt
            fix = f"ask for at most {room} tokens" if room > 0 else "shorten the prompt"
            raise SamplingInputError(
                f"prompt length {prompt} + max_tokens {self.max_tokens} = {total} exceeds the model's context "
                f"length {max_context_length}: {fix}"
            )


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


@dataclass(frozen=True)
class ForwardBackwardCall:
    """One client's forward or forward/backward request."""

    model_id: str
    datums: Sequence[DecodedDatum]
    loss_fn: str
    loss_fn_config: dict[str, float | str] | None
    forward_only: bool
