"""The figures a trial records per step, and the summary of a batch of scored groups."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from autoresearch.trials.rollouts import Group


@dataclass(frozen=True)
class StepMetrics:
    """One RL step, as one line of metrics.jsonl (components flattened to `reward/<kind>`)."""

    step: int
    reward_mean: float
    reward_std: float
    # Mean weighted value of each reward component over the batch.
    reward_components: dict[str, float]
    # Fraction of the batch's completions whose result matched (under the reward spec's database setting).
    accuracy: float
    # Groups whose rewards differed, and the datums they gave; the rest carried no signal.
    groups_kept: int
    datums: int
    # Mean loss per trained completion token (the loss is a sum); None when no group was kept.
    loss: float | None
    # Mean of logp_policy - logp_base over trained tokens; None when kl_coef is 0.
    kl: float | None
    completion_tokens_mean: float
    # Completion tokens sampled per second of sampling.
    tokens_per_s: float
    step_time_s: float
    # Policy turns per episode in the agentic mode; None for single-turn completions.
    turns_mean: float | None = None

    def to_record(self) -> dict:
        record = asdict(self)
        components = record.pop("reward_components")
        return record | {f"reward/{kind}": value for kind, value in components.items()}


@dataclass(frozen=True)
class BatchSummary:
    """What the scored groups of one step say, before any training."""

    reward_mean: float
    reward_std: float
    reward_components: dict[str, float]
    accuracy: float
    # Tokens the policy sampled (an episode's observations are not counted).
    completion_tokens: int
    completions: int
    turns_mean: float


def summarize_groups(groups: Sequence[Group]) -> BatchSummary:
    scores = [score for group in groups for score in group.scores]
    rewards = [score.reward for score in scores]
    kinds = scores[0].components.keys()
    return BatchSummary(
        reward_mean=statistics.fmean(rewards),
        reward_std=statistics.pstdev(rewards),
        reward_components={kind: statistics.fmean(s.components[kind] for s in scores) for kind in kinds},
        accuracy=statistics.fmean(float(s.correct) for s in scores),
        completion_tokens=sum(c.trained_tokens for group in groups for c in group.completions),
        completions=len(scores),
        turns_mean=statistics.fmean(c.turns for group in groups for c in group.completions),
    )
