"""The Optuna study of a spec: opened from its RDB storage, and read back as the history the LLM sees and the
summary of its best trials (what the study and its trials carry besides Optuna's own records: `attributes`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
from optuna.trial import FrozenTrial, TrialState
from pydantic import BaseModel

from autoresearch.attributes import SHOWN_TO_LLM, StudyAttributes, TrialAttributes
from autoresearch.errors import ConfigurationError
from autoresearch.hybrid_sampler import TrialSnapshot, fallback_counts
from autoresearch.search import REWARD_PREFIX
from autoresearch.spec import Pruning, StudySpec

ENDED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
# The seed of the TPE that proposes every trial that is not the LLM's.
TPE_SEED = 0


def open_study(spec: StudySpec) -> optuna.Study:
    """The spec's study, created on first use; an existing one is loaded as it is.

    Raises:
        ConfigurationError: the storage URL refers to an unset variable, or its database cannot be reached.
    """
    url = spec.storage_url()
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).expanduser().parent.mkdir(parents=True, exist_ok=True)
    directions = ["maximize"] + (["minimize"] if spec.objective.also_minimize else [])
    try:
        storage = optuna.storages.RDBStorage(url)
    except sqlalchemy.exc.OperationalError as error:
        raise ConfigurationError(f"cannot reach the study's storage {spec.storage}: {error.orig}") from None
    study = optuna.create_study(
        study_name=spec.study,
        storage=storage,
        directions=directions,
        load_if_exists=True,
        pruner=pruner_of(spec.pruning),
    )
    study.sampler = tpe_sampler(study)
    return study


def tpe_sampler(study: optuna.Study, seed: int = TPE_SEED) -> optuna.samplers.TPESampler:
    """Optuna's TPE for `study`, seeded past the trials it holds: a resumed study draws values of its own instead of
    retracing, from the same seed, the random draws of its first trials (which it did, trial for trial)."""
    return optuna.samplers.TPESampler(seed=seed + len(study.get_trials(deepcopy=False)))


def pruner_of(pruning: Pruning) -> optuna.pruners.BasePruner:
    if pruning.kind == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=pruning.startup_trials, n_warmup_steps=pruning.warmup_steps)
    if pruning.kind == "threshold":
        return optuna.pruners.ThresholdPruner(lower=pruning.lower, n_warmup_steps=pruning.warmup_steps)
    return optuna.pruners.NopPruner()


def run_id_of(spec: StudySpec, trial: FrozenTrial | optuna.Trial) -> str:
    return f"{spec.study}-{trial.number:04d}"


def history(study: optuna.Study) -> list[TrialSnapshot]:
    """Every trial that started, as the LLM sees it."""
    trials = study.get_trials(deepcopy=False)
    return [TrialSnapshot.of(trial, SHOWN_TO_LLM) for trial in trials if trial.state is not TrialState.WAITING]


@dataclass(frozen=True)
class RlGain:
    """Held-out accuracy where a trial's RL started (after any warm-up), its latest or final one, and the gain."""

    at_start: float | None
    latest: float | None

    @property
    def gain(self) -> float | None:
        return None if self.at_start is None or self.latest is None else self.latest - self.at_start


def rl_gain_from(reports: dict[int, float], final: float | None = None) -> RlGain:
    """Step 0 of the reports is the evaluation where RL starts; the end is `final`, else the latest report."""
    latest = final if final is not None else (reports[max(reports)] if reports else None)
    return RlGain(at_start=reports.get(0), latest=latest)


def rl_gain_of(trial: FrozenTrial) -> RlGain:
    return rl_gain_from(trial.intermediate_values, trial.values[0] if trial.values else None)


class TrialSummary(BaseModel):
    """One completed trial in the study's summary: its score, what RL added, how it was set up and by whom."""

    number: int
    held_out_accuracy: float
    held_out_at_rl_start: float | None
    rl_gain: float | None
    held_out_by_form: dict[str, float | None] | None
    params: dict[str, Any]
    # The trial's reward spec as the task serialises it (components with their kind and weight).
    reward_spec: dict[str, Any]
    run_id: str | None
    sampler_path: str | None
    source: str | None
    proposed_by: str
    rationale: str | None


class RewardCodeCounts(BaseModel):
    """The reward functions the LLM wrote as code: proposed, admitted, and each refusal's reason."""

    proposed: int
    admitted: int
    refused: list[str]


class ProposalCounts(BaseModel):
    """How the LLM's candidates fared in a study."""

    proposed: int
    valid: int
    # Trials started from its candidates.
    run: int
    # Each rejection's reason: an invalid candidate, or a call where the LLM gave none.
    rejected: list[str]
    # The LLM's turns that fell back to TPE, by kind.
    fallbacks: dict[str, int]
    reward_code: RewardCodeCounts


def summary_rows(study: optuna.Study, top: int = 5) -> list[TrialSummary]:
    """The best completed trials, best first: number, score, what RL added, parameters, reward spec, run id."""
    complete = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.values]
    complete.sort(key=lambda t: t.values[0], reverse=True)
    return [_summary_row(t) for t in complete[:top]]


def _summary_row(trial: FrozenTrial) -> TrialSummary:
    gain = rl_gain_of(trial)
    attributes = TrialAttributes.of(trial)
    return TrialSummary(
        number=trial.number,
        held_out_accuracy=trial.values[0],
        held_out_at_rl_start=gain.at_start,
        rl_gain=gain.gain,
        held_out_by_form=attributes.held_out_by_form,
        params={k: v for k, v in trial.params.items() if not k.startswith(REWARD_PREFIX)},
        reward_spec=json.loads(attributes.reward_spec or "{}"),
        run_id=attributes.run_id,
        sampler_path=attributes.sampler_path,
        source=attributes.source,
        proposed_by=proposed_by(attributes),
        rationale=attributes.rationale,
    )


def proposed_by(attributes: TrialAttributes) -> str:
    """Who proposed a trial: `llm`, `tpe`, or `tpe (LLM <kind>)` for an LLM turn that fell back (slow, down,
    malformed, refused); `-` before it is known."""
    if attributes.source == "llm":
        return "llm"
    if attributes.llm_fallback:
        return f"tpe (LLM {attributes.llm_fallback.split(':', 1)[0]})"
    return "tpe" if attributes.source == "sampler" else "-"


def llm_proposal_counts(study: optuna.Study) -> ProposalCounts:
    """How the LLM's candidates fared in `study`."""
    run = sum(
        1
        for t in study.get_trials(deepcopy=False)
        if TrialAttributes.of(t).source == "llm" and t.state is not TrialState.WAITING
    )
    attributes = StudyAttributes.of(study)
    return ProposalCounts(
        proposed=attributes.llm_proposed,
        valid=attributes.llm_valid,
        run=run,
        rejected=list(attributes.rejected_proposals),
        fallbacks=fallback_counts(study),
        reward_code=RewardCodeCounts(
            proposed=attributes.reward_code_proposed,
            admitted=attributes.reward_code_admitted,
            refused=list(attributes.rejected_reward_code),
        ),
    )
