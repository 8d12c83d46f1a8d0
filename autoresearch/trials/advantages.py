"""Group-relative advantages (GRPO) and the per-token KL penalty against the base model."""

from __future__ import annotations

import math
from collections.abc import Sequence

# Below this spread a group's rewards are equal up to rounding: it has nothing to say about which sample was better.
MIN_REWARD_STD = 1e-6


def group_advantages(rewards_G: Sequence[float], normalize_std: bool) -> list[float] | None:
    """Each completion's reward minus its group's mean, divided by the group's std when `normalize_std`.

    Returns None for a group whose rewards are all equal: every advantage would be 0, so its datums are dropped
    rather than sent (as tinker-cookbook's `remove_constant_reward_groups` does). The std is the population one
    (the group is the whole sample of that prompt's completions).
    """
    mean = sum(rewards_G) / len(rewards_G)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards_G) / len(rewards_G))
    if std < MIN_REWARD_STD:
        return None
    scale = std if normalize_std else 1.0
    return [(r - mean) / scale for r in rewards_G]


def kl_penalized_advantages(
    advantage: float, sampled_logprobs_T: Sequence[float], base_logprobs_T: Sequence[float], kl_coef: float
) -> list[float]:
    """Per-token advantages `advantage - kl_coef * (logp_policy - logp_base)` over a completion's tokens.

    `logp_policy - logp_base` at a token sampled from the policy is the "k1" estimator of KL(policy || base): its
    expectation over the policy's samples is the KL, token by token. Folding it into the advantage makes it a
    per-token reward penalty (as in InstructGPT), so every policy-gradient loss optimises
    `reward - kl_coef * KL` without a change to the loss. tinker-cookbook's `incorporate_kl_penalty` also adds the
    batch mean of the estimate back, which shifts every advantage by the same amount; we keep the plain penalty.
    """
    return [
        advantage - kl_coef * (policy - base) for policy, base in zip(sampled_logprobs_T, base_logprobs_T, strict=True)
    ]
