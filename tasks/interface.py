"""What a trial asks of a task: the interface every task implements, and nothing else.

Trials (`autoresearch.trials`), the tinker-cookbook environment and a task's command line render prompts and play and
score episodes through it only (a single-turn completion is an episode of one step), and a study (`autoresearch`)
searches a task's reward through it only, so a second task drops in by implementing this class and registering itself
in `tasks.registry`. Names end in the shape they hold: `_G` one entry per completion of a group, `_B` one per item of
a batch.
"""

from __future__ import annotations

import random
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar

from pydantic import BaseModel

from tasks.closeable import Closeable
from tasks.errors import SplitError, TaskError
from tasks.report import HeldOutAnswer, HeldOutReport


class TaskExample(Protocol):
    """What every task's example has: an id, and the difficulty level and form held-out accuracy is broken down by."""

    @property
    def id(self) -> str: ...

    @property
    def difficulty(self) -> str: ...

    @property
    def form(self) -> str | None:
        """Whether training data asks questions of this one's form ("seen", "unseen"); None where it is not known."""


class CompletionScore(Protocol):
    """What every task's score of one completion has."""

    @property
    def reward(self) -> float:
        """The reward the completion earns under the spec it was scored with."""

    @property
    def correct(self) -> bool:
        """Whether the completion answers its example correctly."""

    @property
    def components(self) -> Mapping[str, float]:
        """Each reward component's weighted value, by kind (they sum to `reward`)."""


class Episode(Protocol):
    """An attempt at one example: the policy writes a turn, the task answers, until the episode is done.

    A single-turn task's episode is one step (`OneTurn`): the completion, and it is over.
    """

    @property
    def example(self) -> TaskExample: ...

    @property
    def done(self) -> bool:
        """Whether the episode takes no more turns."""

    def step(self, text: str) -> str | None:
        """Take the policy's next turn; return the text the policy reads before its next turn, None once over."""

    def transcript(self) -> str:
        """Every turn and what the task answered, as the policy wrote and read them."""


ExampleT = TypeVar("ExampleT", bound=TaskExample)
# A reward spec is data (a pydantic model), so a study can propose one as JSON and store it.
RewardSpecT = TypeVar("RewardSpecT", bound=BaseModel)


class OneTurn(Generic[ExampleT]):
    """The single-turn episode: one completion, and the episode is over; its transcript is the completion."""

    def __init__(self, example: ExampleT) -> None:
        self.example = example
        self.completion: str | None = None

    @property
    def done(self) -> bool:
        return self.completion is not None

    def step(self, text: str) -> None:
        """Take the completion; the episode ends with it.

        Raises:
            TaskError: the episode already has its completion.
        """
        if self.done:
            raise TaskError(f"the episode of {self.example.id} is over; it takes one turn")
        self.completion = text

    def transcript(self) -> str:
        return self.completion or ""


class Task(Closeable, Generic[ExampleT, RewardSpecT]):
    """A task's data, prompts and scoring; a context manager, as scoring may hold workers and connections.

    What a task says of its reward is known without opening it (class attributes), so a trial config or a study
    spec is validated against it without loading any data.
    """

    name: str
    # A trial config's `reward_spec` is validated as one of these.
    reward_spec_type: type[RewardSpecT]
    # A trial config's `data` (where the examples come from) is validated as one of these; its defaults name the data
    # the task ships with. The registry opens the task on one.
    data_source_type: type[BaseModel]
    # What a trial trains on when its config names no reward spec.
    default_reward_spec: RewardSpecT
    # The component every reward a study builds holds at weight 1: the one that says an answer is right, as the
    # held-out measure does, so a reward a study shapes around it can only win by training a better model.
    base_reward_component: str
    # The components a study may add to the base one, each at a weight it searches.
    optional_reward_components: tuple[str, ...]
    # One paragraph for the LLM that proposes a study's trials: what the task asks of the model, what its held-out
    # measure is, and what each optional reward component pays for.
    description: str

    @classmethod
    @abstractmethod
    def reward_spec_from_weights(cls, weights: Mapping[str, float]) -> RewardSpecT:
        """The base component at weight 1, plus each optional component whose weight is positive (0 leaves it out).

        Raises:
            TaskError: a weight the reward refuses.
        """

    @property
    @abstractmethod
    def split_names(self) -> tuple[str, ...]:
        """The splits the task's data has."""

    @property
    @abstractmethod
    def difficulty_levels(self) -> tuple[str, ...]:
        """Every difficulty level an example can have, easiest first."""

    @abstractmethod
    def split(self, name: str) -> tuple[ExampleT, ...]:
        """The examples of a split, in a fixed order; raises SplitError naming the splits that exist."""

    @abstractmethod
    def few_shot_examples(self, count: int, split: str) -> tuple[ExampleT, ...]:
        """`count` solved examples of `split` that prompts may show before a question."""

    # --- episodes: a prompt, turns until the episode is done, a score. Single-turn is an episode of one step. ---

    @abstractmethod
    def prompt(self, example: ExampleT, shots: Sequence[ExampleT] = (), max_turns: int = 1, chat: bool = False) -> str:
        """The prompt the policy continues to answer `example` in an episode of at most `max_turns` turns (1: one
        completion), showing `shots` solved first. `chat`: the prompt is a chat model's first user turn, and what
        the task answers each turn with comes as the next user turn, so a task may word both for a conversation."""

    @abstractmethod
    def gold_completion(self, example: ExampleT, max_turns: int = 1) -> str:
        """The first turn that answers `example` right at once after its prompt (what a supervised warm-up trains
        on)."""

    def episode(self, example: ExampleT, max_turns: int = 1, chat: bool = False) -> Episode:
        """A fresh episode on `example` of at most `max_turns` turns, played as a conversation when `chat` (as
        `prompt`'s); a task of single-turn episodes refuses more.

        Raises:
            TaskError: the task has no episodes of `max_turns` turns.
        """
        if max_turns != 1:
            raise TaskError(f"task {self.name!r} has no episodes of several turns")
        return OneTurn(example)

    @abstractmethod
    def score_episodes(self, episodes_B: Sequence[Episode], reward_spec: RewardSpecT) -> list[CompletionScore]:
        """The score of each finished episode under `reward_spec`, in order."""

    @abstractmethod
    def judge_episodes(self, episodes_B: Sequence[Episode]) -> list[bool]:
        """Whether each finished episode answers its example correctly by the task's held-out measure, whatever
        reward a trial trains on, so a reward variant can only raise it by making the model answer better."""

    def one_step(self, example: ExampleT, completion: str) -> Episode:
        """The single-turn episode on `example` that `completion` answered."""
        episode = self.episode(example)
        episode.step(completion)
        return episode

    def score_group(
        self, example: ExampleT, completions_G: Sequence[str], reward_spec: RewardSpecT
    ) -> list[CompletionScore]:
        """The score of each completion of one example's group under `reward_spec`."""
        return self.score_episodes([self.one_step(example, completion) for completion in completions_G], reward_spec)

    def report(self, split: str, episodes_B: Sequence[Episode], step: int = 0) -> HeldOutReport:
        """The held-out report of finished episodes, judged by `judge_episodes`; each answer's completion is its
        episode's transcript."""
        answers = [
            HeldOutAnswer(
                example_id=e.example.id,
                difficulty=e.example.difficulty,
                form=e.example.form,
                completion=e.transcript(),
                correct=correct,
            )
            for e, correct in zip(episodes_B, self.judge_episodes(episodes_B), strict=True)
        ]
        return HeldOutReport.of(answers, split, self.difficulty_levels, step)

    def close(self) -> None:
        """Release what scoring holds; the default holds nothing."""

    def held_out_subset(self, split: str, size: int, seed: int) -> tuple[ExampleT, ...]:
        """A sample of `size` examples of `split` fixed by `seed`, in the split's own order.

        Raises:
            SplitError: the split does not exist or has fewer than `size` examples.
        """
        examples = self.split(split)
        if size > len(examples):
            raise SplitError(f"{size} examples asked of split {split!r}, which has {len(examples)}")
        chosen = sorted(random.Random(f"held-out:{seed}").sample(range(len(examples)), size))
        return tuple(examples[i] for i in chosen)


# A task of any example and reward-spec types, as code that only passes them between its methods sees it.
AnyTask = Task[Any, Any]
