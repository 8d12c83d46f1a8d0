"""Sampling groups of completions from the current policy and scoring them with the task under a reward spec."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import tinker
from tinker import types

from autoresearch.errors import BackendResponseError
from tasks.interface import AnyTask, CompletionScore

if TYPE_CHECKING:
    # The renderer holds its trial's mode, which samples with this module: names for annotations only.
    from autoresearch.trials.data import Prompt, PromptRenderer


def derived_seed(*parts: object) -> int:
    """A sampling seed fixed by its parts (trial seed, step, prompt), so a resumed run samples what it would have."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


@dataclass(frozen=True)
class Completion:
    """One sampled completion: its tokens, the sampler's log-prob of each, and the decoded text."""

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str
    # Which tokens the policy sampled, and so trains on; None: all. An episode's observations are not trained.
    trained: tuple[bool, ...] | None = None

    @property
    def trained_tokens(self) -> int:
        return len(self.tokens) if self.trained is None else sum(self.trained)

    @property
    def turns(self) -> int:
        """Policy turns: the runs of sampled tokens (1 for a single-turn completion)."""
        if self.trained is None:
            return 1
        return sum(1 for i, trained in enumerate(self.trained) if trained and (i == 0 or not self.trained[i - 1]))


@dataclass(frozen=True)
class Group:
    """The completions sampled for one prompt, with their scores once scored."""

    prompt: Prompt
    completions: tuple[Completion, ...]
    scores: tuple[CompletionScore, ...] = ()
    # The sampler's log-probs of the prompt tokens (first None), when asked for.
    prompt_logprobs: tuple[float | None, ...] | None = None

    @property
    def rewards(self) -> list[float]:
        return [score.reward for score in self.scores]


def sample_groups(
    sampler: tinker.SamplingClient,
    prompts: Sequence[Prompt],
    num_samples: int,
    params: Sequence[types.SamplingParams],
    renderer: PromptRenderer,
    include_prompt_logprobs: bool = False,
) -> list[Group]:
    """Sample `num_samples` completions for every prompt, all requests in flight at once.

    `params[i]` are the sampling parameters of prompt i (each with its own seed).
    """
    futures = [
        sampler.sample(
            types.ModelInput.from_ints(list(prompt.tokens)),
            num_samples,
            prompt_params,
            include_prompt_logprobs=include_prompt_logprobs,
        )
        for prompt, prompt_params in zip(prompts, params, strict=True)
    ]
    groups = []
    for prompt, future in zip(prompts, futures, strict=True):
        response = future.result()
        if include_prompt_logprobs and response.prompt_logprobs is None:
            raise BackendResponseError("the backend returned no prompt log-probs although they were asked for")
        completions = tuple(
            Completion(tuple(s.tokens), tuple(s.logprobs or ()), renderer.decode(s.tokens)) for s in response.sequences
        )
        prompt_logprobs = tuple(response.prompt_logprobs) if response.prompt_logprobs is not None else None
        groups.append(Group(prompt=prompt, completions=completions, prompt_logprobs=prompt_logprobs))
    return groups


def score_groups(groups: Sequence[Group], task: AnyTask, reward_spec: object) -> list[Group]:
    """The groups with every completion scored by the task under `reward_spec`, all in one batch."""
    items = [(group.prompt.example, c.text) for group in groups for c in group.completions]
    scores = iter(task.score_batch(items, reward_spec))
    return [replace(group, scores=tuple(next(scores) for _ in group.completions)) for group in groups]
