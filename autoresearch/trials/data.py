"""What a trial trains and evaluates on: a seeded training order, a fixed held-out subset, prompts as tokens."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from autoresearch.errors import ConfigurationError
from tasks.text2sql.dataset import Example, Text2SqlDataset
from tasks.text2sql.errors import DatasetError
from tasks.text2sql.evaluation import few_shot_examples
from tasks.text2sql.prompts import render_prompt


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer a trial uses (the SDK's `get_tokenizer()` returns one)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...


@dataclass(frozen=True)
class Prompt:
    """A question rendered for the model, and its token ids (the base model's tokenizer, BOS included)."""

    example: Example
    tokens: tuple[int, ...]


def split_of(dataset: Text2SqlDataset, name: str, field: str) -> tuple[Example, ...]:
    """A split of the data set; raises ConfigurationError naming the config field and the splits that exist."""
    try:
        return dataset.split(name)
    except DatasetError:
        raise ConfigurationError(f"{field}: no split {name!r} (splits: {', '.join(sorted(dataset.splits))})") from None


class TrainingOrder:
    """The training examples in an order fixed by the seed: each epoch is a fresh permutation.

    A position indexes the endless stream of epochs, so a resumed run only needs the position it stopped at.
    """

    def __init__(self, examples: Sequence[Example], seed: int) -> None:
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

    def batch(self, position: int, size: int) -> list[Example]:
        """The `size` examples from `position` on."""
        return [
            self.examples[self._permutation(epoch)[index]]
            for epoch, index in (divmod(p, len(self.examples)) for p in range(position, position + size))
        ]


def held_out_subset(dataset: Text2SqlDataset, split: str, size: int, seed: int) -> tuple[Example, ...]:
    """A fixed sample of the held-out split, in the split's own order.

    Raises:
        ConfigurationError: the split does not exist or has fewer than `size` examples.
    """
    examples = split_of(dataset, split, "eval_split")
    if size > len(examples):
        raise ConfigurationError(f"eval_size: {size} exceeds the {len(examples)} examples of split {split!r}")
    chosen = sorted(random.Random(f"held-out:{seed}").sample(range(len(examples)), size))
    return tuple(examples[i] for i in chosen)


class PromptRenderer:
    """Renders questions with the task's prompt and few-shot examples, and tokenizes prompts and answers."""

    def __init__(self, dataset: Text2SqlDataset, tokenizer: Tokenizer, few_shot: int, shots_split: str) -> None:
        split_of(dataset, shots_split, "train_split")
        self.dataset = dataset
        self.tokenizer = tokenizer
        self.shots = tuple(few_shot_examples(dataset, few_shot, split=shots_split))

    @property
    def shot_ids(self) -> frozenset[str]:
        """Examples shown as few-shot; training on them would reward copying the prompt."""
        return frozenset(shot.example.id for shot in self.shots)

    def prompt(self, example: Example) -> Prompt:
        text = render_prompt(example, self.dataset.database(example.db_id).path, self.shots)
        return Prompt(example=example, tokens=tuple(self.tokenizer.encode(text)))

    def gold_completion(self, example: Example) -> tuple[int, ...]:
        """The gold SQL as the model should continue the prompt's final 'SQL:' (as the few-shot blocks show it)."""
        return tuple(self.tokenizer.encode(f" {example.gold_sql};", add_special_tokens=False))

    def decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)
