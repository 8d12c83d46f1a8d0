"""Building the table: one real trial of the study spec per grid point and seed, on one backend, one at a time.

Each trial's run id names its point and seed, so a build stopped part-way (by `--hours`, Ctrl-C or a crash) goes on
where it stopped: finished trials are in the table, and a trial cut off resumes from its last checkpoint. Trials
evaluate once, at the end (`eval_interval: 0`): the table keeps the objective where RL ends.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from autoresearch.search import candidate_from_params, distributions, trial_config_of
from autoresearch.spec import StudySpec
from autoresearch.trials.backend import backend_for
from autoresearch.trials.rl_loop import run_trial
from autoresearch.trials.run_dir import RunDirectory
from benchmarks.proposers.table import Grid, Outcome, Table
from tasks.report import HeldOutReport

# Trial settings every grid trial shares besides the grid's: one evaluation, at the end.
GRID_TRIAL_SETTINGS: dict[str, Any] = {"eval_interval": 0}


def grid_run_id(spec: StudySpec, point: Mapping[str, Any], seed: int) -> str:
    """A run id of the study, the point's values in the grid's order and the seed (within a run id's 100 characters
    and the letters, digits, '.', '_' and '-' it allows)."""
    values = "_".join(str(value) for value in point.values())
    return re.sub(r"[^A-Za-z0-9._-]", "-", f"{spec.study}-grid-{values}-seed{seed}")[:100]


def build_table(
    spec: StudySpec,
    grid: Grid,
    seeds: Sequence[int],
    table_path: Path,
    run_dir: Path,
    backend_url: str | None = None,
    stop_at: float | None = None,
    on_outcome: Callable[[dict[str, Any], Outcome, int], None] = lambda point, outcome, left: None,
) -> Table:
    """Run the missing trials of `grid` × `seeds` and add each to the table at `table_path` as it finishes; stop
    before starting a trial once `stop_at` (epoch seconds) has passed. Without `backend_url` (or $TINKER_BASE_URL) a
    local backend serving the spec's base model is started for the build. `on_outcome` is told each new outcome and
    how many trials are left."""
    grid.check(distributions(spec))
    table = Table.load(table_path, grid)
    missing = table.missing(seeds)
    if not missing:
        return table
    with backend_for(spec.base_model, backend_url, run_dir / "backend") as url:
        for done, (point, seed) in enumerate(missing, start=1):
            if stop_at is not None and time.time() >= stop_at:
                break
            outcome, _ = run_grid_trial(spec, grid, point, seed, url, run_dir)
            table.add(point, outcome)
            table.save(table_path)
            on_outcome(point, outcome, len(missing) - done)
    return table


def run_grid_trial(
    spec: StudySpec, grid: Grid, point: Mapping[str, Any], seed: int, backend_url: str, run_dir: Path
) -> tuple[Outcome, HeldOutReport]:
    """One real trial of the spec at a grid point and seed (resumed, or its result read back, where its run exists),
    its outcome and its last evaluation, answer by answer."""
    run_id = grid_run_id(spec, point, seed)
    params = {**grid.fixed, **point, **GRID_TRIAL_SETTINGS, "seed": seed}
    config = trial_config_of(spec, candidate_from_params(params, "", "sampler"), run_id)
    result = run_trial(config, backend_url=backend_url, run_dir=run_dir, progress=False)
    outcome = Outcome(
        seed=seed,
        score=result.score(spec.objective.metric),
        accuracy=result.held_out_accuracy,
        seen_form_accuracy=result.held_out_by_form.get("seen"),
        unseen_form_accuracy=result.held_out_by_form.get("unseen"),
        seconds=float(round(result.wall_time_s)),
        run_id=run_id,
    )
    evaluations = RunDirectory(result.run_dir).evals.read()
    return outcome, HeldOutReport.model_validate(evaluations[-1])
