"""What a study and its trials carry as Optuna user attributes, read and written here alone.

The dashboard shows them and existing studies hold them, so their names and values are as they always were. A trial
carries `run_id`, `source` (llm or sampler), `rationale`, `llm_fallback` (why an LLM's turn went to the sampler: see
`hybrid_sampler`), `backend_url`, `reward_spec` and `trial_config` (JSON), where the LLM wrote a reward component
as code `reward_code_sha256`, `reward_code_artifact` (the study artifact holding it) and `reward_code_weight`, or
`reward_code_refused` (why it was not admitted), once
it ends `held_out_at_rl_start` and `rl_gain` (what RL added to the accuracy its warm-up left), once it finished
`sampler_path`, and for a failed one `failure`. The study carries the base model's held-out accuracy
(`baseline_accuracy`), each shared warm-up (`shared_warmup:<backend>`), the LLM's analyses (`analysis-<round>`), and
how its candidates fared (`llm_proposed`, `llm_valid`, `rejected_proposals`), and how the reward code the LLM wrote
fared (`reward_code_proposed`, `reward_code_admitted`, `rejected_reward_code`; each admitted source is a study
artifact, `reward_code:<sha256>` its id).
"""

from __future__ import annotations

from typing import Literal

import optuna
from optuna.trial import FrozenTrial
from pydantic import BaseModel, ConfigDict, Field

from autoresearch.trials.config import InitialState

# A study attribute per backend, `shared_warmup:<url>` ('local' for the controller's own): the warm-up its trials
# start from.
SHARED_WARMUP_PREFIX = "shared_warmup:"
# A study attribute per admitted reward code, `reward_code:<sha256>`: the artifact that holds its source.
REWARD_CODE_PREFIX = "reward_code:"
# A study attribute per round of the LLM's analysis, `analysis-<round, three digits>`, so that they sort in order.
ANALYSIS_PREFIX = "analysis-"


class SharedWarmup(BaseModel):
    """A finished shared warm-up: its run, the state trials load, and its held-out accuracy (where RL starts)."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    path: str
    examples_seen: int
    held_out_accuracy: float

    def initial_state(self) -> InitialState:
        return InitialState(path=self.path, examples_seen=self.examples_seen)


# A trial's attributes the study's LLM sees with it (`hybrid_sampler.TrialSnapshot`), where the trial has them.
SHOWN_TO_LLM = ("rationale", "reward_spec", "held_out_at_rl_start", "rl_gain", "failure")


class TrialAttributes(BaseModel):
    """A trial's attributes; an attribute it does not carry (yet) reads as None.

    Built with some fields, it is an update: `write_to` writes only the fields it was given.
    """

    model_config = ConfigDict(frozen=True)

    run_id: str | None = None
    source: Literal["llm", "sampler"] | None = None
    rationale: str | None = None
    # "<kind>: <why>" on a trial that was the LLM's turn and that the sampler proposed instead.
    llm_fallback: str | None = None
    backend_url: str | None = None
    # The trial config's reward spec, and the whole config, as JSON text.
    reward_spec: str | None = None
    trial_config: str | None = None
    # A reward component the LLM wrote as code: the source's sha256, the study artifact that holds it, its weight;
    # or why the code was refused (the trial then runs the rest of the proposal).
    reward_code_sha256: str | None = None
    reward_code_artifact: str | None = None
    reward_code_weight: float | None = None
    reward_code_refused: str | None = None
    # Times a trial whose process died was started again.
    relaunches: int = 0
    held_out_at_rl_start: float | None = None
    rl_gain: float | None = None
    # The latest evaluation's accuracy on questions of forms training shows ("seen") and never shows ("unseen").
    held_out_by_form: dict[str, float | None] | None = None
    sampler_path: str | None = None
    failure: str | None = None

    @classmethod
    def of(cls, trial: FrozenTrial | optuna.Trial) -> TrialAttributes:
        return cls.model_validate(trial.user_attrs)

    def user_attrs(self) -> dict[str, object]:
        """The fields this was built with, as Optuna stores them."""
        return self.model_dump(exclude_unset=True)

    def write_to(self, trial: optuna.Trial) -> None:
        for name, value in self.user_attrs().items():
            trial.set_user_attr(name, value)


class StudyAttributes(BaseModel):
    """The study's attributes, as they stand when read."""

    model_config = ConfigDict(frozen=True)

    baseline_accuracy: float | None = None
    # Shared warm-ups by backend URL ('local' for the controller's own backend).
    shared_warmups: dict[str, SharedWarmup] = Field(default_factory=dict)
    # The LLM's analyses, a round each, in order.
    analyses: tuple[str, ...] = ()
    # Candidates the LLM proposed, those that fit the search space and joined Optuna's queue, and why each of the
    # others (or a round where the LLM gave none) was rejected.
    llm_proposed: int = 0
    llm_valid: int = 0
    rejected_proposals: tuple[str, ...] = ()
    # Reward functions the LLM wrote as code, those admitted, and why each of the others was refused.
    reward_code_proposed: int = 0
    reward_code_admitted: int = 0
    rejected_reward_code: tuple[str, ...] = ()

    @classmethod
    def of(cls, study: optuna.Study) -> StudyAttributes:
        attrs = study.user_attrs
        return cls(
            baseline_accuracy=attrs.get("baseline_accuracy"),
            shared_warmups={
                key.removeprefix(SHARED_WARMUP_PREFIX): value
                for key, value in attrs.items()
                if key.startswith(SHARED_WARMUP_PREFIX)
            },
            analyses=tuple(value for key, value in sorted(attrs.items()) if key.startswith(ANALYSIS_PREFIX)),
            llm_proposed=attrs.get("llm_proposed", 0),
            llm_valid=attrs.get("llm_valid", 0),
            rejected_proposals=tuple(attrs.get("rejected_proposals", ())),
            reward_code_proposed=attrs.get("reward_code_proposed", 0),
            reward_code_admitted=attrs.get("reward_code_admitted", 0),
            rejected_reward_code=tuple(attrs.get("rejected_reward_code", ())),
        )


def record_baseline(study: optuna.Study, accuracy: float) -> None:
    study.set_user_attr("baseline_accuracy", accuracy)


def record_shared_warmup(study: optuna.Study, backend_key: str, warmup: SharedWarmup) -> None:
    study.set_user_attr(SHARED_WARMUP_PREFIX + backend_key, warmup.model_dump())


def record_analysis(study: optuna.Study, round_number: int, text: str) -> None:
    study.set_user_attr(f"{ANALYSIS_PREFIX}{round_number:03d}", text)


def record_reward_code(study: optuna.Study, reason: str | None) -> None:
    """Count a reward function the LLM wrote: admitted (`reason` None), or refused for `reason`."""
    attributes = StudyAttributes.of(study)
    study.set_user_attr("reward_code_proposed", attributes.reward_code_proposed + 1)
    if reason is None:
        study.set_user_attr("reward_code_admitted", attributes.reward_code_admitted + 1)
    else:
        study.set_user_attr("rejected_reward_code", [*attributes.rejected_reward_code, reason])


def admitted_reward_code(study: optuna.Study, sha256: str) -> str | None:
    """The study artifact holding the admitted reward code of this hash, if the study admitted it before."""
    return study.user_attrs.get(f"{REWARD_CODE_PREFIX}{sha256}")


def record_admitted_reward_code(study: optuna.Study, sha256: str, artifact_id: str) -> None:
    study.set_user_attr(f"{REWARD_CODE_PREFIX}{sha256}", artifact_id)
