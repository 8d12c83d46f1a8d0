"""Execution accuracy of any model on a split, by difficulty (`python -m tasks.text2sql evaluate`): an
OpenAI-compatible endpoint, or the gold and garbage references."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx
from rich.progress import Progress

from tasks.report import HeldOutReport
from tasks.text2sql.dataset import Example
from tasks.text2sql.errors import EndpointError
from tasks.text2sql.task import Text2SqlTask


@dataclass(frozen=True)
class PromptedExample:
    example: Example
    prompt: str


# A model maps a batch of prompted examples to one completion each.
Model = Callable[[Sequence[PromptedExample]], list[str]]


def evaluate(
    task: Text2SqlTask,
    split: str,
    model: Model,
    limit: int | None = None,
    few_shot: int = 0,
    batch_size: int = 8,
    show_progress: bool = True,
    held_out: tuple[int, int] | None = None,
) -> HeldOutReport:
    """Greedy answers from `model` on a split, judged as trials judge them (execution match on every variant).

    The few-shot examples come from the training split. `held_out` = (size, seed) evaluates the task's held-out
    subset that a trial of that eval_size and eval_seed evaluates, instead of the first `limit` examples.

    Raises:
        SplitError: the split does not exist, or has fewer examples than `held_out` asks for.
    """
    examples = task.split(split)[:limit] if held_out is None else task.held_out_subset(split, *held_out)
    shots = task.few_shot_examples(few_shot, "train") if few_shot else ()
    completions: list[str] = []
    with Progress(disable=not show_progress, transient=True) as progress:
        bar = progress.add_task(f"evaluating on {split}", total=len(examples))
        for start in range(0, len(examples), batch_size):
            batch = [PromptedExample(e, task.prompt(e, shots)) for e in examples[start : start + batch_size]]
            completions += model(batch)
            progress.advance(bar, len(batch))
    return task.report(split, [task.one_step(e, c) for e, c in zip(examples, completions, strict=True)])


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
    # The endpoint leaves the stop string out of the answer, as OpenAI's API does.
    stop: tuple[str, ...] = ("\nQuestion:",)
    timeout_s: float = 120.0

    def __call__(self, batch: Sequence[PromptedExample]) -> list[str]:
        """The endpoint's answers, in order.

        Raises:
            EndpointError: the endpoint is unreachable or refuses a request (its status and reply named).
        """
        headers = {}
        if key := os.environ.get(self.api_key_env):
            headers["Authorization"] = f"Bearer {key}"
        try:
            with httpx.Client(base_url=self.base_url.rstrip("/"), headers=headers, timeout=self.timeout_s) as client:
                return [self._complete(client, item.prompt) for item in batch]
        except httpx.HTTPStatusError as error:
            raise EndpointError(
                f"{error.request.url} answered {error.response.status_code}: {error.response.text[:300]} (check "
                f"--model-name {self.model!r} and the key in ${self.api_key_env})"
            ) from None
        except httpx.HTTPError as error:
            raise EndpointError(f"cannot reach {self.base_url}: {error} (is the server up? check --base-url)") from None

    def _complete(self, client: httpx.Client, prompt: str) -> str:
        common = {"model": self.model, "max_tokens": self.max_tokens, "temperature": 0.0}
        if self.api == "chat":
            # The task's prompt as the one user turn of the endpoint's chat template, as a trial's chat format.
            messages = [{"role": "user", "content": prompt}]
            response = client.post("/chat/completions", json={**common, "messages": messages, "stop": list(self.stop)})
            response.raise_for_status()
            return response.json()["choices"][0]["message"]["content"] or ""
        response = client.post("/completions", json={**common, "prompt": prompt, "stop": list(self.stop)})
        response.raise_for_status()
        return response.json()["choices"][0]["text"]
