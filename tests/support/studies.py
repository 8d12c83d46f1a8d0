"""Studies of the tiny spec (experiments/text2sql_tiny.yaml) as the controller tests run them: the spec with a test's
changes, and a study run to its end with an LLM proposer, scripted or real."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from autoresearch.controller import Controller
from autoresearch.controller_state import open_controller_state
from autoresearch.executors import LocalExecutor
from autoresearch.proposer import LlmProposer
from autoresearch.search import distributions
from autoresearch.spec import StudySpec
from autoresearch.study import open_study
from support.backends import REPOSITORY

TINY_SPEC = REPOSITORY / "experiments" / "text2sql_tiny.yaml"


def tiny_spec(tmp_path: Path, backend_url: str | list[str], **changes: object) -> StudySpec:
    """The tiny spec on `backend_url` (one URL or several), its Optuna storage a SQLite file in `tmp_path`."""
    data = yaml.safe_load(TINY_SPEC.read_text())
    data.update(backend=backend_url, storage=f"sqlite:///{tmp_path / 'optuna.db'}", **changes)
    return StudySpec.model_validate(data)


def run_study_with_llm(spec: StudySpec, backend_url: str, tmp_path: Path) -> optuna.Study:
    """Run the spec's study to its end with the LLM proposer; checks that it ran its budget, every trial to an end."""
    study = open_study(spec)
    executor = LocalExecutor(tmp_path / "trials")
    controller = Controller(spec, study, executor, LlmProposer(spec.llm), [backend_url], poll_s=0.2)
    with open_controller_state(spec.storage_url(), tmp_path) as checkpointer:
        controller.run(checkpointer)
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == spec.budget.trials
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    return study


def run_study_with_a_real_llm(
    llm_url: str, backend_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, max_tokens: int
) -> None:
    """A two-trial study whose LLM is a real model at `llm_url` (the tiny one, on a server that needs no key of
    ours or takes `tml-local`), asked under the proposal's JSON schema. Checks that the LLM's answers were used and
    each followed the schema: it parsed and was judged against the search space, or the model was still inside the
    schema when its token budget ran out; none was refused by the server or failed to parse."""
    monkeypatch.setenv("REAL_LLM_KEY", "tml-local")
    llm = {
        "base_url": f"{llm_url}/v1",
        "model": "tiny-gemma3",
        "api_key_env": "REAL_LLM_KEY",
        "max_retries": 0,
        "max_tokens": max_tokens,
    }
    budget = {**tiny_spec(tmp_path, backend_url).budget.model_dump(), "trials": 2, "steps_per_trial": 1}
    spec = tiny_spec(tmp_path, backend_url, llm=llm, budget=budget)
    study = run_study_with_llm(spec, backend_url, tmp_path)

    trials = study.get_trials(deepcopy=False)
    assert all(set(t.params) <= set(distributions(spec)) for t in trials)
    rejected = study.user_attrs.get("rejected_proposals", [])
    sources = [t.user_attrs["source"] for t in trials]
    # A candidate ran as the LLM's trial, or was rejected with a reason.
    assert rejected or "llm" in sources, (rejected, sources)
    assert all(" rejected: " in r or f"was cut off at {max_tokens} tokens" in r for r in rejected), rejected
    assert set(sources) <= {"llm", "sampler"}
