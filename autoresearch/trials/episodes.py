"""Multi-turn rollouts (a task's agentic mode): each episode samples a turn, reads the task's answer, and goes on.

An episode's tokens after the prompt are its turns and the task's observations, in order; only the turns were
sampled, so only they are trained (`Completion.trained`), and the observations stay in the sequence as context.
All episodes' next turns are in flight at once; the first turn of a group is one request with `num_samples`
sequences, since every episode of a group starts from the same prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import tinker
from tinker import types

from autoresearch.trials.rollouts import Completion, Group, derived_seed
from tasks.interface import Episode

if TYPE_CHECKING:
    # The renderer holds its trial's mode, which plays episodes with this module: names for annotations only.
    from autoresearch.trials.data import Prompt, PromptRenderer


@dataclass
class EpisodeRollout:
    """One episode and the tokens it has added after the prompt: sampled turns and the task's observations."""

    episode: Episode
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    trained: list[bool] = field(default_factory=list)

    def take_turn(self, tokens: Sequence[int], logprobs: Sequence[float] | None, renderer: PromptRenderer) -> None:
        """Add a sampled turn (its tokens and their sampling log-probs, zeros if the sampler gave none) and give it
        to the episode; the observation it gets back follows it."""
        self.tokens += [int(t) for t in tokens]
        self.logprobs += [float(lp) for lp in logprobs] if logprobs else [0.0] * len(tokens)
        self.trained += [True] * len(tokens)
        observation = self.episode.step(renderer.decode(tokens))
        if observation is not None:
            observed = renderer.tokenizer.encode(observation, add_special_tokens=False)
            self.tokens += observed
            self.logprobs += [0.0] * len(observed)
            self.trained += [False] * len(observed)

    def completion(self) -> Completion:
        return Completion(tuple(self.tokens), tuple(self.logprobs), self.episode.transcript(), tuple(self.trained))


def play_episodes(
    sampler: tinker.SamplingClient,
    prompts: Sequence[Prompt],
    num_samples: int,
    params: Sequence[types.SamplingParams],
    renderer: PromptRenderer,
    max_turns: int,
) -> list[list[EpisodeRollout]]:
    """`num_samples` episodes of at most `max_turns` turns for every prompt, run to their end.

    `params[i]` samples prompt i's episodes (each later turn with a seed derived from its own, so a seeded run
    plays the same episodes again).
    """
    task = renderer.task
    rollouts = [[EpisodeRollout(task.episode(p.example, max_turns)) for _ in range(num_samples)] for p in prompts]
    first = [
        sampler.sample(types.ModelInput.from_ints(list(p.tokens)), num_samples, prompt_params)
        for p, prompt_params in zip(prompts, params, strict=True)
    ]
    for group, future in zip(rollouts, first, strict=True):
        for rollout, turn in zip(group, future.result().sequences, strict=True):
            rollout.take_turn(turn.tokens, turn.logprobs, renderer)
    for turn_index in range(1, max_turns):
        live = [(i, j) for i, group in enumerate(rollouts) for j, r in enumerate(group) if not r.episode.done]
        if not live:
            break
        futures = []
        for i, j in live:
            seed = params[i].seed
            turn_params = params[i].model_copy(
                update={"seed": None if seed is None else derived_seed(seed, j, turn_index)}
            )
            context = [*prompts[i].tokens, *rollouts[i][j].tokens]
            futures.append(sampler.sample(types.ModelInput.from_ints(context), 1, turn_params))
        for (i, j), future in zip(live, futures, strict=True):
            turn = future.result().sequences[0]
            rollouts[i][j].take_turn(turn.tokens, turn.logprobs, renderer)
    return rollouts


def sample_episode_groups(
    sampler: tinker.SamplingClient,
    prompts: Sequence[Prompt],
    num_samples: int,
    params: Sequence[types.SamplingParams],
    renderer: PromptRenderer,
    max_turns: int,
    reward_spec: object,
) -> list[Group]:
    """The groups of one RL step in the agentic mode: every prompt's episodes, played out and scored by the task."""
    rollouts = play_episodes(sampler, prompts, num_samples, params, renderer, max_turns)
    flat = [r for group in rollouts for r in group]
    scores = iter(renderer.task.score_episodes([r.episode for r in flat], reward_spec))
    return [
        Group(
            prompt=prompt, completions=tuple(r.completion() for r in group), scores=tuple(next(scores) for _ in group)
        )
        for prompt, group in zip(prompts, rollouts, strict=True)
    ]
