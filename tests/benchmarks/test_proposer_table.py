"""The tabular benchmark's grid and table (benchmarks/proposers/table.py), and its build of real trials on the tiny
model (benchmarks/proposers/build.py): every grid point run once per seed, a stopped build going on where it
stopped."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml
from support.backends import tiny_server_config

from autoresearch.search import distributions
from autoresearch.spec import load_study_spec
from autoresearch.trials.config import TrialConfig
from benchmarks import ROOT
from benchmarks.proposers.arms import Bench
from benchmarks.proposers.build import build_table, grid_run_id
from benchmarks.proposers.confirm import ArmChoice, confirm
from benchmarks.proposers.grids import GRIDS
from benchmarks.proposers.table import Grid, Outcome, Table, TableError
from trainer_backend.server import running_server

MAIN_SPEC = load_study_spec(ROOT / "experiments" / "text2sql.yaml")
SPACE = distributions(MAIN_SPEC)
GRID = GRIDS["text2sql-qwen"]


def outcome(seed: int, score: float) -> Outcome:
    return Outcome(seed, score, score + 0.1, None, score, 60.0, f"run-{seed}")


def test_the_main_grid_fits_the_main_study_and_covers_every_combination_once() -> None:
    GRID.check(SPACE)
    points = GRID.points()
    assert len(points) == 3 * 2 * 2 * 2
    assert len({tuple(p.values()) for p in points}) == len(points)


def test_a_grid_outside_the_space_is_refused_by_name() -> None:
    with pytest.raises(TableError, match="'batch_size' is not searched"):
        Grid(axes={"batch_size": (8,)}).check(SPACE)
    with pytest.raises(TableError, match=r"learning_rate=0\.1 is outside"):
        Grid(axes={"learning_rate": (0.1,)}).check(SPACE)


def test_a_query_takes_the_nearest_point_on_each_axis_own_scale() -> None:
    # 2.4e-5 is nearer 1e-5 than 4.5e-5 on a linear scale but nearer 4.5e-5 on the log scale the space searches.
    query = {"learning_rate": 2.4e-5, "temperature": 1.0, "loss": "ppo", "reward.result_overlap": 0.1}
    assert GRID.nearest(query, SPACE) == {
        "learning_rate": 4.5e-5,
        "temperature": 1.2,
        "loss": "ppo",
        "reward.result_overlap": 0.0,
    }
    assert GRID.nearest({**query, "learning_rate": 1.9e-5}, SPACE)["learning_rate"] == 1.0e-5
    with pytest.raises(TableError, match="no value for the grid's axis 'loss'"):
        GRID.nearest({k: v for k, v in query.items() if k != "loss"}, SPACE)


def test_a_query_draws_one_of_the_points_seeds_and_names_a_point_without_any(tmp_path: Path) -> None:
    table = Table(GRID)
    point = GRID.points()[0]
    table.add(point, outcome(0, 0.25))
    table.add(point, outcome(1, 0.5))
    drawn = {table.query(point, SPACE, random.Random(seed)).score for seed in range(20)}
    assert drawn == {0.25, 0.5}
    with pytest.raises(TableError, match=r"no outcome at .*build it first"):
        table.query(GRID.points()[1], SPACE, random.Random(0))


def test_the_table_survives_its_csv_and_says_what_is_missing_seed_by_seed(tmp_path: Path) -> None:
    path = tmp_path / "table.csv"
    table = Table(GRID)
    first, second = GRID.points()[:2]
    table.add(first, outcome(0, 0.25))
    table.add(second, Outcome(0, 0.5, 0.45, 0.4, 0.5, 61.0, "run-b"))
    table.save(path)
    loaded = Table.load(path, GRID)
    assert loaded.outcomes == {
        loaded.key(first): [outcome(0, 0.25)],
        loaded.key(second): [Outcome(0, 0.5, 0.45, 0.4, 0.5, 61.0, "run-b")],
    }
    missing = loaded.missing([0, 1])
    assert len(missing) == 2 * len(GRID.points()) - 2
    # Seed 0 everywhere before seed 1 anywhere.
    assert [seed for _, seed in missing] == sorted(seed for _, seed in missing)
    assert (first, 0) not in missing and (first, 1) in missing


def test_a_table_of_another_grid_is_refused_with_its_columns(tmp_path: Path) -> None:
    path = tmp_path / "table.csv"
    Table(Grid(axes={"learning_rate": (1.0e-5,)})).save(path)
    with pytest.raises(TableError, match="are not this grid's"):
        Table.load(path, GRID)


def test_run_ids_name_the_point_and_seed_in_the_characters_run_ids_allow() -> None:
    run_ids = {grid_run_id(MAIN_SPEC, point, seed) for point in GRID.points() for seed in (0, 1)}
    assert len(run_ids) == 2 * len(GRID.points())
    assert grid_run_id(MAIN_SPEC, GRID.points()[0], 1) == "text2sql-qwen-grid-1e-05_0.7_importance_sampling_0.0-seed1"
    for run_id in run_ids:
        TrialConfig(run_id=run_id)  # raises on a run id trials refuse


@pytest.fixture(scope="module")
def backend_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # beside another xdist worker on 2 cores
    try:
        with running_server(tiny_server_config(tmp_path_factory.mktemp("backend"))) as server:
            yield server.url
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
def test_the_build_runs_each_missing_trial_once_and_a_second_build_runs_none(tmp_path: Path, backend_url: str) -> None:
    spec = load_study_spec(ROOT / "experiments" / "text2sql_tiny.yaml")
    grid = Grid(axes={"loss": ("importance_sampling", "ppo")}, fixed={"learning_rate": 1.0e-3, "batch_size": 1})
    path = tmp_path / "table.csv"
    told: list[tuple[dict, int]] = []

    def tell(point: dict, _: Outcome, left: int) -> None:
        told.append((point, left))

    table = build_table(spec, grid, [0], path, tmp_path / "runs", backend_url, on_outcome=tell)
    assert told == [({"loss": "importance_sampling"}, 1), ({"loss": "ppo"}, 0)]
    assert Table.load(path, grid).outcomes == table.outcomes
    for point in grid.points():
        (only,) = table.outcomes[table.key(point)]
        assert only.run_id == grid_run_id(spec, point, 0)
        assert 0.0 <= only.score <= 1.0 and only.seconds > 0
        # The trial ran the grid's values, evaluating at the end only.
        config = yaml.safe_load((tmp_path / "runs" / only.run_id / "config.yaml").read_text())
        assert (config["loss"], config["learning_rate"], config["seed"], config["eval_interval"]) == (
            point["loss"],
            1.0e-3,
            0,
            0,
        )
    build_table(spec, grid, [0], path, tmp_path / "runs", backend_url, on_outcome=tell)
    assert len(told) == 2


@pytest.mark.slow
def test_confirm_trains_each_choice_and_the_default_at_a_fresh_seed_and_compares_them(
    tmp_path: Path, backend_url: str
) -> None:
    spec = load_study_spec(ROOT / "experiments" / "text2sql_tiny.yaml")
    grid = Grid(axes={"loss": ("importance_sampling", "ppo")}, fixed={"learning_rate": 1.0e-3, "batch_size": 1})
    runs = tmp_path / "runs"
    table = build_table(spec, grid, [0], tmp_path / "table.csv", runs, backend_url)
    bench = Bench.of(spec, table)
    assert bench.default_point() == {"loss": "importance_sampling"}
    choices = [
        ArmChoice("tpe", {"loss": "ppo"}, 2, 3, 0.5),
        ArmChoice("hybrid", {"loss": "ppo"}, 1, 1, 0.5),
    ]
    trained: list[dict] = []
    baseline, confirmations = confirm(choices, bench, runs, backend_url, lambda point, _: trained.append(dict(point)))
    # The default and the one distinct choice, each once, at the seed after the table's.
    assert trained == [{"loss": "importance_sampling"}, {"loss": "ppo"}]
    default_run_id = grid_run_id(spec, {"loss": "importance_sampling"}, 1)
    assert (baseline.outcome.seed, baseline.outcome.run_id) == (1, default_run_id)
    for confirmation in confirmations:
        trial = confirmation.trial
        config = yaml.safe_load((runs / trial.outcome.run_id / "config.yaml").read_text())
        assert (config["loss"], config["seed"]) == ("ppo", 1)
        paired = confirmation.against_default
        assert paired.questions == len(trial.report.answers) == len(baseline.report.answers)
        assert paired.accuracy_after == pytest.approx(trial.report.accuracy)
        assert paired.accuracy_before == pytest.approx(baseline.report.accuracy)
    # Confirming again trains nothing: each trial's stored result is read back.
    results = sorted(runs.glob("*-seed1/result.json"))
    stamps = [path.stat().st_mtime_ns for path in results]
    again, _ = confirm(choices[:1], bench, runs, backend_url)
    assert again.outcome == baseline.outcome
    assert [path.stat().st_mtime_ns for path in results] == stamps
