"""From one step's scored groups to the datums it trains on."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tinker import types

from autoresearch.trials.advantages import group_advantages, kl_penalized_advantages
from autoresearch.trials.datums import rl_datum
from autoresearch.trials.rollouts import Completion, Group


@dataclass(frozen=True)
class Sample:
    """A completion chosen for training, with its group-relative advantage."""

    group: Group
    completion: Completion
    advantage: float


@dataclass(frozen=True)
class TrainingBatch:
    """The datums of one RL step and what they hold."""

    datums: list[types.Datum]
    groups_kept: int
    completion_tokens: int
    # Mean logp_policy - logp_base over the trained tokens; None without a KL penalty.
    kl: float | None


def select_samples(groups: Sequence[Group], normalize_std: bool) -> list[Sample]:
    """The completions of groups whose rewards differ, each with its advantage; empty completions have no token
    to train."""
    samples = []
    for group in groups:
        advantages_G = group_advantages(group.rewards, normalize_std)
        if advantages_G is None:
            continue
        samples += [
            Sample(group, completion, advantage)
            for completion, advantage in zip(group.completions, advantages_G, strict=True)
            if completion.tokens
        ]
    return samples


def build_training_batch(
    samples: Sequence[Sample], base_logprobs: Sequence[Sequence[float]] | None, kl_coef: float
) -> TrainingBatch:
    """One datum per sample; with `base_logprobs` (the base model's log-prob of each completion token, per
    sample) the advantages carry the per-token KL penalty."""
    datums, kl_sum = [], 0.0
    for index, sample in enumerate(samples):
        completion = sample.completion
        if completion.trained is not None:
            # An episode: its turns carry the advantage, the task's observations between them none.
            advantages_T = [sample.advantage if trained else 0.0 for trained in completion.trained]
        elif base_logprobs is None:
            advantages_T = [sample.advantage] * len(completion.tokens)
        else:
            advantages_T = kl_penalized_advantages(sample.advantage, completion.logprobs, base_logprobs[index], kl_coef)
            kl_sum += sum(p - b for p, b in zip(completion.logprobs, base_logprobs[index], strict=True))
        datums.append(
            rl_datum(
                sample.group.prompt.tokens,
                completion.tokens,
                completion.logprobs,
                advantages_T,
                sample.group.prompt_logprobs,
            )
        )
    tokens = sum(s.completion.trained_tokens for s in samples)
    return TrainingBatch(
        datums=datums,
        groups_kept=len({id(s.group) for s in samples}),
        completion_tokens=tokens,
        kl=kl_sum / tokens if base_logprobs is not None and tokens else None,
    )
