"""A hybrid Optuna sampler: an LLM proposes a share of the trials, given the optimizer's state, and TPE (or any other
sampler) the rest, including every LLM turn the LLM cannot serve.

    study = optuna.create_study(sampler=HybridSampler(ChatLlm(url, model), llm_share=0.3, seed=1))

The LLM is any callable from an `OptimizerState` (the search space's bounds, the best trials, the latest ones with
their curves and chosen user attributes) to candidates; `chat_llm.ChatLlm` asks an OpenAI-compatible endpoint. Which
trials are the LLM's turns is fixed by the seed: the first trial (with nothing known, TPE samples at random while the
LLM brings its prior), then one in every 1/share at positions the seed shifts. A turn falls back to the base sampler
when the LLM is slow, down or malformed, or when it proposes only candidates that are refused (outside the bounds, a
repeat of a trial's values, or refused by the caller's `check`); the trial carries the reason.

What each trial records as user attributes (the dashboard shows them): `source` (`llm`, or `sampler` for the base
sampler's), the LLM's `rationale`, and on a fallen-back turn `llm_fallback` ("<kind>: <why>"). The study records how
the LLM's candidates fared: `llm_proposed`, `llm_valid` and each refusal's reason in `rejected_proposals`.
"""

from __future__ import annotations

import json
import logging
import math
import random
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.samplers import BaseSampler, TPESampler
from optuna.search_space import IntersectionSearchSpace
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

log = logging.getLogger(__name__)

FallbackKind = Literal["slow", "down", "malformed", "refused", "no space"]
FALLBACK_KINDS: tuple[str, ...] = get_args(FallbackKind)
# User attributes of a trial shown to the LLM where a trial has them, unless the caller names others: the rationale
# this sampler records.
SHOWN_ATTRS = ("rationale",)
# Each shown attribute is cut to this many characters (a reward spec or a failure can be long).
_ATTR_CHARS = 300


@dataclass(frozen=True)
class TrialSnapshot:
    """One trial as the LLM sees it: its first objective value, parameters, intermediate values by step, and the
    shown user attributes it has."""

    number: int
    state: str
    value: float | None
    params: dict[str, Any]
    curve: dict[int, float]
    attrs: dict[str, Any]

    @classmethod
    def of(cls, trial: FrozenTrial, shown_attrs: Sequence[str]) -> TrialSnapshot:
        return cls(
            number=trial.number,
            state=trial.state.name,
            value=trial.values[0] if trial.values else None,
            params=dict(trial.params),
            curve=dict(trial.intermediate_values),
            attrs={name: trial.user_attrs[name] for name in shown_attrs if trial.user_attrs.get(name) is not None},
        )

    def line(self) -> str:
        value = "-" if self.value is None else f"{self.value:.4g}"
        curve = ", ".join(f"{step}:{v:.3g}" for step, v in sorted(self.curve.items()))
        attrs = "".join(f" {name}={_clip(v)}" for name, v in self.attrs.items())
        return f"#{self.number} {self.state} value={value} curve=[{curve}] params={json.dumps(self.params)}{attrs}"


@dataclass(frozen=True)
class OptimizerState:
    """What the LLM is given: the bounds of the search space, the best finished trials, the latest started ones,
    and how many candidates to propose."""

    direction: Literal["maximize", "minimize"]
    bounds: dict[str, BaseDistribution]
    best: tuple[TrialSnapshot, ...]
    recent: tuple[TrialSnapshot, ...]
    count: int

    def prompt(self) -> str:
        """The state as text, for an LLM that has no other description of the study."""
        bounds = "\n".join(f"- {name}: {describe(d)}" for name, d in self.bounds.items())
        best = "\n".join(t.line() for t in self.best) or "(none finished yet)"
        recent = "\n".join(t.line() for t in self.recent) or "(none yet)"
        return (
            f"An Optuna study {self.direction}s its objective (value).\n"
            f"Search space (bounds):\n{bounds}\n"
            f"Best trials so far:\n{best}\n"
            f"Latest trials, with the value at each reported step (curve):\n{recent}\n"
            f"Propose {self.count} new candidates inside the bounds, none repeating a trial's params. Answer with one "
            'JSON object: {"candidates": [{"params": {<name>: <value>, ...}, "rationale": "<what it changes from '
            'which trials above, and why>"}]}.'
        )


@dataclass(frozen=True)
class Suggestion:
    """A candidate from the LLM: parameter values by name (names it leaves out are the base sampler's to fill), why
    it proposes them, and user attributes its trial is to carry besides (what the caller's LLM made of it: this
    project's admitted reward code)."""

    params: dict[str, Any]
    rationale: str
    user_attrs: dict[str, Any] = field(default_factory=dict)


class LlmError(Exception):
    """Raised by an LLM callable when it cannot answer (`down`, `slow`) or its answer is unusable (`malformed`)."""

    def __init__(self, kind: FallbackKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


Llm = Callable[[OptimizerState], Sequence[Suggestion]]
# Raises ValueError, naming the problem, for a candidate the caller refuses (one its objective cannot run).
Check = Callable[[Suggestion], None]


@dataclass(frozen=True)
class Fallback:
    kind: FallbackKind
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


@dataclass
class _Answer:
    accepted: list[Suggestion] = field(default_factory=list)
    fallback: Fallback | None = None


class HybridSampler(BaseSampler):
    """The LLM on `llm_share` of the trials, `base_sampler` (TPE of the same seed by default) on the rest.

    Args:
        llm: the LLM, from the optimizer's state to candidates; raises `LlmError` (any other error counts as down).
        llm_share: the share of trials that are the LLM's turns, in (0, 1].
        seed: fixes which trials are the LLM's turns (and seeds the default TPE).
        base_sampler: samples every other trial and every fallen-back turn.
        timeout_s: an LLM that has not answered by then is slow (its turn falls back); None waits for it.
        candidates_per_call: candidates asked for per LLM call, so that one refused candidate does not waste a turn.
        best_trials, recent_trials: how many of the best finished and of the latest trials the LLM sees.
        shown_attrs: the trials' user attributes shown with them, where set.
        search_space: the bounds the LLM proposes in; by default those every finished trial shares (a study's first
            trial then has none, and its LLM turn falls back: pass the space to have the LLM propose it).
        check: the caller's own check of a candidate, raising ValueError with the reason to refuse it.
        distinguishing_attrs: user attributes that make two trials of the same parameter values different runs (this
            project's reward code, by hash): a candidate repeats an earlier trial only where these are the same too.
    """

    def __init__(
        self,
        llm: Llm,
        *,
        llm_share: float = 0.3,
        seed: int | None = None,
        base_sampler: BaseSampler | None = None,
        timeout_s: float | None = 120.0,
        candidates_per_call: int = 1,
        best_trials: int = 5,
        recent_trials: int = 5,
        shown_attrs: Sequence[str] = SHOWN_ATTRS,
        search_space: Mapping[str, BaseDistribution] | None = None,
        check: Check | None = None,
        distinguishing_attrs: Sequence[str] = (),
    ) -> None:
        if not 0 < llm_share <= 1:
            raise ValueError(f"llm_share must be in (0, 1], got {llm_share}")
        if candidates_per_call < 1:
            raise ValueError(f"candidates_per_call must be at least 1, got {candidates_per_call}")
        self.llm = llm
        self.llm_share = llm_share
        self.base_sampler = base_sampler or TPESampler(seed=seed)
        self.timeout_s = timeout_s
        self.candidates_per_call = candidates_per_call
        self.best_trials = best_trials
        self.recent_trials = recent_trials
        self.shown_attrs = tuple(shown_attrs)
        self.search_space = dict(search_space) if search_space is not None else None
        self.check = check
        self.distinguishing_attrs = tuple(distinguishing_attrs)
        # Turns are spread evenly, one in every 1/share; the phase is the seed's, within the range that makes the
        # first trial a turn.
        self._phase = 1 - llm_share + llm_share * random.Random(seed).random()
        self._suggestions: dict[int, Suggestion] = {}  # by trial id, from before_trial to sample_relative
        # Turns that `enqueue_llm_proposals` could not fill, why, for the trials that take them.
        self._unfilled: list[Fallback] = []
        self._space_of_study = IntersectionSearchSpace(include_pruned=True)

    # --- which trials are the LLM's ------------------------------------------------------------------------------

    def _quota(self, trials: int) -> int:
        """LLM turns among a study's first `trials` trials."""
        return math.floor(self._phase + trials * self.llm_share)

    def llm_turns_ahead(self, study: optuna.Study, count: int) -> int:
        """How many of the study's next `count` trials are the LLM's turns (turns it has not taken yet included)."""
        trials = study.get_trials(deepcopy=False)
        return max(0, min(count, self._quota(len(trials) + count) - _turns_taken(trials)))

    # --- the LLM's candidates -----------------------------------------------------------------------------------

    def enqueue_llm_proposals(self, study: optuna.Study, count: int) -> int:
        """Ask the LLM now for its turns among the next `count` trials and enqueue the candidates it gives (they wait
        in the study, safe from a crash, until asked for); a turn left unfilled falls back to the base sampler, with
        the reason, when its trial is asked for. Returns the number enqueued."""
        self._unfilled.clear()
        turns = self.llm_turns_ahead(study, count)
        if turns == 0:
            return 0
        answer = self._ask_llm(study, turns, f"trials from {len(study.get_trials(deepcopy=False))}")
        for suggestion in answer.accepted:
            mine = {"source": "llm", "rationale": suggestion.rationale}
            study.enqueue_trial(suggestion.params, user_attrs={**suggestion.user_attrs, **mine})
        shortfall = turns - len(answer.accepted)
        reason = answer.fallback or Fallback("refused", "the LLM gave fewer usable candidates than it had turns")
        self._unfilled = [reason] * shortfall
        return len(answer.accepted)

    def _ask_llm(self, study: optuna.Study, turns: int, label: str) -> _Answer:
        """Up to `turns` accepted candidates, or why there is none; every candidate is counted on the study and each
        refusal recorded with its reason."""
        space = self._bounds(study)
        if not space:
            return _Answer(fallback=Fallback("no space", "no finished trial shows the search space yet"))
        trials = study.get_trials(deepcopy=False)
        state = self.state(study, space, max(turns, self.candidates_per_call))
        try:
            suggestions = list(self._call(state))
        except LlmError as error:
            return self._failed(study, label, Fallback(error.kind, str(error)))
        _add_to_count(study, "llm_proposed", len(suggestions))
        # Trials that ran or run, and those waiting with their values.
        earlier = {
            f"trial {t.number}'s": self._identity(params, t.user_attrs)
            for t in trials
            for params in [t.params or t.system_attrs.get("fixed_params", {})]
            if params
        }
        answer = _Answer()
        refusals = []
        for index, suggestion in enumerate(suggestions):
            try:
                params = within(space, suggestion.params)
                identity = self._identity(params, suggestion.user_attrs)
                _check_new(identity, earlier)
                if self.check is not None:
                    self.check(Suggestion(params, suggestion.rationale))
            except ValueError as error:
                refusals.append(f"{suggestion.rationale!r} rejected: {error}")
                _append(study, "rejected_proposals", f"{label}: {refusals[-1]}")
                log.warning("%s: %s", label, refusals[-1])
                continue
            earlier[f"candidate {index + 1} of this round's"] = identity
            answer.accepted.append(Suggestion(params, suggestion.rationale, suggestion.user_attrs))
        _add_to_count(study, "llm_valid", len(answer.accepted))
        if not answer.accepted:
            answer.fallback = Fallback("refused", "; ".join(refusals) or "the LLM proposed no candidate")
        answer.accepted = answer.accepted[:turns]
        return answer

    def _identity(self, params: Mapping[str, Any], user_attrs: Mapping[str, Any]) -> dict[str, Any]:
        """What makes a trial a run of its own: its values, and its distinguishing user attributes."""
        return {**params, **{f"user attribute {name}": user_attrs.get(name) for name in self.distinguishing_attrs}}

    def _failed(self, study: optuna.Study, label: str, fallback: Fallback) -> _Answer:
        reason = f"{label}: {fallback.detail}; Optuna's sampler proposes instead"
        log.warning("%s", reason)
        _append(study, "rejected_proposals", reason)
        return _Answer(fallback=fallback)

    def _call(self, state: OptimizerState) -> Sequence[Suggestion]:
        """The LLM's answer, within the timeout; every way it can fail becomes an LlmError of its kind."""
        if self.timeout_s is None:
            return _answer_of(self.llm, state)
        outcome: list[Sequence[Suggestion] | LlmError] = []

        def run() -> None:
            try:
                outcome.append(_answer_of(self.llm, state))
            except LlmError as error:
                outcome.append(error)

        # A daemon thread: an LLM call that never returns must not hold the study (or the interpreter's exit).
        thread = threading.Thread(target=run, name="hybrid-sampler-llm", daemon=True)
        thread.start()
        thread.join(self.timeout_s)
        if not outcome:
            raise LlmError("slow", f"no answer within {self.timeout_s:g} s")
        if isinstance(outcome[0], LlmError):
            raise outcome[0]
        return outcome[0]

    def state(self, study: optuna.Study, bounds: Mapping[str, BaseDistribution], count: int) -> OptimizerState:
        """The optimizer's state as the LLM sees it."""
        trials = study.get_trials(deepcopy=False)
        maximize = study.directions[0] == StudyDirection.MAXIMIZE
        finished = [t for t in trials if t.state is TrialState.COMPLETE and t.values]
        finished.sort(key=lambda t: t.values[0], reverse=maximize)
        # Trials that hold values: not those waiting, nor the one being created.
        started = [t for t in trials if t.state is not TrialState.WAITING and t.params]
        return OptimizerState(
            direction="maximize" if maximize else "minimize",
            bounds=dict(bounds),
            best=tuple(TrialSnapshot.of(t, self.shown_attrs) for t in finished[: self.best_trials]),
            recent=tuple(TrialSnapshot.of(t, self.shown_attrs) for t in started[-self.recent_trials :]),
            count=count,
        )

    def _bounds(self, study: optuna.Study) -> dict[str, BaseDistribution]:
        if self.search_space is not None:
            return self.search_space
        return self._space_of_study.calculate(study)

    # --- Optuna's sampler interface -----------------------------------------------------------------------------

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        """Decide who proposes this trial, and ask the LLM on its turn. A trial enqueued with its values (by
        `enqueue_llm_proposals` or by the study's user) is left as it is, and so is one already decided (Optuna calls
        this again whenever a `Trial` of a running trial is made)."""
        self.base_sampler.before_trial(study, trial)
        if "fixed_params" in trial.system_attrs or trial.params or trial.user_attrs.get("source") is not None:
            return
        earlier = [t for t in study.get_trials(deepcopy=False) if t.number < trial.number]
        if _turns_taken(earlier) >= self._quota(trial.number + 1):
            _write(study, trial, {"source": "sampler"})
            return
        fallback = self._unfilled.pop(0) if self._unfilled else None
        if fallback is None:
            answer = self._ask_llm(study, 1, f"trial {trial.number}")
            if answer.accepted:
                chosen = self._suggestions[trial._trial_id] = answer.accepted[0]
                _write(study, trial, {**chosen.user_attrs, "source": "llm", "rationale": chosen.rationale})
                return
            fallback = answer.fallback or Fallback("refused", "the LLM proposed no candidate")
        log.warning("trial %d: the LLM's turn falls back to the base sampler (%s)", trial.number, fallback)
        _write(study, trial, {"source": "sampler", "llm_fallback": str(fallback)})

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        suggestion = self._suggestions.get(trial._trial_id)
        if suggestion is None:
            return self.base_sampler.infer_relative_search_space(study, trial)
        bounds = self._bounds(study)
        return {name: bounds[name] for name in suggestion.params}

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        suggestion = self._suggestions.pop(trial._trial_id, None)
        if suggestion is None:
            return self.base_sampler.sample_relative(study, trial, search_space)
        return {name: value for name, value in suggestion.params.items() if name in search_space}

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        return self.base_sampler.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        self._suggestions.pop(trial._trial_id, None)
        self.base_sampler.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.base_sampler.reseed_rng()


def fallback_counts(study: optuna.Study) -> dict[str, int]:
    """The LLM's turns that fell back to the base sampler, by kind (slow, down, malformed, refused, no space)."""
    reasons = (t.user_attrs.get("llm_fallback") for t in study.get_trials(deepcopy=False))
    counts = Counter(reason.split(":", 1)[0] for reason in reasons if reason)
    return {kind: counts[kind] for kind in FALLBACK_KINDS if counts[kind]}


def describe(distribution: BaseDistribution) -> str:
    """A distribution's bounds in words."""
    if isinstance(distribution, CategoricalDistribution):
        return f"one of {json.dumps(list(distribution.choices))}"
    if isinstance(distribution, IntDistribution):
        return f"integer in [{distribution.low}, {distribution.high}] step {distribution.step}" + (
            ", log scale" if distribution.log else ""
        )
    if isinstance(distribution, FloatDistribution):
        step = f" step {distribution.step}" if distribution.step is not None else ""
        return f"float in [{distribution.low:g}, {distribution.high:g}]{step}" + (
            ", log scale" if distribution.log else ""
        )
    return repr(distribution)


def _answer_of(llm: Llm, state: OptimizerState) -> Sequence[Suggestion]:
    """Calls the LLM; an answer it could not parse (ValueError) is malformed, any other error means it is down."""
    try:
        return llm(state)
    except LlmError:
        raise
    except ValueError as error:
        raise LlmError("malformed", str(error) or type(error).__name__) from None
    except Exception as error:  # whatever breaks in the LLM's call, the study goes on without it
        raise LlmError("down", f"{type(error).__name__}: {error}") from None


def within(space: Mapping[str, BaseDistribution], params: Mapping[str, Any]) -> dict[str, Any]:
    """A candidate's values as the distributions of `space` hold them; raises ValueError naming the first name that is
    not searched or value that is outside (the one check of a candidate's bounds, whoever proposed it)."""
    inside = {}
    for name, value in params.items():
        distribution = space.get(name)
        if distribution is None:
            raise ValueError(f"{name!r} is not searched (searched: {', '.join(space)})")
        try:
            internal = distribution.to_internal_repr(value)
            if isinstance(distribution, (FloatDistribution, IntDistribution)) and isinstance(value, bool | str):
                raise ValueError(value)
            contained = distribution._contains(internal)
        except (ValueError, TypeError):
            contained = False
        if not contained:
            raise ValueError(f"{name}={value!r} is outside the search space ({describe(distribution)})")
        inside[name] = distribution.to_external_repr(internal)
    return inside


def _check_new(params: Mapping[str, Any], earlier: Mapping[str, Mapping[str, Any]]) -> None:
    """Raises ValueError when the candidate repeats an earlier trial's or candidate's values (floats to 9
    significant digits): with a fixed seed a repeat retraces the same run."""
    for whose, values in earlier.items():
        if _comparable(params) == _comparable(values):
            raise ValueError(f"it repeats {whose} parameters")


def _comparable(params: Mapping[str, Any]) -> dict[str, Any]:
    return {name: float(f"{v:.9g}") if isinstance(v, float) else v for name, v in params.items()}


def _turns_taken(trials: Sequence[FrozenTrial]) -> int:
    """LLM turns these trials took: those the LLM proposed and those whose LLM turn fell back."""
    return sum(1 for t in trials if t.user_attrs.get("source") == "llm" or t.user_attrs.get("llm_fallback"))


def _write(study: optuna.Study, trial: FrozenTrial, attributes: Mapping[str, Any]) -> None:
    """Set user attributes on a trial being created; the FrozenTrial Optuna passed is the one its `Trial` reads."""
    for name, value in attributes.items():
        study._storage.set_trial_user_attr(trial._trial_id, name, value)
        trial.user_attrs[name] = value


def _add_to_count(study: optuna.Study, name: str, added: int) -> None:
    study.set_user_attr(name, int(study.user_attrs.get(name, 0)) + added)


def _append(study: optuna.Study, name: str, entry: str) -> None:
    study.set_user_attr(name, [*study.user_attrs.get(name, []), entry])


def _clip(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= _ATTR_CHARS else text[: _ATTR_CHARS - 1] + "…"
