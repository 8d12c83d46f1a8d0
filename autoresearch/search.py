"""The search space as Optuna sees it, and candidates (from an LLM or Optuna's sampler) checked against it.

A reward variant is searched as weights: `reward.<kind>` is the weight of one of the task's optional components
added to its base component (0 leaves it out). Optuna stores every trial's parameters under these names, so the
dashboard, the sampler and the LLM all see hyperparameters and reward design side by side.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from pydantic import BaseModel

from autoresearch.errors import CandidateError, ConfigurationError
from autoresearch.hybrid_sampler import within
from autoresearch.reward_code import CodeComponent
from autoresearch.spec import Choices, FloatRange, IntRange, StudySpec
from autoresearch.trials.config import InitialState, TrialConfig
from tasks.errors import TaskError
from tasks.registry import task_class
from tasks.reward_code.admission import CodeRewardTask

REWARD_PREFIX = "reward."


@dataclass(frozen=True)
class Candidate:
    """One trial to run: searched parameters, optional reward components' weights, and why it was proposed."""

    params: dict[str, object]
    reward_weights: dict[str, float]
    rationale: str
    source: Literal["llm", "sampler"]
    # A reward component the LLM wrote as code, and its weight (`reward_code`: admitted before any trial runs it).
    reward_code: str | None = None
    reward_code_weight: float = 0.0

    def optuna_params(self) -> dict[str, object]:
        return {**self.params, **{REWARD_PREFIX + kind: w for kind, w in self.reward_weights.items()}}


def reward_spec(spec: StudySpec, weights: Mapping[str, float], code: CodeComponent | None = None) -> BaseModel:
    """The study's task's reward of these weights: its base component at weight 1, plus every optional component
    with a positive weight, plus admitted reward `code` at its weight.

    Raises:
        ConfigurationError: a weight the task's reward refuses, or code for a task that takes none.
    """
    task = task_class(spec.task)
    try:
        built = task.reward_spec_from_weights(weights)
        if code is None:
            return built
        if not isinstance(task, CodeRewardTask):
            raise ConfigurationError(f"reward_spec: task {spec.task!r} takes no reward components as code")
        return task.reward_spec_with_code(built, code.reference, code.weight)
    except TaskError as error:
        raise ConfigurationError(f"reward_spec: {error}") from None


def distributions(spec: StudySpec) -> dict[str, BaseDistribution]:
    """Optuna distributions of every searched name: trial parameters and `reward.<kind>` weights."""
    found: dict[str, BaseDistribution] = {}
    for name, param in spec.search_space.params.items():
        found[name] = _distribution(param)
    for kind, weight_range in spec.search_space.reward.components.items():
        found[REWARD_PREFIX + kind] = _distribution(weight_range)
    return found


def _distribution(param: FloatRange | IntRange | Choices) -> BaseDistribution:
    if isinstance(param, FloatRange):
        return FloatDistribution(param.low, param.high, log=param.log)
    if isinstance(param, IntRange):
        return IntDistribution(param.low, param.high, step=param.step)
    return CategoricalDistribution(list(param.choices))


def candidate_from_params(values: dict[str, object], rationale: str, source: Literal["llm", "sampler"]) -> Candidate:
    """The candidate of Optuna parameters: trial parameters, and `reward.<kind>` weights."""
    weights = {k.removeprefix(REWARD_PREFIX): float(v) for k, v in values.items() if k.startswith(REWARD_PREFIX)}
    return Candidate(
        params={k: v for k, v in values.items() if not k.startswith(REWARD_PREFIX)},
        reward_weights=weights,
        rationale=rationale,
        source=source,
    )


def check_candidate(spec: StudySpec, params: dict[str, object], reward_weights: dict[str, float]) -> None:
    """Raises CandidateError naming the first name that is not searched, the first value outside the search space, or
    a trial config that is invalid. Names left out are fine: Optuna's sampler fills them in."""
    weights = {REWARD_PREFIX + kind: weight for kind, weight in reward_weights.items()}
    try:
        within(distributions(spec), {**params, **weights})
    except ValueError as error:
        raise CandidateError(str(error)) from None
    check_trial_config(spec, params, reward_weights)


def check_trial_config(spec: StudySpec, params: dict[str, object], reward_weights: dict[str, float]) -> None:
    """Raises CandidateError with the reason when a candidate inside the search space makes an invalid trial config
    (a loss and a clip that do not go together, a reward the task refuses)."""
    try:
        spec.trial_config(params, reward_spec(spec, reward_weights))
    except ConfigurationError as error:
        raise CandidateError(str(error)) from None


def trial_config_of(
    spec: StudySpec,
    candidate: Candidate,
    run_id: str,
    init_from: InitialState | None = None,
    code: CodeComponent | None = None,
) -> TrialConfig:
    """The candidate's trial config, its reward with admitted `code` where it has some."""
    return spec.trial_config(candidate.params, reward_spec(spec, candidate.reward_weights, code), run_id, init_from)
