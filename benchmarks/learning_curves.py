"""Held-out accuracy against samples seen, for one or more trials, from their run directories: where a recipe's curve
flattens, and how recipes of different sizes of step compare at the same cost.

Run: python -m benchmarks.learning_curves [NAME=]RUN_DIR [NAME=]RUN_DIR ... [--out curves.png]

Each run's logged evaluations (`evals.jsonl`) are set against the completions it had sampled for training by then
(RL steps × batch_size × group_size, from its `config.yaml`; a run resumed with more steps is one curve), each point
with its standard error (√(p(1−p)/n)). The table gives every point; the last line is the curves as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure
from rich.console import Console
from rich.table import Table

from autoresearch.trials.config import load_trial_config
from autoresearch.trials.run_dir import RunDirectory
from benchmarks import command_line
from benchmarks.paired_trials import EvaluationNotFoundError, parse_reference


@dataclass(frozen=True)
class CurvePoint:
    step: int
    samples: int
    accuracy: float
    standard_error: float


@dataclass(frozen=True)
class Curve:
    name: str
    split: str
    questions: int
    points: tuple[CurvePoint, ...]


def curve_of(argument: str) -> Curve:
    """The curve of the run `[NAME=]RUN_DIR` names.

    Raises:
        EvaluationNotFoundError: no run there, or one that has evaluated nothing.
    """
    name, path, step = parse_reference(argument)
    if step is not None:
        raise EvaluationNotFoundError(f"{argument}: a curve is the whole run; name its folder without @{step}")
    directory = RunDirectory(path)
    if not directory.config_path.exists() or not directory.evals.path.exists():
        raise EvaluationNotFoundError(f"{path}: no trial's config and evaluations here")
    config = load_trial_config(directory.config_path)
    records = directory.evals.read()
    if not records:
        raise EvaluationNotFoundError(f"{path}: the trial has not evaluated anything yet")
    per_step = config.batch_size * config.group_size
    points = []
    for record in records:
        questions = len(record["answers"])
        accuracy = record["accuracy"]
        points.append(
            CurvePoint(
                step=record["step"],
                samples=record["step"] * per_step,
                accuracy=accuracy,
                standard_error=math.sqrt(accuracy * (1 - accuracy) / questions) if questions else 0.0,
            )
        )
    return Curve(name or path.name, records[0]["split"], len(records[0]["answers"]), tuple(points))


def plot_curves(curves: list[Curve], path: Path) -> None:
    figure = Figure(figsize=(7, 4.5))
    axes = figure.subplots()
    for curve in curves:
        axes.errorbar(
            [p.samples for p in curve.points],
            [p.accuracy for p in curve.points],
            yerr=[p.standard_error for p in curve.points],
            marker="o",
            capsize=3,
            label=curve.name,
        )
    axes.set_xlabel("completions sampled for training")
    split = curves[0].split
    axes.set_ylabel(f"held-out accuracy ({split}, {curves[0].questions} questions, ± 1 s.e.)")
    axes.grid(alpha=0.3)
    axes.legend(loc="best")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="[NAME=]RUN_DIR")
    parser.add_argument("--out", type=Path, default=None, help="write the figure here (PNG)")
    args = parser.parse_args(argv)
    console = Console(width=140)
    try:
        curves = [curve_of(argument) for argument in args.runs]
    except EvaluationNotFoundError as error:
        console.print(f"[red]error:[/red] {error}")
        return 2
    table = Table(title="held-out accuracy against completions sampled for training")
    for column in ("run", "step", "samples", "accuracy", "± s.e."):
        table.add_column(column, justify="left" if column == "run" else "right")
    for curve in curves:
        for point in curve.points:
            table.add_row(
                curve.name, str(point.step), str(point.samples), f"{point.accuracy:.1%}", f"{point.standard_error:.1%}"
            )
    console.print(table)
    if args.out is not None:
        plot_curves(curves, args.out)
        console.print(f"figure: {args.out}")
    records = {c.name: [p.__dict__ for p in c.points] for c in curves}
    console.print(json.dumps(records), soft_wrap=True)
    console.print(command_line("benchmarks.learning_curves", argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
