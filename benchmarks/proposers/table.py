"""The tabular benchmark's grid and table: real trial outcomes at the points of a grid over a study's search space,
a few seeds each, queried by the proposer arms instead of running a trial (as HPOBench and YAHPO do).

A grid names some of the study's searched parameters (Optuna's names: `learning_rate`, `reward.result_overlap`) and
the values each takes; the table holds one row per grid point and seed. A query for any parameters in the space is
answered by the nearest grid point (per axis, on the axis's own scale: log for a log range), a seed drawn at random.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

# The columns after the grid's axes, in the CSV.
OUTCOME_COLUMNS = ("seed", "score", "accuracy", "seen_form_accuracy", "unseen_form_accuracy", "seconds", "run_id")


class TableError(ValueError):
    """A grid or table that does not fit the search space, or a query it cannot answer; the message says which."""


@dataclass(frozen=True)
class Grid:
    """Values of some searched parameters; every other searched parameter is held at `fixed` in the trials."""

    axes: dict[str, tuple[Any, ...]]
    fixed: dict[str, Any] = field(default_factory=dict)

    def points(self) -> list[dict[str, Any]]:
        """Every grid point, in the axes' order (the last axis varies fastest)."""
        return [dict(zip(self.axes, values, strict=True)) for values in product(*self.axes.values())]

    def check(self, space: Mapping[str, BaseDistribution]) -> None:
        """Raises TableError naming an axis or fixed value the search space has not, or a value outside its range."""
        for name, value in [(n, v) for n, values in self.axes.items() for v in values] + list(self.fixed.items()):
            if name not in space:
                raise TableError(f"grid: {name!r} is not searched (searched: {', '.join(space)})")
            if not _contains(space[name], value):
                raise TableError(f"grid: {name}={value!r} is outside the search space ({space[name]})")

    def nearest(self, params: Mapping[str, Any], space: Mapping[str, BaseDistribution]) -> dict[str, Any]:
        """The grid point nearest to `params`, axis by axis; raises TableError for a missing axis or unknown
        choice."""
        point = {}
        for name, values in self.axes.items():
            if name not in params:
                raise TableError(f"query: no value for the grid's axis {name!r}")
            value = params[name]
            if isinstance(space[name], CategoricalDistribution):
                if value not in values:
                    raise TableError(f"query: {name}={value!r} is not on the grid ({', '.join(map(str, values))})")
                point[name] = value
            else:
                scale = _scale(space[name])
                point[name] = min(values, key=lambda v: abs(scale(float(v)) - scale(float(value))))
        return point


@dataclass(frozen=True)
class Outcome:
    """One real trial at a grid point: its objective (`score`) and the held-out accuracies it reported."""

    seed: int
    score: float
    accuracy: float
    seen_form_accuracy: float | None
    unseen_form_accuracy: float | None
    seconds: float
    run_id: str


@dataclass
class Table:
    """Outcomes by grid point (a tuple of the axes' values, in the grid's order)."""

    grid: Grid
    outcomes: dict[tuple[Any, ...], list[Outcome]] = field(default_factory=dict)

    def key(self, point: Mapping[str, Any]) -> tuple[Any, ...]:
        return tuple(point[name] for name in self.grid.axes)

    def add(self, point: Mapping[str, Any], outcome: Outcome) -> None:
        self.outcomes.setdefault(self.key(point), []).append(outcome)

    def has(self, point: Mapping[str, Any], seed: int) -> bool:
        return any(o.seed == seed for o in self.outcomes.get(self.key(point), ()))

    def missing(self, seeds: Sequence[int]) -> list[tuple[dict[str, Any], int]]:
        """The (point, seed) pairs without an outcome, seed by seed: a partly built table covers the whole grid
        once before it covers any point twice."""
        return [(point, seed) for seed in seeds for point in self.grid.points() if not self.has(point, seed)]

    def seeds(self) -> list[int]:
        """The seeds the table's trials ran with, in order."""
        return sorted({o.seed for outcomes in self.outcomes.values() for o in outcomes})

    def unanswered(self) -> list[dict[str, Any]]:
        """The grid points without any outcome: a query near one of them has nothing to answer with."""
        return [point for point in self.grid.points() if not self.outcomes.get(self.key(point))]

    def mean_score(self, key: tuple[Any, ...]) -> float:
        """The mean objective over the seeds at the grid point of `key`; raises TableError where it has none."""
        outcomes = self.outcomes.get(key)
        if not outcomes:
            raise TableError(f"the table has no outcome at {dict(zip(self.grid.axes, key, strict=True))}")
        return sum(o.score for o in outcomes) / len(outcomes)

    def query(self, params: Mapping[str, Any], space: Mapping[str, BaseDistribution], rng: random.Random) -> Outcome:
        """The outcome of a trial of `params`: the nearest grid point's, one of its seeds drawn by `rng`."""
        point = self.grid.nearest(params, space)
        outcomes = self.outcomes.get(self.key(point))
        if not outcomes:
            raise TableError(f"the table has no outcome at {point}: build it first")
        return rng.choice(sorted(outcomes, key=lambda o: o.seed))

    def save(self, path: Path) -> None:
        """The table as CSV, one row per outcome, grid points in order; written whole to a temporary file first."""
        rows = [
            {**dict(zip(self.grid.axes, key, strict=True)), **_row(outcome)}
            for key in (self.key(p) for p in self.grid.points())
            for outcome in sorted(self.outcomes.get(key, ()), key=lambda o: o.seed)
        ]
        partial = path.with_name(path.name + ".partial")
        with partial.open("w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=[*self.grid.axes, *OUTCOME_COLUMNS])
            writer.writeheader()
            writer.writerows(rows)
        partial.replace(path)

    @classmethod
    def load(cls, path: Path, grid: Grid) -> Table:
        """The table at `path` (empty when there is none yet); raises TableError for a file of another grid."""
        table = cls(grid)
        if not path.exists():
            return table
        with path.open(newline="") as file:
            reader = csv.DictReader(file)
            expected = [*grid.axes, *OUTCOME_COLUMNS]
            if reader.fieldnames != expected:
                raise TableError(f"{path}: columns {reader.fieldnames} are not this grid's ({expected})")
            for line, row in enumerate(reader, start=2):
                point = {name: _on_axis(values, row[name], path, line) for name, values in grid.axes.items()}
                table.add(point, _outcome(row))
        return table


def _row(outcome: Outcome) -> dict[str, str]:
    def text(value: float | None) -> str:
        return "" if value is None else str(value)  # the shortest text that reads back as the same float

    return {
        "seed": str(outcome.seed),
        "score": text(outcome.score),
        "accuracy": text(outcome.accuracy),
        "seen_form_accuracy": text(outcome.seen_form_accuracy),
        "unseen_form_accuracy": text(outcome.unseen_form_accuracy),
        "seconds": f"{outcome.seconds:.0f}",  # whole seconds, as the build records them
        "run_id": outcome.run_id,
    }


def _outcome(row: Mapping[str, str]) -> Outcome:
    def number(name: str) -> float | None:
        return float(row[name]) if row[name] else None

    return Outcome(
        seed=int(row["seed"]),
        score=float(row["score"]),
        accuracy=float(row["accuracy"]),
        seen_form_accuracy=number("seen_form_accuracy"),
        unseen_form_accuracy=number("unseen_form_accuracy"),
        seconds=float(row["seconds"]),
        run_id=row["run_id"],
    )


def _on_axis(values: Iterable[Any], text: str, path: Path, line: int) -> Any:
    """The axis value a CSV cell spells (CSV keeps only text)."""
    for value in values:
        if str(value) == text or (not isinstance(value, str) and _same_number(value, text)):
            return value
    raise TableError(f"{path}:{line}: {text!r} is not a value of the grid")


def _same_number(value: object, text: str) -> bool:
    try:
        return math.isclose(float(value), float(text), rel_tol=1e-9)  # type: ignore[arg-type]
    except ValueError:
        return False


def _scale(distribution: BaseDistribution) -> Callable[[float], float]:
    if isinstance(distribution, FloatDistribution | IntDistribution) and distribution.log:
        return math.log
    return lambda value: value


def _contains(distribution: BaseDistribution, value: Any) -> bool:
    if isinstance(distribution, CategoricalDistribution):
        return value in distribution.choices
    if isinstance(distribution, FloatDistribution | IntDistribution):
        return distribution.low <= value <= distribution.high
    return False
