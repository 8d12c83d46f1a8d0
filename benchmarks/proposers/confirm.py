"""Confirming the arms' answers with real trials: each arm's best configuration (the grid point most of its seeds
ended on) is trained again at a seed the table has not seen, beside the default configuration at the same seed, and
the two held-out evaluations are compared question by question (McNemar's exact test). A table answers with the
seeds it holds; this says whether what an arm found holds on a fresh one, and whether it beats the defaults."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoresearch.trials.backend import backend_for
from autoresearch.trials.paired import PairedComparison, compare
from benchmarks.proposers.arms import ArmRun, Bench
from benchmarks.proposers.build import run_grid_trial
from benchmarks.proposers.table import Outcome
from tasks.report import HeldOutReport, ScoreName

# The question form each objective is scored on (None: every question).
OBJECTIVE_FORMS: dict[ScoreName, str | None] = {"held_out_accuracy": None, "unseen_form_accuracy": "unseen"}


@dataclass(frozen=True)
class ArmChoice:
    """The configuration an arm settles on: the grid point the most of its seeds' best trials lie at (ties: the
    higher table mean), how many of its seeds did, and the table's mean objective there."""

    arm: str
    point: dict[str, Any]
    chosen_by: int
    seeds: int
    table_mean: float


@dataclass(frozen=True)
class RealTrial:
    """A configuration trained for real at the confirming seed: its outcome and its last evaluation."""

    point: dict[str, Any]
    outcome: Outcome
    report: HeldOutReport


@dataclass(frozen=True)
class Confirmation:
    """An arm's choice, its real trial and that trial against the default configuration's, question by question."""

    choice: ArmChoice
    trial: RealTrial
    against_default: PairedComparison


def arm_choice(arm: str, runs: Sequence[ArmRun], bench: Bench) -> ArmChoice:
    """The configuration `arm` settles on over its `runs` (one per seed)."""
    table, space = bench.table, bench.space
    points = [table.grid.nearest(run.best_params, space) for run in runs]
    counts = Counter(table.key(point) for point in points)
    key = max(counts, key=lambda k: (counts[k], table.mean_score(k)))
    point = next(p for p in points if table.key(p) == key)
    return ArmChoice(arm, point, counts[key], len(runs), table.mean_score(key))


def confirming_seed(bench: Bench) -> int:
    """The first seed no trial of the table ran with."""
    return max(bench.table.seeds()) + 1


def confirm(
    choices: Sequence[ArmChoice],
    bench: Bench,
    run_dir: Path,
    backend_url: str | None = None,
    on_trial: Callable[[Mapping[str, Any], Outcome], None] = lambda point, outcome: None,
) -> tuple[RealTrial, list[Confirmation]]:
    """Train the default configuration and each distinct choice at the confirming seed (one real trial each, one at a
    time on one backend: a local one without `backend_url`; trials already run are read back) and compare each choice's
    evaluation with the default's on the objective's questions. Returns the default's trial and the confirmations."""
    spec, table, seed = bench.spec, bench.table, confirming_seed(bench)
    default = bench.default_point()
    points = {table.key(point): point for point in [default, *(choice.point for choice in choices)]}
    trials: dict[tuple[Any, ...], RealTrial] = {}
    with backend_for(spec.base_model, backend_url, run_dir / "backend") as url:
        for key, point in points.items():
            outcome, report = run_grid_trial(spec, table.grid, point, seed, url, run_dir)
            trials[key] = RealTrial(point, outcome, report)
            on_trial(point, outcome)
    form = OBJECTIVE_FORMS[spec.objective.metric]
    baseline = trials[table.key(default)]
    confirmations = [
        Confirmation(choice, trial, compare(baseline.report, trial.report, form))
        for choice in choices
        for trial in [trials[table.key(choice.point)]]
    ]
    return baseline, confirmations
