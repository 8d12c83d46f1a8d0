"""What a trial trains and evaluates on: a seeded training order, a fixed held-out subset, prompts as tokens."""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from autoresearch.errors import ConfigurationError
from autoresearch.trials.config import TrialConfig
from tasks.chat_template import ChatMessage, ChatTemplate, ChatTemplateError, Tokenizer
from tasks.errors import SplitError
from tasks.interface import AnyTask, Episode, TaskExample

PromptFormat = Literal["auto", "chat", "plain"]


@dataclass(frozen=True)
class Prompt:
    """A question rendered for the model, and its token ids (the base model's tokenizer, BOS included)."""

    example: TaskExample
    tokens: tuple[int, ...]


def split_of(task: AnyTask, name: str, field: str) -> tuple[TaskExample, ...]:
    """A split of the task's data; raises ConfigurationError naming the config field and the splits that exist."""
    try:
        return task.split(name)
    except SplitError:
        splits = ", ".join(sorted(task.split_names))
        raise ConfigurationError(f"{field}: no split {name!r} (splits: {splits})") from None


def training_examples(task: AnyTask, config: TrialConfig, excluded: Collection[str]) -> list[TaskExample]:
    """The training split less the examples whose ids are `excluded` (the few-shot ones), up to the config's
    hardest difficulty level.

    Raises:
        ConfigurationError: naming the field: no such split, no such difficulty level, or no example left.
    """
    examples = [e for e in split_of(task, config.train_split, "train_split") if e.id not in excluded]
    hardest = config.hardest_train_difficulty
    if hardest is None:
        return examples
    levels = task.difficulty_levels
    if hardest not in levels:
        raise ConfigurationError(
            f"hardest_train_difficulty: {hardest!r} is not a difficulty level of task {config.task} "
            f"(levels, easiest first: {', '.join(levels)})"
        )
    allowed = set(levels[: levels.index(hardest) + 1])
    kept = [e for e in examples if e.difficulty in allowed]
    if not kept:
        raise ConfigurationError(
            f"hardest_train_difficulty: no question of split {config.train_split!r} is {hardest!r} or easier"
        )
    return kept


class TrainingOrder:
    """The training examples in an order fixed by the seed: each epoch is a fresh permutation.

    A position indexes the endless stream of epochs, so a resumed run only needs the position it stopped at.
    """

    def __init__(self, examples: Sequence[TaskExample], seed: int) -> None:
        if not examples:
            raise ConfigurationError("train_split: no training examples are left once the few-shot ones are removed")
        self.examples = tuple(examples)
        self.seed = seed
        self._permutations: dict[int, tuple[int, ...]] = {}

    def _permutation(self, epoch: int) -> tuple[int, ...]:
        if epoch not in self._permutations:
            indices = list(range(len(self.examples)))
            random.Random(f"train-order:{self.seed}:{epoch}").shuffle(indices)
            self._permutations[epoch] = tuple(indices)
        return self._permutations[epoch]

    def batch(self, position: int, size: int) -> list[TaskExample]:
        """The `size` examples from `position` on."""
        return [
            self.examples[self._permutation(epoch)[index]]
            for epoch, index in (divmod(p, len(self.examples)) for p in range(position, position + size))
        ]


def held_out_subset(task: AnyTask, split: str, size: int, seed: int) -> tuple[TaskExample, ...]:
    """The task's fixed sample of a held-out split (the same for every trial of that split, size and seed).

    Raises:
        ConfigurationError: the split does not exist or has fewer than `size` examples.
    """
    examples = split_of(task, split, "eval_split")
    try:
        return task.held_out_subset(split, size, seed)
    except SplitError:
        raise ConfigurationError(f"eval_size: {size} exceeds the {len(examples)} examples of split {split!r}") from None


class PromptRenderer:
    """Renders questions with the task's prompt for episodes of `max_turns` turns (1: single-turn completions) and
    its few-shot examples, and tokenizes prompts, answers and what the task answers a turn with.

    In the chat format the task's prompt is the user turn of the model's chat template with the generation prompt
    after it, a gold answer is the assistant's turn through the token that ends it, and an episode is a conversation:
    each observation closes the assistant's turn, is the next user turn and opens the assistant's next one, so an
    episode's tokens are what the template renders of the whole conversation (`tasks.chat_template`, the renderer the
    cookbook environment uses too). In the plain format the prompt is the text itself, which the model continues, and
    an episode's turns and observations follow it as one transcript.
    """

    def __init__(
        self,
        task: AnyTask,
        tokenizer: Tokenizer,
        few_shot: int,
        shots_split: str,
        max_turns: int = 1,
        prompt_format: PromptFormat = "plain",
    ) -> None:
        """Raises ConfigurationError for a format the tokenizer cannot render."""
        split_of(task, shots_split, "train_split")
        self.task = task
        self.tokenizer = tokenizer
        self.max_turns = max_turns
        self.shots = task.few_shot_examples(few_shot, shots_split)
        self.format = _prompt_format(prompt_format, tokenizer)
        self._chat = _chat_template(tokenizer) if self.format == "chat" else None

    @classmethod
    def of_trial(cls, task: AnyTask, tokenizer: Tokenizer, config: TrialConfig) -> PromptRenderer:
        """The renderer of a trial of `config`; the one place a trial reads `config.mode`."""
        max_turns = config.max_turns if config.mode == "agentic" else 1
        return cls(task, tokenizer, config.few_shot, config.train_split, max_turns, config.prompt_format)

    @property
    def shot_ids(self) -> frozenset[str]:
        """Examples shown as few-shot; training on them would reward copying the prompt."""
        return frozenset(shot.id for shot in self.shots)

    def prompt(self, example: TaskExample) -> Prompt:
        text = self._prompt_text(example)
        if self._chat is None:
            return Prompt(example=example, tokens=tuple(self.tokenizer.encode(text)))
        return Prompt(example=example, tokens=self._chat.generation_prompt([_user(text)]))

    def gold_completion(self, example: TaskExample) -> tuple[int, ...]:
        """The tokens of the task's gold first turn, as the model should continue the prompt; in the chat format,
        through the end of the assistant's turn."""
        text = self.task.gold_completion(example, self.max_turns)
        if self._chat is None:
            return tuple(self.tokenizer.encode(text, add_special_tokens=False))
        try:
            # An assistant turn starts on its own line: the plain format's leading space (after "SQL:") has no place.
            return self._chat.reply(_user(self._prompt_text(example)), text.strip())
        except ChatTemplateError as error:
            raise ConfigurationError(
                f"prompt_format: chat: {error}, so its answers cannot be trained on; use prompt_format: plain"
            ) from None

    def episode(self, example: TaskExample) -> Episode:
        """A fresh episode of the task's on `example`, played in this renderer's format."""
        return self.task.episode(example, self.max_turns, chat=self._chat is not None)

    def observation(self, text: str, turn: Sequence[int]) -> tuple[int, ...]:
        """What the task answered the sampled `turn` with, as the tokens that follow the turn in the episode.

        In the chat format: the end of the assistant's turn (its end-of-turn token, unless the turn was sampled
        through it rather than cut at a stop string), `text` as the next user turn, and the assistant's next turn
        opened, each as the chat template writes it.
        """
        if self._chat is None:
            return tuple(self.tokenizer.encode(text, add_special_tokens=False))
        closing = () if turn and turn[-1] == self._chat.end_of_turn else (self._chat.end_of_turn,)
        reply: ChatMessage = {"role": "assistant", "content": self.decode(turn)}
        answer = _user(text)
        try:
            user_turn = self._chat.turn(answer, reply, first=False)
        except ChatTemplateError as error:
            raise ConfigurationError(
                f"prompt_format: chat: {error}, so an episode's turns cannot be rendered; use prompt_format: plain"
            ) from None
        return (*closing, *user_turn.header, *user_turn.output, *self._chat.generation_suffix(answer))

    def decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def _prompt_text(self, example: TaskExample) -> str:
        return self.task.prompt(example, self.shots, self.max_turns, chat=self._chat is not None)


def _prompt_format(requested: PromptFormat, tokenizer: Tokenizer) -> Literal["chat", "plain"]:
    """`chat` or `plain`: "auto" is chat exactly when the tokenizer has a chat template.

    Raises:
        ConfigurationError: chat was asked for, and the tokenizer has no chat template.
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


def _user(text: str) -> ChatMessage:
    return {"role": "user", "content": text}


def _chat_template(tokenizer: Tokenizer) -> ChatTemplate:
    """The model's chat template, read turn by turn; raises ConfigurationError when it cannot be."""
    try:
        return ChatTemplate(tokenizer)
    except ChatTemplateError as error:
        raise ConfigurationError(f"prompt_format: chat: {error}; use prompt_format: plain") from None
