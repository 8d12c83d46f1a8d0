"""Rollouts: every prompt's episodes played by the current policy, then scored by the task under a reward spec.

Single-turn completions are episodes of one step, so there is one rollout path. An episode's tokens after the
prompt are its turns and the task's observations, in order; only the turns were sampled, so only they are trained
(`Completion.trained`), and the observations stay in the sequence as context (in the chat format an observation is
the rest of the assistant's turn, the next user turn and the opening of the assistant's next one). The first turn
of a group is one request with `num_samples` sequences, since every episode of a group starts from the same prompt;
all episodes' later turns are in flight at once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import tinker
from tinker import types

from autoresearch.errors import BackendResponseError
from autoresearch.trials.data import Prompt, PromptRenderer
from tasks.interface import AnyTask, CompletionScore, Episode


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
    # The finished episode of each completion, in order, which the task scores.
    episodes: tuple[Episode, ...] = ()

    @property
    def rewards(self) -> list[float]:
        return [score.reward for score in self.scores]


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
            observed = renderer.observation(observation, tokens)
            self.tokens += observed
            self.logprobs += [0.0] * len(observed)
            self.trained += [False] * len(observed)

    def completion(self) -> Completion:
        # Trained throughout (one turn, no observation): None, as for any completion the policy wrote whole.
        trained = None if all(self.trained) else tuple(self.trained)
        return Completion(tuple(self.tokens), tuple(self.logprobs), self.episode.transcript(), trained)


def sample_groups(
    sampler: tinker.SamplingClient,
    prompts: Sequence[Prompt],
    num_samples: int,
    params: Sequence[types.SamplingParams],
    renderer: PromptRenderer,
    include_prompt_logprobs: bool = False,
) -> list[Group]:
    """`num_samples` episodes of at most `renderer.max_turns` turns for every prompt, played to their end, unscored.

    `params[i]` samples prompt i's episodes (each later turn with a seed derived from its own, so a seeded run
    plays the same episodes again).
    """
    rollouts = [[EpisodeRollout(renderer.episode(p.example)) for _ in range(num_samples)] for p in prompts]
    first = [
        sampler.sample(
            types.ModelInput.from_ints(list(p.tokens)),
            num_samples,
            prompt_params,
            include_prompt_logprobs=include_prompt_logprobs,
        )
        for p, prompt_params in zip(prompts, params, strict=True)
    ]
    prompt_logprobs = []
    for group, future in zip(rollouts, first, strict=True):
        response = future.result()
        if include_prompt_logprobs and response.prompt_logprobs is None:
            raise BackendResponseError("the backend returned no prompt log-probs although they were asked for")
        prompt_logprobs.append(tuple(response.prompt_logprobs) if response.prompt_logprobs is not None else None)
        for rollout, turn in zip(group, response.sequences, strict=True):
            rollout.take_turn(turn.tokens, turn.logprobs, renderer)
    for turn_index in range(1, renderer.max_turns):
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
    return [
        Group(
            prompt=prompt,
            completions=tuple(r.completion() for r in group),
            prompt_logprobs=logprobs,
            episodes=tuple(r.episode for r in group),
        )
        for prompt, group, logprobs in zip(prompts, rollouts, prompt_logprobs, strict=True)
    ]


def score_groups(groups: Sequence[Group], task: AnyTask, reward_spec: object) -> list[Group]:
    """The groups with every episode scored by the task under `reward_spec`, all in one batch."""
    scores = iter(task.score_episodes([e for group in groups for e in group.episodes], reward_spec))
    return [replace(group, scores=tuple(next(scores) for _ in group.episodes)) for group in groups]
