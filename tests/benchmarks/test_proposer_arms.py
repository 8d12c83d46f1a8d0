"""The proposer arms of the tabular benchmark (benchmarks/proposers/arms.py), their anytime curves and `compare`, on
a synthetic table built here over the main study's grid: test data with a known optimum, no trial trained.

The LLM arms' LLM is a remote model a test cannot run, so a scripted OpenAI-compatible server on loopback stands in
for it (`support.scripted_llm`), spoken to by the study's real `LlmProposer` and hybrid sampler: the mock is at the
LLM's boundary only."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
import torch
import yaml
from support.backends import GEMMA_CHAT_TEMPLATE, tiny_server_config
from support.scripted_llm import ScriptedLlm
from typer.testing import CliRunner

from autoresearch.hybrid_sampler import fallback_counts
from autoresearch.spec import LlmSettings, load_study_spec
from benchmarks import ROOT
from benchmarks.proposers.__main__ import app
from benchmarks.proposers.arms import Arm, ArmRun, Bench, answer_trials, llm_use, proposer_llm
from benchmarks.proposers.confirm import arm_choice, confirming_seed
from benchmarks.proposers.curves import AnytimeCurve, best_so_far, checkpoints
from benchmarks.proposers.grids import GRIDS
from benchmarks.proposers.records import load_records, records_path
from benchmarks.proposers.report import goal
from benchmarks.proposers.table import Outcome, Table
from trainer_backend.server import running_server

SPEC_PATH = ROOT / "experiments" / "text2sql.yaml"
SPEC = load_study_spec(SPEC_PATH)
GRID = GRIDS["text2sql-qwen"]
# The synthetic optimum: each axis has a best value, and the effects add up, so a sampler that learns finds it.
BEST = {"learning_rate": 4.5e-5, "temperature": 0.7, "loss": "ppo", "reward.result_overlap": 0.5}
OPTIMUM = 0.40


def synthetic_score(point: dict, seed: int) -> float:
    """0.20 plus 0.05 per axis at its best value; the second seed 0.01 lower, except at the optimum."""
    score = 0.20 + 0.05 * sum(point[name] == value for name, value in BEST.items())
    return score if score == OPTIMUM or seed == 0 else score - 0.01


def synthetic_table() -> Table:
    table = Table(GRID)
    for index, point in enumerate(GRID.points()):
        for seed in (0, 1):
            score = synthetic_score(point, seed)
            table.add(point, Outcome(seed, score, score, score, score, 60.0, f"point{index}-seed{seed}"))
    return table


BENCH = Bench.of(SPEC, synthetic_table())


def test_the_arms_search_only_the_grids_axes_and_the_llm_reads_the_grids_fixed_settings() -> None:
    assert list(BENCH.space) == list(GRID.axes)
    assert list(BENCH.spec.search_space.params) == ["learning_rate", "temperature", "loss"]
    assert list(BENCH.spec.search_space.reward.components) == ["result_overlap"]
    # The table's trials evaluated once, at the end.
    assert BENCH.spec.trial["eval_interval"] == 0


def test_random_search_starts_from_the_default_config_and_its_best_so_far_never_falls() -> None:
    # The base trial config's learning rate 1e-4 and temperature 1.0 lie nearest 2e-4 (log scale) and 1.2.
    default = {"learning_rate": 2.0e-4, "temperature": 1.2, "loss": "importance_sampling", "reward.result_overlap": 0.0}
    assert BENCH.default_point() == default
    run = Arm("random", BENCH).run(seed=0, trials=16)
    assert run.sources[0] == "default"
    assert run.values[0] in (synthetic_score(default, 0), synthetic_score(default, 1))
    curve = best_so_far(run.values)
    assert len(curve) == 16 and curve == sorted(curve)


def test_trials_carry_the_outcome_they_were_answered_with() -> None:
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=1))
    answer_trials(study, BENCH, 4, random.Random(1))
    for trial in study.trials:
        point = GRID.nearest(trial.params, BENCH.space)
        seed = trial.user_attrs["table_seed"]
        assert trial.value == synthetic_score(point, seed)
        assert trial.user_attrs["table_run_id"] == f"point{GRID.points().index(point)}-seed{seed}"


def test_tpe_reaches_a_clear_optimum_within_16_trials_at_its_median_seed() -> None:
    runs = [Arm("tpe", BENCH).run(seed, trials=16) for seed in range(8)]
    curve = AnytimeCurve.of("tpe", [run.values for run in runs])
    assert list(curve.median) == sorted(curve.median)
    assert curve.at(16)[0] == OPTIMUM
    assert curve.at(1)[0] < OPTIMUM


def test_the_bootstrap_interval_holds_the_median_and_is_the_same_on_every_run() -> None:
    rng = random.Random(5)
    values = [[rng.random() for _ in range(16)] for _ in range(5)]
    curve = AnytimeCurve.of("random", values)
    for count in range(1, 17):
        median, low, high = curve.at(count)
        assert low <= median <= high
    assert low < high
    assert AnytimeCurve.of("random", values) == curve
    assert checkpoints(16) == [1, 2, 4, 8, 16] and checkpoints(12) == [1, 2, 4, 8, 12]


def test_the_goal_compares_the_hybrid_at_8_trials_with_tpe_at_16() -> None:
    tpe = AnytimeCurve("tpe", 8, (0.3,) * 16, (0.3,) * 16, (0.3,) * 16)
    hybrid_ahead = AnytimeCurve("hybrid", 8, (0.2,) * 7 + (0.3,) * 9, (0.2,) * 16, (0.3,) * 16)
    hybrid_behind = AnytimeCurve("hybrid", 8, (0.2,) * 8 + (0.4,) * 8, (0.2,) * 16, (0.4,) * 16)
    assert "holds, 0.300 against 0.300" in goal([tpe, hybrid_ahead])
    assert "does not hold, 0.200 against 0.300" in goal([tpe, hybrid_behind])
    assert "not judged" in goal([tpe])


def candidate(learning_rate: float, temperature: float, loss: str, overlap: float, why: str) -> dict:
    params = {"learning_rate": learning_rate, "temperature": temperature, "loss": loss}
    return {"params": params, "reward_weights": {"result_overlap": overlap}, "rationale": why}


def test_the_hybrid_arm_asks_the_llm_on_its_turns_and_counts_a_malformed_reply_as_a_fallback(llm: ScriptedLlm) -> None:
    replies = [
        candidate(4.5e-5, 0.7, "ppo", 0.5, "the middle learning rate with PPO"),
        "Sure! Here are my candidates: learning_rate 1e-5",
        candidate(1.0e-5, 0.7, "ppo", 0.5, "a lower learning rate than the best"),
        candidate(2.0e-4, 0.7, "ppo", 0.5, "a higher learning rate than the best"),
        candidate(4.5e-5, 1.2, "ppo", 0.5, "a hotter sampling temperature"),
        candidate(4.5e-5, 0.7, "importance_sampling", 0.5, "the other loss"),
    ]
    llm.say(*({"candidates": [reply]} if isinstance(reply, dict) else reply for reply in replies))
    settings = LlmSettings(base_url=llm.url, model="scripted", api_key_env="SCRIPTED_LLM_KEY", max_retries=0)
    arm = Arm("hybrid", BENCH, settings)
    study, clock = arm.study(seed=0)
    answer_trials(study, BENCH, 16, random.Random(0))

    use = llm_use(study, clock)
    # The first trial is the LLM's turn; about 30% of the 16 are.
    assert study.trials[0].user_attrs["source"] == "llm"
    assert 4 <= use.turns <= 6
    assert use.calls == use.turns == len(llm.requests)
    assert fallback_counts(study) == {"malformed": 1} and use.failed == 1
    assert (use.proposed, use.valid) == (use.turns - 1, use.turns - 1)
    assert clock.seconds > 0
    proposed = [t for t in study.trials if t.user_attrs.get("source") == "llm"]
    assert proposed[0].params == BEST and proposed[0].value == OPTIMUM
    assert proposed[0].user_attrs["rationale"] == "the middle learning rate with PPO"
    # The LLM proposes the grid's axes only, and reads the optimizer's state: the best trials with their values.
    schema = llm.requests[0]["response_format"]["json_schema"]["schema"]
    assert set(schema["$defs"]["Params"]["properties"]) == {"learning_rate", "temperature", "loss"}
    assert set(schema["$defs"]["RewardWeights"]["properties"]) == {"result_overlap"}
    later = json.dumps(llm.requests[-1]["messages"])
    assert "The best trials so far" in later and f"acc={OPTIMUM:.3f}" in later


def test_an_llm_arm_without_an_llm_is_refused() -> None:
    with pytest.raises(ValueError, match="the llm arm needs an LLM"):
        Arm("llm", BENCH)


def test_an_llm_url_stands_in_for_the_local_backend_the_spec_would_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    with proposer_llm(SPEC, "http://127.0.0.1:8001/v1/") as (settings, key):
        assert (settings.base_url, settings.model, key) == ("http://127.0.0.1:8001/v1", SPEC.base_model, "tml-local")
        # The spec's own settings otherwise: its timeout, its token budget.
        assert (settings.timeout_s, settings.max_tokens) == (SPEC.llm.timeout_s, SPEC.llm.max_tokens)


def test_compare_without_a_table_names_the_build_command(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["compare", "--table", str(tmp_path / "none.csv"), "--arms", "tpe"])
    assert result.exit_code == 1
    assert "no table yet" in result.output
    assert f"python -m benchmarks.proposers build --spec {SPEC_PATH}" in result.output


def test_compare_on_a_partial_table_names_a_missing_point(tmp_path: Path) -> None:
    path = tmp_path / "partial.csv"
    table = synthetic_table()
    del table.outcomes[table.key(GRID.points()[-1])]
    table.save(path)
    result = CliRunner().invoke(app, ["compare", "--table", str(path), "--arms", "tpe"])
    assert result.exit_code == 1
    assert "no outcome at 1 of 24 grid points" in result.output and "reward.result_overlap=0.5" in result.output


def test_compare_runs_the_arms_prints_their_curves_and_writes_the_plot(tmp_path: Path) -> None:
    path, plot = tmp_path / "table.csv", tmp_path / "curves.png"
    synthetic_table().save(path)
    arguments = ["compare", "--table", str(path), "--arms", "random,tpe", "--seeds", "3", "--trials", "8"]
    result = CliRunner().invoke(app, [*arguments, "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    assert "8 trials" in result.output and "random" in result.output and "tpe" in result.output
    assert "goal" in result.output and "not judged" in result.output
    assert plot.read_bytes().startswith(b"\x89PNG")
    assert "command: python -m benchmarks.proposers" in result.output
    records = load_records(records_path(path))
    assert records is not None and records.arms() == ["random", "tpe"] and len(records.runs_of("tpe")) == 3
    assert all(len(run.params) == len(run.values) == 8 for run in records.runs)


def test_an_arm_run_again_replaces_its_runs_and_keeps_the_others_until_the_table_changes(tmp_path: Path) -> None:
    path = tmp_path / "table.csv"
    synthetic_table().save(path)
    plot = ["--plot", str(tmp_path / "curves.png"), "--trials", "4"]
    CliRunner().invoke(app, ["compare", "--table", str(path), "--arms", "random,tpe", "--seeds", "3", *plot])
    result = CliRunner().invoke(app, ["compare", "--table", str(path), "--arms", "tpe", "--seeds", "2", *plot])
    assert result.exit_code == 0, result.output
    assert "with the earlier runs of random" in result.output
    records = load_records(records_path(path))
    assert records is not None and [len(records.runs_of(arm)) for arm in ("random", "tpe")] == [3, 2]
    # Another table (a seed more at one point): what ran against the old one no longer counts.
    table = synthetic_table()
    table.add(GRID.points()[0], Outcome(2, 0.3, 0.3, 0.3, 0.3, 60.0, "point0-seed2"))
    table.save(path)
    result = CliRunner().invoke(app, ["compare", "--table", str(path), "--arms", "tpe", "--seeds", "2", *plot])
    assert result.exit_code == 0, result.output
    assert "dropped the earlier runs of random" in result.output
    records = load_records(records_path(path))
    assert records is not None and records.arms() == ["tpe"]


def test_seeds_run_at_once_give_the_runs_they_give_one_after_another(tmp_path: Path) -> None:
    path = tmp_path / "table.csv"
    synthetic_table().save(path)
    arguments = ["compare", "--table", str(path), "--arms", "random,tpe", "--seeds", "3", "--trials", "6"]
    recorded = []
    for parallel in ("1", "3"):
        result = CliRunner().invoke(app, [*arguments, "--parallel", parallel, "--plot", str(tmp_path / "curves.png")])
        assert result.exit_code == 0, result.output
        records = load_records(records_path(path))
        assert records is not None
        recorded.append(records.runs)
    assert recorded[0] == recorded[1] and [run.seed for run in recorded[1]] == [0, 1, 2, 0, 1, 2]


def test_an_arm_settles_on_the_point_most_of_its_seeds_ended_at_ties_going_to_the_higher_table_mean() -> None:
    optimum, neighbour = dict(BEST), {**BEST, "loss": "importance_sampling"}

    def ending_at(point: dict, seed: int) -> ArmRun:
        start = GRID.points()[0]
        return ArmRun("tpe", seed, (start, point), (0.2, synthetic_score(point, 0)), ("sampler", "sampler"))

    choice = arm_choice("tpe", [ending_at(neighbour, 0), ending_at(neighbour, 1), ending_at(optimum, 2)], BENCH)
    assert (choice.point, choice.chosen_by, choice.seeds) == (neighbour, 2, 3)
    assert choice.table_mean == pytest.approx((synthetic_score(neighbour, 0) + synthetic_score(neighbour, 1)) / 2)
    tie = arm_choice("tpe", [ending_at(neighbour, 0), ending_at(optimum, 1)], BENCH)
    assert (tie.point, tie.chosen_by, tie.table_mean) == (optimum, 1, OPTIMUM)
    # The table has seeds 0 and 1: the confirming trials run at 2.
    assert confirming_seed(BENCH) == 2


def test_confirm_names_the_compare_command_without_runs_and_after_the_table_changed(tmp_path: Path) -> None:
    path = tmp_path / "table.csv"
    synthetic_table().save(path)
    result = CliRunner().invoke(app, ["confirm", "--table", str(path)])
    assert result.exit_code == 1
    assert "no arms' runs to confirm" in result.output
    assert f"python -m benchmarks.proposers compare --spec {SPEC_PATH}" in result.output
    plot = ["--plot", str(tmp_path / "curves.png"), "--trials", "4", "--seeds", "1"]
    CliRunner().invoke(app, ["compare", "--table", str(path), "--arms", "tpe", *plot])
    table = synthetic_table()
    del table.outcomes[table.key(GRID.points()[0])][1]
    table.save(path)
    result = CliRunner().invoke(app, ["confirm", "--table", str(path)])
    assert result.exit_code == 1
    assert "changed since the arms ran against it" in result.output and "compare --spec" in result.output


@pytest.fixture(scope="module")
def tiny_llm_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The tiny random model's /v1, with a chat template, standing in for the study's proposer model."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    config = tiny_server_config(tmp_path_factory.mktemp("backend"), chat_template=GEMMA_CHAT_TEMPLATE)
    try:
        with running_server(config) as server:
            yield f"{server.url}/v1"
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
def test_compare_reaches_a_real_model_at_the_llm_url_for_the_llm_arm(tmp_path: Path, tiny_llm_url: str) -> None:
    """The main spec with the tiny model as its LLM: each of its replies follows the proposal's schema, so a turn runs
    the LLM's candidate, or falls back for a candidate refused or a reply cut off, never because the endpoint was
    unreachable or refused the request (a wrong URL, key or model would make it 'down'). The tiny model's context
    (2048 tokens) holds the main study's prompt after two trials (about 1,900 tokens) and 96 more, not a third."""
    data = yaml.safe_load(SPEC_PATH.read_text())
    data["llm"].update(model="tiny-gemma3", max_tokens=96, max_retries=0)
    spec_path, table_path, plot = tmp_path / "text2sql.yaml", tmp_path / "table.csv", tmp_path / "curves.png"
    spec_path.write_text(yaml.safe_dump(data))
    synthetic_table().save(table_path)
    arguments = ["--spec", str(spec_path), "--table", str(table_path), "--arms", "llm", "--seeds", "2", "--trials", "2"]
    arguments += ["--parallel", "2"]  # the two seeds' calls reach the server together
    result = CliRunner().invoke(app, ["compare", *arguments, "--llm-url", tiny_llm_url, "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    assert "the LLM's proposals" in result.output
    assert "down" not in result.output and "slow" not in result.output
    assert plot.exists()
