"""A trial's mode, chosen once when it starts: single-turn completions, or episodes that explore before they answer.

Everything the two do differently is a method here: which of the task's prompts and gold completions a renderer
shows (and in which format), how a step's groups are sampled and scored, how held-out answers are played, and
whether a step reports turns. The trial's loop and its evaluation never ask which mode they run.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import tinker
from tinker import types

from autoresearch.errors import ConfigurationError
from autoresearch.trials.config import TrialConfig
from autoresearch.trials.episodes import play_episodes, sample_episode_groups
from autoresearch.trials.metrics import BatchSummary
from autoresearch.trials.rollouts import Group, sample_groups, score_groups
from tasks.interface import AnyTask, TaskExample
from tasks.report import HeldOutReport

if TYPE_CHECKING:
    # The renderer holds its trial's mode, so the mode's module may name it only in annotations.
    from autoresearch.trials.data import Prompt, PromptFormat, PromptRenderer, Tokenizer


@dataclass(frozen=True)
class SampledGroups:
    """One RL step's groups, scored, and the seconds sampling took (for episodes, sampling and scoring: they
    interleave)."""

    groups: list[Group]
    sampling_s: float


class SingleTurn:
    """One completion per prompt: the task's own prompt, each group sampled in one request, all scored as one batch."""

    def prompt_text(self, task: AnyTask, example: TaskExample, shots: Sequence[TaskExample]) -> str:
        return task.render_prompt(example, shots)

    def gold_text(self, task: AnyTask, example: TaskExample) -> str:
        return task.gold_completion(example)

    def prompt_format(self, requested: PromptFormat, tokenizer: Tokenizer) -> Literal["chat", "plain"]:
        """`chat` or `plain`: "auto" is chat exactly when the tokenizer has a chat template.

        Raises:
            ConfigurationError: chat was asked for and the tokenizer has no chat template.
        """
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if requested == "chat" and not has_template:
            raise ConfigurationError(
                "prompt_format: chat was asked for, but the base model's tokenizer has no chat template; use "
                "prompt_format: plain, or serve the model with one (trainer_backend serve --chat-template FILE)"
            )
        if requested == "auto":
            return "chat" if has_template else "plain"
        return requested

    def sample(
        self,
        sampler: tinker.SamplingClient,
        prompts: Sequence[Prompt],
        params: Sequence[types.SamplingParams],
        renderer: PromptRenderer,
        config: TrialConfig,
    ) -> SampledGroups:
        started = time.monotonic()
        # DRO's penalty also acts on prompt positions, so they need the sampler's own log-probs (datums.rl_datum).
        groups = sample_groups(
            sampler, prompts, config.group_size, params, renderer, include_prompt_logprobs=config.loss == "dro"
        )
        sampling_s = time.monotonic() - started
        return SampledGroups(score_groups(groups, renderer.task, config.reward_spec), sampling_s)

    def held_out_report(
        self,
        sampler: tinker.SamplingClient,
        renderer: PromptRenderer,
        examples: Sequence[TaskExample],
        split: str,
        params: types.SamplingParams,
        step: int,
    ) -> HeldOutReport:
        """Every example's completion, all requests in flight at once, judged by the task."""
        futures = [
            sampler.sample(types.ModelInput.from_ints(list(renderer.prompt(e).tokens)), 1, params) for e in examples
        ]
        completions = [renderer.decode(f.result().sequences[0].tokens) for f in futures]
        return renderer.task.report(split, examples, completions, step)

    def turns_mean(self, summary: BatchSummary) -> float | None:
        return None


@dataclass(frozen=True)
class Episodes:
    """Episodes of at most `max_turns` turns on the task's agentic prompt, each scored by the task as it ends."""

    max_turns: int

    def prompt_text(self, task: AnyTask, example: TaskExample, shots: Sequence[TaskExample]) -> str:
        return task.agentic_prompt(example, shots, self.max_turns)

    def gold_text(self, task: AnyTask, example: TaskExample) -> str:
        """A first turn that answers at once."""
        return task.agentic_gold_completion(example)

    def prompt_format(self, requested: PromptFormat, tokenizer: Tokenizer) -> Literal["chat", "plain"]:
        """Always `plain`: an episode is one growing transcript, its observations appended as text.

        Raises:
            ConfigurationError: chat was asked for.
        """
        if requested == "chat":
            raise ConfigurationError(
                "prompt_format: chat is not supported for agentic episodes yet (their turns are one transcript); "
                "use prompt_format: plain or auto"
            )
        return "plain"

    def sample(
        self,
        sampler: tinker.SamplingClient,
        prompts: Sequence[Prompt],
        params: Sequence[types.SamplingParams],
        renderer: PromptRenderer,
        config: TrialConfig,
    ) -> SampledGroups:
        started = time.monotonic()
        # Episodes are scored as they end: sampling and scoring are one phase.
        groups = sample_episode_groups(
            sampler, prompts, config.group_size, params, renderer, self.max_turns, config.reward_spec
        )
        return SampledGroups(groups, time.monotonic() - started)

    def held_out_report(
        self,
        sampler: tinker.SamplingClient,
        renderer: PromptRenderer,
        examples: Sequence[TaskExample],
        split: str,
        params: types.SamplingParams,
        step: int,
    ) -> HeldOutReport:
        """Every example's episode, played out, judged by the task; each answer's completion is its transcript."""
        prompts = [renderer.prompt(e) for e in examples]
        rollouts = play_episodes(sampler, prompts, 1, [params] * len(prompts), renderer, self.max_turns)
        return renderer.task.report_episodes(split, [group[0].episode for group in rollouts], step)

    def turns_mean(self, summary: BatchSummary) -> float | None:
        return summary.turns_mean


Mode = SingleTurn | Episodes
SINGLE_TURN = SingleTurn()


def mode_of(config: TrialConfig) -> Mode:
    """The trial's mode: the one place a trial reads `config.mode`."""
    return Episodes(config.max_turns) if config.mode == "agentic" else SINGLE_TURN
