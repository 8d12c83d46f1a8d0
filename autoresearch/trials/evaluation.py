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
from autoresearch.trials.rollouts import sample_groups
from tasks.interface import AnyTask, TaskExample
from tasks.registry import open_task
from tasks.report import HeldOutReport


def session_metadata(config: TrialConfig) -> dict[str, str] | None:
    """The user_metadata of a trial's Tinker session (`tinker.ServiceClient(user_metadata=…)`).

    With `eval_batch_invariant` it asks the backend to answer the session's greedy requests, the held-out
    evaluation's, as if each were alone on it (docs/server.md, "Answers that do not depend on the batch"), so their
    answers do not depend on what else the backend runs; the rollouts sample at a temperature above 0 and batch.
    """
    return {"batch_invariant": "greedy"} if config.eval_batch_invariant else None


def evaluate_sampler(
    sampler: tinker.SamplingClient,
    renderer: PromptRenderer,
    examples: Sequence[TaskExample],
    split: str,
    max_tokens: int,
    stop: Sequence[str],
    step: int,
) -> HeldOutReport:
    """Greedy (temperature 0) episodes on every example, all requests in flight at once, judged by the task; each
    answer's completion is its episode's transcript (a single-turn episode's: the completion)."""
    params = types.SamplingParams(max_tokens=max_tokens, temperature=0.0, stop=list(stop))
    prompts = [renderer.prompt(e) for e in examples]
    groups = sample_groups(sampler, prompts, 1, [params] * len(prompts), renderer)
    return renderer.task.report(split, [group.episodes[0] for group in groups], step)


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
        tinker.ServiceClient(
            base_url=backend_url, api_key=api_key or default_api_key(), user_metadata=session_metadata(config)
        ) as service,
        nullcontext(task) if task is not None else open_task(config.task, config.data) as opened,
    ):
        # The SDK hands out the served tokenizer through a training client only (a sampling client guesses it
        # from the model name); a rank-1 adapter is the cheapest way to ask.
        tokenizer = service.create_lora_training_client(base_model=config.base_model, rank=1).result().get_tokenizer()
        if model_path is None:
            sampler = service.create_sampling_client(base_model=config.base_model).result()
        else:
            sampler = service.create_sampling_client(model_path=model_path).result()
        renderer = PromptRenderer.of_trial(opened, tokenizer, config)
        examples = held_out_subset(opened, config.eval_split, config.eval_size, config.eval_seed)
        return evaluate_sampler(sampler, renderer, examples, config.eval_split, config.max_tokens, config.stop, step=0)
