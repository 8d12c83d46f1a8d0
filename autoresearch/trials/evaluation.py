"""Held-out evaluation: greedy answers on a fixed subset of a held-out split, judged by the task.

The task judges by its own held-out measure (text-to-SQL: execution match on every database variant), whatever
reward the trial trains on, so a reward variant can only raise it by making the model answer better.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext

import tinker
from tinker import types

from autoresearch.trials.backend import api_key as default_api_key
from autoresearch.trials.config import TrialConfig
from autoresearch.trials.data import PromptRenderer, held_out_subset
from autoresearch.trials.modes import mode_of
from tasks.interface import AnyTask, TaskExample
from tasks.registry import open_task
from tasks.report import HeldOutReport


def evaluate_sampler(
    sampler: tinker.SamplingClient,
    renderer: PromptRenderer,
    examples: Sequence[TaskExample],
    split: str,
    max_tokens: int,
    stop: Sequence[str],
    step: int,
) -> HeldOutReport:
    """Greedy (temperature 0) answers to every example in the renderer's mode (completions, or episodes whose
    transcripts are the answers), judged by the task."""
    params = types.SamplingParams(max_tokens=max_tokens, temperature=0.0, stop=list(stop))
    return renderer.mode.held_out_report(sampler, renderer, examples, split, params, step)


def evaluate_checkpoint(
    config: TrialConfig,
    backend_url: str,
    model_path: str | None = None,
    api_key: str | None = None,
    task: AnyTask | None = None,
) -> HeldOutReport:
    """The held-out score of saved sampler weights (`tinker://…/sampler_weights/…`), or of the base model.

    The same subset, prompts and judgement as a trial's own evaluations, so a controller can put a baseline next to
    its trials. Reported as step 0. `api_key` defaults as a trial's does; `task` (left open) to the config's task on
    the config's data source, as its trials open it.
    """
    with (
        tinker.ServiceClient(base_url=backend_url, api_key=api_key or default_api_key()) as service,
        nullcontext(task) if task is not None else open_task(config.task, config.data) as opened,
    ):
        # The SDK hands out the served tokenizer through a training client only (a sampling client guesses it
        # from the model name); a rank-1 adapter is the cheapest way to ask.
        tokenizer = service.create_lora_training_client(base_model=config.base_model, rank=1).result().get_tokenizer()
        if model_path is None:
            sampler = service.create_sampling_client(base_model=config.base_model).result()
        else:
            sampler = service.create_sampling_client(model_path=model_path).result()
        renderer = PromptRenderer(
            opened, tokenizer, config.few_shot, config.train_split, mode_of(config), config.prompt_format
        )
        examples = held_out_subset(opened, config.eval_split, config.eval_size, config.eval_seed)
        return evaluate_sampler(sampler, renderer, examples, config.eval_split, config.max_tokens, config.stop, step=0)
