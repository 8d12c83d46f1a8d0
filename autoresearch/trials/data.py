"""What a trial trains and evaluates on: a seeded training order, a fixed held-out subset, prompts as tokens."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from autoresearch.errors import ConfigurationError
from autoresearch.trials.modes import SINGLE_TURN, Mode
from tasks.errors import SplitError
from tasks.interface import AnyTask, TaskExample


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer a trial uses (the SDK's `get_tokenizer()` returns one)."""

    chat_template: str | None
    eos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...

    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: object) -> object: ...


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
    """Renders questions with the task's prompt and few-shot examples, and tokenizes prompts and answers.

    In the chat format the task's prompt is the user turn of the model's chat template with the generation prompt
    after it, and a gold answer is the assistant's turn as the template closes it (its end-of-turn token is what
    ends a sampled answer); in the plain format the prompt is the text itself, which the model continues.
    """

    def __init__(
        self,
        task: AnyTask,
        tokenizer: Tokenizer,
        few_shot: int,
        shots_split: str,
        mode: Mode = SINGLE_TURN,
        prompt_format: PromptFormat = "plain",
    ) -> None:
        """`mode` says which of the task's prompts it renders (the agentic one, for episodes) and in which format.

        Raises ConfigurationError for a format the mode or the tokenizer cannot render.
        """
        split_of(task, shots_split, "train_split")
        self.task = task
        self.tokenizer = tokenizer
        self.mode = mode
        self.shots = task.few_shot_examples(few_shot, shots_split)
        self.format = mode.prompt_format(prompt_format, tokenizer)

    @property
    def shot_ids(self) -> frozenset[str]:
        """Examples shown as few-shot; training on them would reward copying the prompt."""
        return frozenset(shot.id for shot in self.shots)

    def prompt(self, example: TaskExample) -> Prompt:
        text = self._prompt_text(example)
        if self.format == "plain":
            return Prompt(example=example, tokens=tuple(self.tokenizer.encode(text)))
        return Prompt(example=example, tokens=self._chat_tokens(text, add_generation_prompt=True))

    def gold_completion(self, example: TaskExample) -> tuple[int, ...]:
        """The tokens of the mode's gold completion, as the model should continue the prompt; in the chat format,
        through the end of the assistant's turn."""
        text = self.mode.gold_text(self.task, example)
        if self.format == "plain":
            return tuple(self.tokenizer.encode(text, add_special_tokens=False))
        prompt = self.prompt(example).tokens
        # An assistant turn starts on its own line: the plain format's leading space (after "SQL:") has no place.
        whole = self._chat_tokens(self._prompt_text(example), answer=text.strip())
        if whole[: len(prompt)] != prompt:
            raise ConfigurationError(
                "prompt_format: chat: the model's chat template renders a user turn followed by an answer "
                "differently from the user turn alone, so its answers cannot be trained on; use prompt_format: plain"
            )
        answer = whole[len(prompt) :]
        # What the template writes after the end-of-turn token (a newline) is never sampled: a sample ends there.
        end = self.tokenizer.eos_token_id
        return answer[: answer.index(end) + 1] if end in answer else answer

    def _prompt_text(self, example: TaskExample) -> str:
        return self.mode.prompt_text(self.task, example, self.shots)

    def _chat_tokens(
        self, user: str, add_generation_prompt: bool = False, answer: str | None = None
    ) -> tuple[int, ...]:
        conversation = [{"role": "user", "content": user}]
        if answer is not None:
            conversation.append({"role": "assistant", "content": answer})
        rendered = self.tokenizer.apply_chat_template(
            conversation, add_generation_prompt=add_generation_prompt, tokenize=True
        )
        # Tokenizers of transformers 5 answer with a BatchEncoding, earlier ones with the ids.
        ids = rendered["input_ids"] if isinstance(rendered, Mapping) else rendered
        return tuple(int(token) for token in ids)

    def decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)
