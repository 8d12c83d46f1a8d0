"""The live table and the summary say who proposed each trial: the LLM, TPE, or TPE in an LLM turn that fell back
(and why). The study is a plain Optuna one run by the hybrid sampler; its LLM is a scripted stand-in (the remote LLM
API is a boundary a test cannot reach): it answers its first call and is down after that."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
from optuna.distributions import FloatDistribution
from rich.console import Console

from autoresearch.hybrid_sampler import HybridSampler, OptimizerState, Suggestion
from autoresearch.view import trials_table, write_summary


def up_once(state: OptimizerState) -> list[Suggestion]:
    if state.recent:
        raise ConnectionError("connection refused")
    return [Suggestion({"x": 0.5}, "the middle first")]


def test_the_table_and_the_summary_say_who_proposed_each_trial_and_why_an_llm_turn_fell_back(tmp_path: Path) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = HybridSampler(up_once, llm_share=0.5, seed=0, search_space={"x": FloatDistribution(0, 1)})
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=4)
    who = ["llm", "tpe", "tpe (LLM down)", "tpe"]

    console = Console(width=400, record=True)
    console.print(trials_table(study))
    rows = [line for line in console.export_text().splitlines() if line.startswith("│")]
    assert [row.split("│")[4].strip() for row in rows] == who
    assert "the middle first" in rows[0] and "down: ConnectionError" in rows[2]

    summary = json.loads(write_summary(study, tmp_path, Console(width=400, record=True)).read_text())
    by_number = {row["number"]: row["proposed_by"] for row in summary["best"]}
    assert by_number == dict(enumerate(who))
    assert summary["llm_proposals"]["fallbacks"] == {"down": 1} and summary["llm_proposals"]["run"] == 1
    fallback = study.trials[2].user_attrs["llm_fallback"]
    assert fallback.startswith("down: ConnectionError: connection refused")
