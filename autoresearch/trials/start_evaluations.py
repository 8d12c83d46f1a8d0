"""The base model's held-out evaluation, made once for all the runs of one folder that start RL from it.

A trial without a warm-up or an initial state starts RL from a fresh adapter, which answers as the base model does,
so every such trial of a study would score the same greedy answers to the same questions: on a CPU, minutes of
sampling each. The first run to need it evaluates the base model and saves the report under a key of everything its
answers depend on; the others (and the study's baseline) read it, waiting while one is being made instead of making
it again.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from autoresearch.trials.config import TrialConfig
from tasks.report import HeldOutReport

log = logging.getLogger(__name__)

# What a run's answers where RL starts depend on, besides the base model's weights.
_ANSWER_FIELDS = (
    "base_model",
    "task",
    "data",
    "train_split",
    "few_shot",
    "prompt_format",
    "mode",
    "max_turns",
    "max_tokens",
    "stop",
    "eval_split",
    "eval_size",
    "eval_seed",
    "eval_batch_invariant",
)


def starts_from_the_base_model(config: TrialConfig) -> bool:
    """Whether the config's RL starts from the base model's answers (no warm-up, no saved state to start from)."""
    return config.warmup_steps == 0 and config.init_from is None


# The folder beside a run root's runs that keeps them; no run id starts with "_".
FOLDER_NAME = "_start_evaluations"


class StartEvaluations:
    """Base-model evaluations kept for the runs of `run_root`, one file per set of answer settings."""

    def __init__(self, run_root: Path) -> None:
        self.folder = run_root / FOLDER_NAME

    def path_of(self, config: TrialConfig) -> Path:
        settings = config.model_dump(mode="json", include=set(_ANSWER_FIELDS))
        digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
        return self.folder / f"base-{digest}.json"

    def get_or_evaluate(self, config: TrialConfig, evaluate: Callable[[], HeldOutReport]) -> HeldOutReport:
        """The saved base-model report for the config's answer settings, or `evaluate()`'s, saved for the others.

        One run evaluates at a time per settings (a lock file beside the report), so runs that start together do not
        all evaluate.
        """
        path = self.path_of(config)
        self.folder.mkdir(parents=True, exist_ok=True)
        with path.with_suffix(".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            saved = _read(path)
            if saved is not None:
                return saved
            report = evaluate()
            partial = path.with_suffix(".partial")
            partial.write_text(report.model_dump_json())
            partial.replace(path)
            return report


def _read(path: Path) -> HeldOutReport | None:
    try:
        return HeldOutReport.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValidationError) as error:
        log.warning("%s: unreadable (%s); evaluating the base model again", path, error)
        return None
