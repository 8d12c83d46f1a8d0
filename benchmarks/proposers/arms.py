"""The proposers compared on the table, each an arm: a fresh in-memory Optuna study per seed whose trials are answered
from the table instead of being trained (the nearest grid point's outcome, one of its seeds drawn at random).

- `random`: Optuna's RandomSampler, the study's default config first (the grid point nearest the base trial config's
  own values), as a user who starts from the defaults would;
- `tpe`: Optuna's TPESampler of the seed, as it comes;
- `llm`: the study's hybrid sampler (`autoresearch.study_sampler`) with every trial the LLM's turn, TPE only where the
  LLM fails;
- `hybrid`: the same with the LLM on 30% of the trials (the sampler's default share), TPE on the rest.

The LLM arms ask the spec's LLM through the spec's `LlmProposer`, as a study does, given the optimizer's state (the
best and latest trials with their values); the spec is cut to the grid's axes, so the LLM proposes only what the
table answers and reads the other searched values as fixed settings.
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import RandomSampler, TPESampler

from autoresearch.attributes import StudyAttributes
from autoresearch.hybrid_sampler import Llm, OptimizerState, Suggestion, fallback_counts
from autoresearch.proposer import LlmProposer
from autoresearch.search import REWARD_PREFIX, distributions
from autoresearch.spec import LlmSettings, StudySpec
from autoresearch.study_sampler import study_sampler
from autoresearch.trials.backend import api_key, local_backend
from benchmarks.proposers.build import GRID_TRIAL_SETTINGS
from benchmarks.proposers.table import Grid, Table

ARMS = ("random", "tpe", "llm", "hybrid")
# The LLM's share of the trials, by LLM arm.
LLM_SHARES = {"llm": 1.0, "hybrid": 0.3}
# Seeds per arm unless told otherwise: more for the two arms the goal compares.
DEFAULT_SEEDS = {"random": 5, "tpe": 8, "llm": 5, "hybrid": 8}


@dataclass(frozen=True)
class Bench:
    """The study the arms search, cut to the grid's axes, and the table that answers their trials."""

    spec: StudySpec
    table: Table

    @classmethod
    def of(cls, spec: StudySpec, table: Table) -> Bench:
        """Raises TableError where the table's grid does not fit the spec's search space."""
        table.grid.check(distributions(spec))
        return cls(grid_spec(spec, table.grid), table)

    @property
    def space(self) -> dict[str, BaseDistribution]:
        """The arms' search space: the spec's distributions of the grid's axes."""
        return distributions(self.spec)

    def default_point(self) -> dict[str, Any]:
        """The grid point nearest the base trial config's own values (each reward weight at 0: off)."""
        base = self.spec.trial_config({}).model_dump()
        values = {name: 0.0 if name.startswith(REWARD_PREFIX) else base[name] for name in self.table.grid.axes}
        return self.table.grid.nearest(values, self.space)


def grid_spec(spec: StudySpec, grid: Grid) -> StudySpec:
    """The spec with only the grid's axes searched, and the grid's fixed trial settings (those the table's trials ran
    with) in its base trial config; reward components the grid fixes are left out (the grids fix them at 0)."""
    space = spec.search_space
    params = {name: param for name, param in space.params.items() if name in grid.axes}
    components = {kind: w for kind, w in space.reward.components.items() if REWARD_PREFIX + kind in grid.axes}
    reward = space.reward.model_copy(update={"components": components, "code": None})
    fixed = {name: value for name, value in grid.fixed.items() if not name.startswith(REWARD_PREFIX)}
    return spec.model_copy(
        update={
            "search_space": space.model_copy(update={"params": params, "reward": reward}),
            "trial": {**spec.trial, **fixed, **GRID_TRIAL_SETTINGS},
        }
    )


@dataclass
class LlmClock:
    """The LLM's calls and the seconds they took, answered or not."""

    calls: int = 0
    seconds: float = 0.0

    def timed(self, llm: Llm) -> Llm:
        def call(state: OptimizerState) -> Sequence[Suggestion]:
            started = time.monotonic()
            try:
                return llm(state)
            finally:
                self.calls += 1
                self.seconds += time.monotonic() - started

        return call


@dataclass(frozen=True)
class LlmUse:
    """How an LLM arm's seed used its LLM: its turns, those that fell back to TPE (by kind), the candidates it
    proposed and those valid, its calls and their seconds."""

    turns: int
    fallbacks: dict[str, int]
    proposed: int
    valid: int
    calls: int
    seconds: float

    @property
    def failed(self) -> int:
        return sum(self.fallbacks.values())


@dataclass(frozen=True)
class ArmRun:
    """One seed of one arm: the params and objective of each trial in order, who proposed it, and its LLM's use."""

    arm: str
    seed: int
    params: tuple[dict[str, Any], ...]
    values: tuple[float, ...]
    sources: tuple[str, ...]
    llm: LlmUse | None = None

    @property
    def best_params(self) -> dict[str, Any]:
        """The params of the seed's best trial (the first to reach the best value)."""
        return self.params[self.values.index(max(self.values))]


@dataclass(frozen=True)
class Arm:
    """A proposer as a study per seed; `llm` is the LLM's settings for the LLM arms (and `api_key` its key, else the
    one in the environment variable the settings name)."""

    name: str
    bench: Bench
    llm: LlmSettings | None = None
    api_key: str | None = None

    def __post_init__(self) -> None:
        if self.name not in ARMS:
            raise ValueError(f"no arm {self.name!r} (arms: {', '.join(ARMS)})")
        if self.name in LLM_SHARES and self.llm is None:
            raise ValueError(f"the {self.name} arm needs an LLM: give the spec an llm: section")

    def study(self, seed: int) -> tuple[optuna.Study, LlmClock | None]:
        """A fresh in-memory study whose sampler is this arm's, of `seed`, and the clock of its LLM calls."""
        if self.name == "random":
            study = optuna.create_study(direction="maximize", sampler=RandomSampler(seed=seed))
            study.enqueue_trial(self.bench.default_point(), user_attrs={"source": "default"})
            return study, None
        if self.name == "tpe":
            return optuna.create_study(direction="maximize", sampler=TPESampler(seed=seed)), None
        assert self.llm is not None
        study = optuna.create_study(direction="maximize")
        settings = self.llm.model_copy(update={"share": LLM_SHARES[self.name]})
        sampler = study_sampler(self.bench.spec, study, LlmProposer(settings, api_key=self.api_key), seed=seed)
        clock = LlmClock()
        sampler.llm = clock.timed(sampler.llm)
        study.sampler = sampler
        return study, clock

    def run(self, seed: int, trials: int, on_trial: Callable[[], None] = lambda: None) -> ArmRun:
        """`trials` trials of this arm's study of `seed`, each answered from the table (the outcome's seed drawn by a
        random generator of `seed`, so that every arm draws alike at a seed)."""
        study, clock = self.study(seed)
        answer_trials(study, self.bench, trials, random.Random(seed), on_trial)
        done = study.get_trials(deepcopy=False)
        return ArmRun(
            arm=self.name,
            seed=seed,
            params=tuple(dict(t.params) for t in done),
            values=tuple(float(t.value) for t in done),  # type: ignore[arg-type]
            sources=tuple(str(t.user_attrs.get("source", "sampler")) for t in done),
            llm=None if clock is None else llm_use(study, clock),
        )


def llm_use(study: optuna.Study, clock: LlmClock) -> LlmUse:
    attributes = StudyAttributes.of(study)
    trials = study.get_trials(deepcopy=False)
    turns = sum(1 for t in trials if t.user_attrs.get("source") == "llm" or t.user_attrs.get("llm_fallback"))
    return LlmUse(
        turns=turns,
        fallbacks=fallback_counts(study),
        proposed=attributes.llm_proposed,
        valid=attributes.llm_valid,
        calls=clock.calls,
        seconds=clock.seconds,
    )


def answer_trials(
    study: optuna.Study, bench: Bench, trials: int, rng: random.Random, on_trial: Callable[[], None] = lambda: None
) -> None:
    """Ask the study for `trials` trials over the bench's space and tell each the table's outcome of its params, the
    outcome's seed and run id kept as the trial's user attributes (`table_seed`, `table_run_id`)."""
    space = bench.space
    for _ in range(trials):
        trial = study.ask(space)
        outcome = bench.table.query(trial.params, space, rng)
        trial.set_user_attr("table_seed", outcome.seed)
        trial.set_user_attr("table_run_id", outcome.run_id)
        study.tell(trial, outcome.score)
        on_trial()


def seeds_of(arm: str, seeds: int | None) -> range:
    return range(DEFAULT_SEEDS[arm] if seeds is None else seeds)


def point_text(point: Mapping[str, Any]) -> str:
    return ", ".join(f"{name}={value}" for name, value in point.items())


@contextmanager
def proposer_llm(spec: StudySpec, llm_url: str | None = None) -> Iterator[tuple[LlmSettings, str | None]]:
    """The spec's LLM settings, and the key to send (None: the one in the environment variable they name), as a study
    reaches its LLM: at `llm_url` (an OpenAI-compatible …/v1) where given; else the spec's endpoint; else, for
    `llm: {base_url: local}`, a local backend started here whose /v1 serves the spec's base model.

    Raises:
        ValueError: the spec has no llm: section.
        BackendStartError: the local backend did not start.
    """
    if spec.llm is None:
        raise ValueError(f"study {spec.study}: its spec has no llm: section, so the llm and hybrid arms have no LLM")
    key = api_key() if spec.llm.is_local else None
    if llm_url is not None:
        yield (
            spec.llm.model_copy(update={"base_url": llm_url.rstrip("/"), "model": spec.llm.model or spec.base_model}),
            key,
        )
    elif not spec.llm.is_local:
        yield spec.llm, None
    else:
        with (
            tempfile.TemporaryDirectory(prefix="proposers-llm-") as storage,
            local_backend(spec.base_model, Path(storage)) as url,
        ):
            yield spec.llm.served_by(url, spec.base_model), key
