"""Execution accuracy of any model on a split, by difficulty (`python -m tasks.text2sql evaluate`): an
OpenAI-compatible endpoint, or the gold and garbage references; and the few-shot examples prompts show."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx
from rich.progress import Progress

from tasks.text2sql.dataset import Difficulty, Example, Text2SqlDataset
from tasks.text2sql.prompts import FewShot, render_prompt
from tasks.text2sql.rewards import DEFAULT_REWARD_SPEC
from tasks.text2sql.scoring import Scorer


@dataclass(frozen=True)
class PromptedExample:
    example: Example
    prompt: str


# A model maps a batch of prompted examples to one completion each.
Model = Callable[[Sequence[PromptedExample]], list[str]]


@dataclass
class EvaluationReport:
    split: str
    correct: dict[Difficulty, int] = field(default_factory=lambda: dict.fromkeys(Difficulty, 0))
    total: dict[Difficulty, int] = field(default_factory=lambda: dict.fromkeys(Difficulty, 0))

    @property
    def accuracy(self) -> float:
        total = sum(self.total.values())
        return sum(self.correct.values()) / total if total else 0.0

    def accuracy_of(self, difficulty: Difficulty) -> float | None:
        return self.correct[difficulty] / self.total[difficulty] if self.total[difficulty] else None


def few_shot_examples(dataset: Text2SqlDataset, count: int, split: str = "train") -> list[FewShot]:
    """`count` examples from a split other than the evaluated one, cycling through the difficulties."""
    pools = {d: [e for e in dataset.split(split) if e.difficulty is d] for d in Difficulty}
    rounds = itertools.zip_longest(*pools.values())
    ordered = [e for round_ in rounds for e in round_ if e is not None]
    return [FewShot(e, dataset.database(e.db_id).path) for e in ordered[:count]]


def evaluate(
    dataset: Text2SqlDataset,
    split: str,
    model: Model,
    limit: int | None = None,
    few_shot: int = 0,
    batch_size: int = 8,
    show_progress: bool = True,
) -> EvaluationReport:
    """Greedy answers from `model` on a split, scored by execution match over every database variant."""
    examples = dataset.split(split)[:limit]
    shots = few_shot_examples(dataset, few_shot) if few_shot else []
    report = EvaluationReport(split=split)
    with Scorer(dataset) as scorer, Progress(disable=not show_progress, transient=True) as progress:
        task = progress.add_task(f"evaluating on {split}", total=len(examples))
        for start in range(0, len(examples), batch_size):
            batch = [
                PromptedExample(e, render_prompt(e, dataset.database(e.db_id).path, shots))
                for e in examples[start : start + batch_size]
            ]
            completions = model(batch)
            scores = scorer.score_many(
                [(p.example, c) for p, c in zip(batch, completions, strict=True)], DEFAULT_REWARD_SPEC
            )
            for item, score in zip(batch, scores, strict=True):
                report.total[item.example.difficulty] += 1
                report.correct[item.example.difficulty] += score.correct
            progress.advance(task, len(batch))
    return report


def gold_model(batch: Sequence[PromptedExample]) -> list[str]:
    """A reference that answers with the gold SQL: it must score 100%."""
    return [f"{item.example.gold_sql};" for item in batch]


def garbage_model(batch: Sequence[PromptedExample]) -> list[str]:
    """A reference that answers with text that is not SQL: it must score 0%."""
    return ["I am not sure what the answer is." for _ in batch]


@dataclass
class OpenAICompatibleModel:
    """Any OpenAI-compatible endpoint (vLLM, llama.cpp, a hosted API), greedy, via /completions or /chat."""

    base_url: str
    model: str
    api_key_env: str = "OPENAI_API_KEY"
    api: str = "completions"
    max_tokens: int = 256
    timeout_s: float = 120.0

    def __call__(self, batch: Sequence[PromptedExample]) -> list[str]:
        headers = {}
        if key := os.environ.get(self.api_key_env):
            headers["Authorization"] = f"Bearer {key}"
        with httpx.Client(base_url=self.base_url.rstrip("/"), headers=headers, timeout=self.timeout_s) as client:
            return [self._complete(client, item.prompt) for item in batch]

    def _complete(self, client: httpx.Client, prompt: str) -> str:
        common = {"model": self.model, "max_tokens": self.max_tokens, "temperature": 0.0}
        if self.api == "chat":
            response = client.post(
                "/chat/completions", json={**common, "messages": [{"role": "user", "content": prompt}]}
            )
            response.raise_for_status()
            return response.json()["choices"][0]["message"]["content"] or ""
        response = client.post("/completions", json={**common, "prompt": prompt, "stop": ["\nQuestion:"]})
        response.raise_for_status()
        return response.json()["choices"][0]["text"]
