"""Tinker's built-in losses, computed from the policy's per-token log-probs and each datum's `loss_fn_inputs`.

Semantics follow the Tinker docs ("Loss functions in Tinker") and SDK 0.38:
- A loss is a SUM over tokens and over the batch, never a mean; any normalisation is the client's, folded into
  `weights` or `advantages`.
- Every per-token input has the shape of the datum's `target_tokens` (`[N]`, or `[N, K]` for several targets
  per position), and so do the policy log-probs. `weights` is optional for every loss (default 1): it is the
  token mask/weight of `cross_entropy`, and multiplies the per-token loss of the RL losses too, so a zero
  weight removes a position whatever the loss.
- `clip_low_threshold` / `clip_high_threshold` are bounds on the importance ratio itself (the docs clamp
  `prob_ratio` to `[low, high]`), not epsilons. They come from `loss_fn_config`, or per datum from
  `loss_fn_inputs` (the SDK's `Datum` types both keys as float32 inputs) as a scalar, `[1]` or per-token tensor.
- Each datum's `loss_fn_outputs` is `{"logprobs": ...}` (the policy's log-probs, which
  `forward_backward_custom` reads back); the only metric Tinker documents is `loss:sum`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from trainer_backend.errors import UserInputError


class UnknownLossError(UserInputError):
    """`loss_fn` names no loss this server implements."""


class LossInputError(UserInputError):
    """A datum's `loss_fn_inputs` or the request's `loss_fn_config` does not fit the chosen loss."""

    def __init__(self, message: str, *, datum_index: int | None = None, key: str | None = None) -> None:
        super().__init__(message if datum_index is None else f"datum {datum_index}: {message}")
        self.datum_index = datum_index
        self.key = key


@dataclass(frozen=True)
class ConfigParam:
    """A numeric loss hyperparameter: its default and the closed range of finite values it may take."""

    default: float
    minimum: float
    maximum: float = math.inf


# The per-token loss before `weights`: (policy logprobs, the datum's inputs cast to the logprobs' dtype,
# resolved hyperparameters as tensors) -> a tensor shaped like the logprobs.
PerTokenLoss = Callable[[Tensor, Mapping[str, Tensor], Mapping[str, Tensor]], Tensor]
# Where the per-token loss can depend on the policy's log-prob, from the datum's inputs alone (bool, shaped like
# `target_tokens`); None: anywhere.
GradientSupport = Callable[[Mapping[str, Tensor]], Tensor | None]


def _everywhere(inputs: Mapping[str, Tensor]) -> None:
    return None


def _where_advantaged(inputs: Mapping[str, Tensor]) -> Tensor:
    # Each of these losses is the advantage times a function of the log-prob: no advantage, no gradient.
    return inputs["advantages"] != 0


@dataclass(frozen=True)
class LossFunction:
    """A built-in loss: the inputs it reads besides `target_tokens`, its hyperparameters, its formula."""

    name: str
    required_inputs: tuple[str, ...]
    params: Mapping[str, ConfigParam]
    per_token: PerTokenLoss
    gradient_support: GradientSupport = _everywhere

    @property
    def accepted_inputs(self) -> tuple[str, ...]:
        # Any hyperparameter may also come per datum, as the SDK allows for the clip thresholds.
        return ("target_tokens", *self.required_inputs, "weights", *self.params)


@dataclass(frozen=True)
class LossResult:
    """What a forward/backward needs from a loss."""

    loss: Tensor
    """Scalar sum over every token of every datum; call `.backward()` on it."""
    metrics: dict[str, float]
    """Tinker-style `name:reduction` metrics: `loss:sum`."""
    outputs: list[dict[str, Tensor]]
    """Per datum, its `loss_fn_outputs`: `{"logprobs": detached policy log-probs}`."""


def _ratio(logprobs: Tensor, inputs: Mapping[str, Tensor]) -> Tensor:
    return torch.exp(logprobs - inputs["logprobs"])


def _clipped_ratio(ratio: Tensor, params: Mapping[str, Tensor]) -> Tensor:
    return torch.clamp(ratio, params["clip_low_threshold"], params["clip_high_threshold"])


def _cross_entropy(logprobs: Tensor, inputs: Mapping[str, Tensor], params: Mapping[str, Tensor]) -> Tensor:
    return -logprobs


def _importance_sampling(logprobs: Tensor, inputs: Mapping[str, Tensor], params: Mapping[str, Tensor]) -> Tensor:
    return -_ratio(logprobs, inputs) * inputs["advantages"]


def _ppo(logprobs: Tensor, inputs: Mapping[str, Tensor], params: Mapping[str, Tensor]) -> Tensor:
    ratio = _ratio(logprobs, inputs)
    advantages = inputs["advantages"]
    return -torch.minimum(ratio * advantages, _clipped_ratio(ratio, params) * advantages)


def _cispo(logprobs: Tensor, inputs: Mapping[str, Tensor], params: Mapping[str, Tensor]) -> Tensor:
    coefficient = _clipped_ratio(_ratio(logprobs, inputs), params).detach()
    return -coefficient * logprobs * inputs["advantages"]


def _dro(logprobs: Tensor, inputs: Mapping[str, Tensor], params: Mapping[str, Tensor]) -> Tensor:
    log_ratio = logprobs - inputs["logprobs"]
    return -(logprobs * inputs["advantages"] - 0.5 * params["beta"] * log_ratio**2)


_RL_INPUTS = ("logprobs", "advantages")
# PPO's defaults are the documented epsilon of 0.2. CISPO's are the docs' current one-sided clip (no lower
# bound, ratio capped at 4). DRO's beta has no documented default; 0.05 is the value every Tinker example uses.
_PPO_CLIP = {
    "clip_low_threshold": ConfigParam(default=0.8, minimum=0.0, maximum=1.0),
    "clip_high_threshold": ConfigParam(default=1.2, minimum=1.0),
}
_CISPO_CLIP = {
    "clip_low_threshold": ConfigParam(default=0.0, minimum=0.0, maximum=1.0),
    "clip_high_threshold": ConfigParam(default=4.0, minimum=1.0),
}

LOSSES: dict[str, LossFunction] = {
    loss.name: loss
    for loss in (
        LossFunction("cross_entropy", (), {}, _cross_entropy),
        LossFunction("importance_sampling", _RL_INPUTS, {}, _importance_sampling, _where_advantaged),
        LossFunction("ppo", _RL_INPUTS, _PPO_CLIP, _ppo, _where_advantaged),
        LossFunction("cispo", _RL_INPUTS, _CISPO_CLIP, _cispo, _where_advantaged),
        # The penalty beta/2 (logp - q)^2 acts wherever the advantage is zero too.
        LossFunction("dro", _RL_INPUTS, {"beta": ConfigParam(default=0.05, minimum=0.0)}, _dro),
    )
}

# The rest of the SDK's LossFnType, and why each is refused.
_UNSUPPORTED_LOSSES = {
    "gspo": "it has no public specification",
    "stable_reinforce": "it has no public specification",
    "custom": (
        "server-side custom losses (ServiceClient.create_custom_loss) are not supported; "
        "pass a Python callable to forward_backward_custom, which runs the loss on the client"
    ),
}


def get_loss(loss_fn: str) -> LossFunction:
    """The built-in loss named `loss_fn`.

    Raises:
        UnknownLossError: the name is not a supported loss; the message lists the supported ones.
    """
    if loss_fn in LOSSES:
        return LOSSES[loss_fn]
    supported = ", ".join(LOSSES)
    if loss_fn in _UNSUPPORTED_LOSSES:
        raise UnknownLossError(
            f"loss_fn {loss_fn!r} is a Tinker loss this server does not implement "
            f"({_UNSUPPORTED_LOSSES[loss_fn]}); supported: {supported}"
        )
    raise UnknownLossError(f"unknown loss_fn {loss_fn!r}; supported: {supported}")


def gradient_positions(loss_fn: str, inputs: Mapping[str, Tensor]) -> Tensor | None:
    """The positions of one datum whose loss can send a gradient to the policy's log-prob (bool, shaped like
    `target_tokens`): where its weight is nonzero and, for losses proportional to the advantage, its advantage is.

    None means every position, also when the inputs do not fit the loss (`compute_loss` reports that).
    """
    loss = LOSSES.get(loss_fn)
    targets = inputs.get("target_tokens")
    if loss is None or targets is None or any(key not in inputs for key in loss.required_inputs):
        return None
    shape = tuple(targets.shape)
    supported = loss.gradient_support(inputs)
    if supported is not None and tuple(supported.shape) != shape:
        return None
    weights = inputs.get("weights")
    if weights is not None:
        if tuple(weights.shape) != shape:
            return None
        supported = weights != 0 if supported is None else supported & (weights != 0)
    return supported


def compute_loss(
    loss_fn: str,
    logprobs: Sequence[Tensor],
    inputs: Sequence[Mapping[str, Tensor]],
    config: Mapping[str, float | str] | None = None,
) -> LossResult:
    """Apply the built-in loss `loss_fn` to a batch.

    Args:
        loss_fn: a Tinker loss name (`LOSSES`).
        logprobs: per datum, the policy's log-probs of its `target_tokens` (same shape), carrying gradient.
        inputs: per datum, its `loss_fn_inputs` as tensors.
        config: the request's `loss_fn_config`; missing keys take the loss's defaults.

    Returns:
        The summed loss, its `loss:sum` metric and each datum's `loss_fn_outputs`.

    Raises:
        UnknownLossError: `loss_fn` is not supported.
        LossInputError: the batch is empty or its lengths differ, a config key is unknown or out of range, or a
            datum lacks an input, has one of the wrong shape, or has a non-finite one.
    """
    loss = get_loss(loss_fn)
    if len(logprobs) != len(inputs):
        raise LossInputError(f"{len(logprobs)} log-prob tensors for {len(inputs)} data")
    if not inputs:
        raise LossInputError("no data: forward_backward needs at least one datum")
    config_params = _resolve_config(loss, config or {})
    total = logprobs[0].new_zeros(())
    for index, (logprobs_T, datum_inputs) in enumerate(zip(logprobs, inputs, strict=True)):
        checked = _check_inputs(loss, index, logprobs_T, datum_inputs)
        params = {name: checked.get(name, logprobs_T.new_tensor(value)) for name, value in config_params.items()}
        loss_T = loss.per_token(logprobs_T, checked, params)
        if "weights" in checked:
            loss_T = loss_T * checked["weights"]
        total = total + loss_T.sum()
    return LossResult(
        loss=total,
        metrics={"loss:sum": float(total.detach())},
        outputs=[{"logprobs": logprobs_T.detach()} for logprobs_T in logprobs],
    )


def _resolve_config(loss: LossFunction, config: Mapping[str, float | str]) -> dict[str, float]:
    unknown = sorted(set(config) - set(loss.params))
    if unknown:
        allowed = ", ".join(loss.params) or "none"
        raise LossInputError(
            f"loss_fn_config key {unknown[0]!r} does not apply to {loss.name} (accepted: {allowed})", key=unknown[0]
        )
    resolved = {}
    for name, param in loss.params.items():
        value = config.get(name, param.default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise LossInputError(f"loss_fn_config {name!r} must be a number, got {value!r}", key=name)
        _check_range(name, param, float(value), "loss_fn_config", None)
        resolved[name] = float(value)
    return resolved


def _check_range(name: str, param: ConfigParam, value: float, source: str, datum_index: int | None) -> None:
    if not (math.isfinite(value) and param.minimum <= value <= param.maximum):
        raise LossInputError(
            f"{source} {name!r} must be a finite number in [{param.minimum}, {param.maximum}], got {value}",
            datum_index=datum_index,
            key=name,
        )


def _check_inputs(
    loss: LossFunction, index: int, logprobs_T: Tensor, inputs: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """The datum's float inputs, validated and cast to the log-probs' dtype and device."""
    accepted = loss.accepted_inputs
    for key in inputs:
        if key not in accepted:
            raise LossInputError(
                f"loss_fn_inputs key {key!r} is not an input of {loss.name} (accepted: {', '.join(accepted)})",
                datum_index=index,
                key=key,
            )
    for key in ("target_tokens", *loss.required_inputs):
        if key not in inputs:
            raise LossInputError(
                f"loss_fn_inputs lacks {key!r}, which {loss.name} requires "
                f"(required: {', '.join(('target_tokens', *loss.required_inputs))})",
                datum_index=index,
                key=key,
            )
    shape = tuple(logprobs_T.shape)
    if tuple(inputs["target_tokens"].shape) != shape:
        raise LossInputError(
            f"'target_tokens' has shape {tuple(inputs['target_tokens'].shape)} but the policy log-probs have "
            f"shape {shape}",
            datum_index=index,
            key="target_tokens",
        )
    checked = {}
    for key, value in inputs.items():
        if key == "target_tokens":
            continue
        per_datum_param = loss.params.get(key)
        # A hyperparameter given per datum may be one value for all positions.
        allowed_shapes = {shape, (), (1,)} if per_datum_param else {shape}
        if tuple(value.shape) not in allowed_shapes:
            raise LossInputError(
                f"{key!r} has shape {tuple(value.shape)} but 'target_tokens' has shape {shape}",
                datum_index=index,
                key=key,
            )
        cast = value.to(device=logprobs_T.device, dtype=logprobs_T.dtype)
        if not bool(torch.isfinite(cast).all()):
            raise LossInputError(f"{key!r} contains NaN or infinite values", datum_index=index, key=key)
        if per_datum_param and cast.numel():
            _check_range(key, per_datum_param, float(cast.min()), "loss_fn_inputs", index)
            _check_range(key, per_datum_param, float(cast.max()), "loss_fn_inputs", index)
        checked[key] = cast
    return checked
