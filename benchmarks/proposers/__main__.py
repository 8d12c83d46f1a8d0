"""The proposers on a tabular benchmark of real trials: `build` runs the grid's trials once (resumable) and writes
the table; `compare` runs random search, TPE, the LLM alone and the hybrid sampler against it; `confirm` trains each
arm's best configuration again for real, at a fresh seed, beside the default one.

python -m benchmarks.proposers build [--spec experiments/text2sql.yaml] [--seeds 2] [--hours H]
python -m benchmarks.proposers compare [--spec experiments/text2sql.yaml] [--arms random,tpe,llm,hybrid] [--llm-url URL]
python -m benchmarks.proposers confirm [--spec experiments/text2sql.yaml]
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated, Any, NoReturn

import optuna
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from autoresearch.errors import ProposalError
from autoresearch.sdk_logging import quiet_sdk_logs
from autoresearch.spec import StudySpec, load_study_spec
from benchmarks import ROOT, command_line
from benchmarks.proposers.arms import (
    ARMS,
    LLM_SHARES,
    Arm,
    ArmRun,
    Bench,
    point_text,
    proposer_llm,
    seeds_of,
)
from benchmarks.proposers.build import build_table
from benchmarks.proposers.confirm import arm_choice, confirming_seed
from benchmarks.proposers.confirm import confirm as confirm_choices
from benchmarks.proposers.curves import AnytimeCurve, plot_curves
from benchmarks.proposers.grids import GRIDS, TABLES
from benchmarks.proposers.records import RecordError, load_records, record_runs, records_path, table_digest
from benchmarks.proposers.report import confirmation_table, curves_table, goal, llm_table
from benchmarks.proposers.table import Grid, Outcome, Table, TableError

MAIN_SPEC = ROOT / "experiments" / "text2sql.yaml"
PLOT = ROOT / "docs" / "proposers.png"
app = typer.Typer(add_completion=False, help=__doc__, rich_markup_mode=None)
console = Console()


@app.callback()
def proposers() -> None:
    """Proposers compared on a tabular benchmark of real trials."""


@app.command()
def build(
    spec_path: Annotated[Path, typer.Option("--spec", help="the study spec whose space the grid covers")] = MAIN_SPEC,
    seeds: Annotated[int, typer.Option(help="trials per grid point, seeds 0 to N-1")] = 2,
    hours: Annotated[float | None, typer.Option(help="start no trial after this many hours; rerun to go on")] = None,
    backend_url: Annotated[str | None, typer.Option(help="a running backend; default: a local one")] = None,
    run_dir: Annotated[Path, typer.Option(help="the trials' runs")] = ROOT / "runs" / "proposers",
) -> None:
    """Run the grid's missing trials, one at a time, adding each to the table as it finishes."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    quiet_sdk_logs()
    spec, grid = _spec_and_grid(spec_path)
    table_path = TABLES / f"{spec.study}.csv"
    missing = len(Table.load(table_path, grid).missing(range(seeds)))
    console.print(f"{spec.study}: {len(grid.points())} grid points × {seeds} seeds, {missing} trials to run")
    started = time.time()
    with Progress(
        TextColumn("trials"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    ) as progress:
        task = progress.add_task("trials", total=missing)

        def report(point: dict[str, Any], outcome: Outcome, left: int) -> None:
            progress.advance(task)
            progress.console.print(
                f"{point} seed {outcome.seed}: score {outcome.score:.3f}, accuracy {outcome.accuracy:.3f} "
                f"({outcome.seconds:.0f} s); {left} left"
            )

        table = build_table(
            spec,
            grid,
            range(seeds),
            table_path,
            run_dir,
            backend_url=backend_url,
            stop_at=None if hours is None else started + hours * 3600,
            on_outcome=report,
        )
    done = sum(len(outcomes) for outcomes in table.outcomes.values())
    total = len(grid.points()) * seeds
    console.print(f"{table_path}: {done} of {total} trials, {time.time() - started:.0f} s this run")


@app.command()
def compare(
    spec_path: Annotated[Path, typer.Option("--spec", help="the study spec whose table the arms query")] = MAIN_SPEC,
    arms: Annotated[
        list[str] | None,
        typer.Option(help="arms to run (repeat the option, or comma-separated); default: random, tpe, llm, hybrid"),
    ] = None,
    seeds: Annotated[int | None, typer.Option(help="seeds per arm; default 5, and 8 for tpe and hybrid")] = None,
    trials: Annotated[int, typer.Option(min=1, help="trials per seed")] = 16,
    parallel: Annotated[
        int,
        typer.Option(min=1, help="an arm's seeds run at once (an LLM arm's calls then reach its backend together)"),
    ] = 1,
    llm_url: Annotated[
        str | None, typer.Option(help="the LLM's OpenAI-compatible …/v1; default: the spec's (llm: local starts one)")
    ] = None,
    table_path: Annotated[Path | None, typer.Option("--table", help="default: the study's table of `build`")] = None,
    plot: Annotated[Path, typer.Option(help="where the anytime curves' PNG goes")] = PLOT,
) -> None:
    """Run each arm on the table over its seeds; print the anytime curves, the LLM's proposals and cost, the goal."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    quiet_sdk_logs()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec, grid = _spec_and_grid(spec_path)
    names = [name.strip() for option in arms or ARMS for name in option.split(",") if name.strip()]
    unknown = [name for name in names if name not in ARMS]
    if unknown or not names:
        raise typer.BadParameter(f"{', '.join(unknown) or 'none'}: the arms are {', '.join(ARMS)}", param_hint="--arms")
    path = table_path or TABLES / f"{spec.study}.csv"
    table = _complete_table(path, grid, f"python -m benchmarks.proposers build --spec {spec_path}")
    try:
        bench = Bench.of(spec, table)
    except TableError as error:
        _fail(str(error))
    records_file = records_path(path)
    try:
        load_records(records_file)
    except RecordError as error:
        _fail(str(error))
    uses_llm = any(name in LLM_SHARES for name in names)
    if uses_llm and spec.llm is None:
        _fail(f"{spec_path}: no llm: section, so the llm and hybrid arms have no LLM (or leave them out: --arms)")
    runs: list[ArmRun] = []
    with proposer_llm(spec, llm_url) if uses_llm else nullcontext((None, None)) as (settings, key):
        total = sum(len(seeds_of(name, seeds)) for name in names) * trials
        with Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
        ) as progress:
            task = progress.add_task("trials", total=total)
            for name in names:
                arm = Arm(name, bench, settings, key)
                arm_seeds = seeds_of(name, seeds)
                progress.update(task, description=name)

                def run(seed: int, arm: Arm = arm) -> ArmRun:
                    return arm.run(seed, trials, on_trial=lambda: progress.advance(task))

                with ThreadPoolExecutor(max_workers=min(parallel, len(arm_seeds))) as pool:
                    try:
                        runs += pool.map(run, arm_seeds)
                    except ProposalError as error:  # no key for the LLM's endpoint
                        _fail(str(error))
    records, dropped = record_runs(records_file, table_digest(path), trials, runs)
    if dropped:
        console.print(f"dropped the earlier runs of {', '.join(dropped)}: they queried another table or trial count")
    earlier = [arm for arm in records.arms() if arm not in names]
    curves = [AnytimeCurve.of(arm, [run.values for run in records.runs_of(arm)]) for arm in records.arms()]
    objective = spec.objective.metric
    console.print(curves_table(curves, objective))
    llm = llm_table(records.runs)
    if llm is not None:
        console.print(llm)
    console.print(goal(curves), soft_wrap=True)
    plot_curves(curves, plot, f"{spec.study}: proposers on {path.name} ({trials} trials)", objective)
    console.print(f"plot: {plot}", soft_wrap=True)
    console.print(f"runs: {records_file}" + (f" (with the earlier runs of {', '.join(earlier)})" if earlier else ""))
    console.print(command_line("benchmarks.proposers"), soft_wrap=True)


@app.command()
def confirm(
    spec_path: Annotated[Path, typer.Option("--spec", help="the study spec whose arms are confirmed")] = MAIN_SPEC,
    table_path: Annotated[Path | None, typer.Option("--table", help="default: the study's table of `build`")] = None,
    backend_url: Annotated[str | None, typer.Option(help="a running backend; default: a local one")] = None,
    run_dir: Annotated[Path, typer.Option(help="the trials' runs")] = ROOT / "runs" / "proposers",
) -> None:
    """Train each arm's best configuration of the last `compare` and the default one at a seed the table has not
    seen, and compare each with the default question by question."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    quiet_sdk_logs()
    spec, grid = _spec_and_grid(spec_path)
    path = table_path or TABLES / f"{spec.study}.csv"
    table = _complete_table(path, grid, f"python -m benchmarks.proposers build --spec {spec_path}")
    compare_command = f"python -m benchmarks.proposers compare --spec {spec_path}"
    try:
        bench = Bench.of(spec, table)
        records = load_records(records_path(path))
    except (TableError, RecordError) as error:
        _fail(str(error))
    if records is None:
        _fail(f"{records_path(path)}: no arms' runs to confirm; run the arms first: {compare_command}")
    if records.table_digest != table_digest(path):
        _fail(f"{path} changed since the arms ran against it; run them again: {compare_command}")
    choices = [arm_choice(arm, records.runs_of(arm), bench) for arm in records.arms()]
    distinct = {table.key(point) for point in [bench.default_point(), *(choice.point for choice in choices)]}
    seed = confirming_seed(bench)
    console.print(f"{len(choices)} arms, {len(distinct)} configurations with the default: real trials at seed {seed}")
    with Progress(
        TextColumn("trials"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    ) as progress:
        task = progress.add_task("trials", total=len(distinct))

        def report(point: Mapping[str, Any], outcome: Outcome) -> None:
            progress.advance(task)
            progress.console.print(f"{point_text(point)}: score {outcome.score:.3f} ({outcome.seconds:.0f} s)")

        baseline, confirmations = confirm_choices(choices, bench, run_dir, backend_url, on_trial=report)
    console.print(confirmation_table(bench, baseline, confirmations, spec.objective.metric))
    console.print(command_line("benchmarks.proposers"), soft_wrap=True)


def _spec_and_grid(spec_path: Path) -> tuple[StudySpec, Grid]:
    spec = load_study_spec(spec_path)
    grid = GRIDS.get(spec.study)
    if grid is None:
        raise typer.BadParameter(f"no grid for study {spec.study!r} (grids: {', '.join(GRIDS)})", param_hint="--spec")
    return spec, grid


def _complete_table(path: Path, grid: Grid, build_command: str) -> Table:
    """The table at `path` with an outcome at every grid point; else exits naming what is missing and the build."""
    if not path.exists():
        _fail(f"{path}: no table yet; build it first: {build_command}")
    try:
        table = Table.load(path, grid)
    except TableError as error:
        _fail(f"{error}; rebuild it: {build_command}")
    missing = table.unanswered()
    if missing:
        _fail(
            f"{path}: no outcome at {len(missing)} of {len(grid.points())} grid points (first: "
            f"{point_text(missing[0])}); finish it: {build_command}"
        )
    return table


def _fail(message: str) -> NoReturn:
    # Unwrapped, so that the command it names can be copied whole.
    console.print(f"error: {message}", style="red", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(1)


if __name__ == "__main__":
    app(prog_name="python -m benchmarks.proposers")
