"""Group-relative advantages and the per-token KL penalty, checked by hand."""

from __future__ import annotations

import pytest

from autoresearch.trials.advantages import group_advantages, kl_penalized_advantages


def test_advantages_are_rewards_minus_the_group_mean() -> None:
    assert group_advantages([1.0, 0.0, 0.0, 1.0], normalize_std=False) == [0.5, -0.5, -0.5, 0.5]


def test_normalised_advantages_are_divided_by_the_group_std() -> None:
    # Population std of [1, 0, 0, 1] is 0.5.
    assert group_advantages([1.0, 0.0, 0.0, 1.0], normalize_std=True) == [1.0, -1.0, -1.0, 1.0]
    assert group_advantages([3.0, 1.0], normalize_std=True) == [1.0, -1.0]


def test_a_group_whose_rewards_are_all_equal_has_no_advantages() -> None:
    assert group_advantages([0.0, 0.0, 0.0, 0.0], normalize_std=False) is None
    assert group_advantages([0.7, 0.7], normalize_std=True) is None


def test_the_kl_penalty_subtracts_the_scaled_log_ratio_per_token() -> None:
    # logp_policy - logp_base = [0.5, -1.0]
    penalized = kl_penalized_advantages(0.5, [-1.0, -2.0], [-1.5, -1.0], kl_coef=0.1)
    assert penalized == pytest.approx([0.45, 0.6])
