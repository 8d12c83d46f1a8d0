"""Held-out evaluation: greedy answers on a fixed subset of a held-out split, scored by the task's matcher.

The score is execution accuracy under test-suite matching (every database variant), whatever reward the trial
trains on, so a reward variant can only raise it by making the model answer better.
"""

from __future__ import annotations

from collections.abc import Sequence

import tinker
from pydantic import BaseModel, ConfigDict
from tinker import types

from autoresearch.trials.backend import api_key as default_api_key
from autoresearch.trials.config import TrialConfig
from autoresearch.trials.data import PromptRenderer, held_out_subset
from tasks.text2sql.bundled import load_bundled
from tasks.text2sql.dataset import Difficulty, Example, Text2SqlDataset
from tasks.text2sql.rewards import DEFAULT_REWARD_SPEC
from tasks.text2sql.scoring import Scorer


class HeldOutAnswer(BaseModel):
    """One held-out question, the model's greedy completion and whether its result matched the gold one."""

    model_config = ConfigDict(frozen=True)

    example_id: str
    difficulty: Difficulty
    completion: str
    correct: bool


class HeldOutReport(BaseModel):
    """Execution accuracy on the held-out subset after `step` RL steps, overall and by difficulty."""

    model_config = ConfigDict(frozen=True)

    step: int
    split: str
    accuracy: float
    # None for a difficulty the subset has no question of.
    accuracy_by_difficulty: dict[Difficulty, float | None]
    answers: tuple[HeldOutAnswer, ...]


def evaluate_sampler(
    sampler: tinker.SamplingClient,
    renderer: PromptRenderer,
    scorer: Scorer,
    examples: Sequence[Example],
    split: str,
    max_tokens: int,
    stop: Sequence[str],
    step: int,
) -> HeldOutReport:
    """Greedy (temperature 0) completions of every example, all requests in flight at once, then matched."""
    params = types.SamplingParams(max_tokens=max_tokens, temperature=0.0, stop=list(stop))
    futures = [sampler.sample(types.ModelInput.from_ints(list(renderer.prompt(e).tokens)), 1, params) for e in examples]
    completions = [renderer.decode(f.result().sequences[0].tokens) for f in futures]
    scores = scorer.score_many(list(zip(examples, completions, strict=True)), DEFAULT_REWARD_SPEC)
    answers = tuple(
        HeldOutAnswer(example_id=e.id, difficulty=e.difficulty, completion=c, correct=s.correct)
        for e, c, s in zip(examples, completions, scores, strict=True)
    )
    by_difficulty: dict[Difficulty, float | None] = {}
    for difficulty in Difficulty:
        marks = [a.correct for a in answers if a.difficulty is difficulty]
        by_difficulty[difficulty] = sum(marks) / len(marks) if marks else None
    return HeldOutReport(
        step=step,
        split=split,
        accuracy=sum(a.correct for a in answers) / len(answers),
        accuracy_by_difficulty=by_difficulty,
        answers=answers,
    )


def evaluate_checkpoint(
    config: TrialConfig,
    backend_url: str,
    model_path: str | None = None,
    api_key: str | None = None,
    dataset: Text2SqlDataset | None = None,
) -> HeldOutReport:
    """The held-out score of saved sampler weights (`tinker://…/sampler_weights/…`), or of the base model.

    The same subset, prompts and matcher as a trial's own evaluations, so a controller can put a baseline next to
    its trials. Reported as step 0. `api_key` defaults as a trial's does; `dataset` to the bundled one, which trials
    train on.
    """
    dataset = dataset or load_bundled()
    with (
        tinker.ServiceClient(base_url=backend_url, api_key=api_key or default_api_key()) as service,
        Scorer(dataset) as scorer,
    ):
        # The SDK hands out the served tokenizer through a training client only (a sampling client guesses it
        # from the model name); a rank-1 adapter is the cheapest way to ask.
        tokenizer = service.create_lora_training_client(base_model=config.base_model, rank=1).result().get_tokenizer()
        if model_path is None:
            sampler = service.create_sampling_client(base_model=config.base_model).result()
        else:
            sampler = service.create_sampling_client(model_path=model_path).result()
        renderer = PromptRenderer(dataset, tokenizer, config.few_shot, config.train_split)
        examples = held_out_subset(dataset, config.eval_split, config.eval_size, config.eval_seed)
        return evaluate_sampler(
            sampler, renderer, scorer, examples, config.eval_split, config.max_tokens, config.stop, step=0
        )
