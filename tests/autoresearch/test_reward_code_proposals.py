"""The LLM proposes reward functions as code: the controller admits the good one (stored as a study artifact, its hash
on the trial, loaded by hash into the trial's reward) and refuses the hostile ones with their reasons, while every
candidate's hyperparameters still run.

The LLM is scripted: a real OpenAI-compatible HTTP server on loopback that answers from a script (we cannot reach a
real LLM in a test), spoken to by the real client. The gate runs for real: the study's task on its bundled data,
DuckDB, and the code in sandboxed worker processes. The executor records the trial config it is asked to launch
instead of starting an RL run: the run is not under test here, the reward it would train on is.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from wsgiref.util import setup_testing_defaults

import optuna
import pytest
from optuna.artifacts import FileSystemArtifactStore, get_all_artifact_meta
from optuna.trial import TrialState
from optuna_dashboard import wsgi
from support.scripted_llm import scripted_llm
from support.studies import tiny_spec

from autoresearch.attributes import TrialAttributes
from autoresearch.controller import Controller
from autoresearch.executors import LocalExecutor
from autoresearch.proposer import LlmProposer
from autoresearch.reward_code import artifact_store_of
from autoresearch.search import distributions
from autoresearch.study import llm_proposal_counts
from autoresearch.study_sampler import study_sampler
from autoresearch.trials.config import TrialConfig
from tasks.reward_code.loading import sha256_of
from tasks.reward_code.sandbox import CodeLimits
from tasks.text2sql.reward.rewards import DEFAULT_REWARD_SPEC
from tasks.text2sql.task import Text2SqlTask

GOOD = (
    "def reward(completion, example, execution):\n"
    "    if execution['status'] != 'ok':\n"
    "        return -1.0\n"
    "    return 1.0 if execution['correct'] else 0.0\n"
)
# Each hostile function, and what its refusal says.
HOSTILE = {
    "def reward(c, e, x):\n    while True:\n        pass\n": "refused at the sandbox: on ",
    "import os\ndef reward(c, e, x):\n    return 0.0\n": "refused at the static check: line 1: importing 'os'",
    "def reward(c, e, x):\n    b = 'x' * (10 * 2**30)\n    return 0.0\n": "MemoryError: needed more than the 256 MiB",
    "def reward(c, e, x):\n    return float(len(open('/etc/passwd').read()))\n": "line 2: 'open' is not allowed",
    "def reward(c, e, x):\n    return 0.0 if x['correct'] else 1.0\n": (
        "refused at the gate: it does not rank right SQL above wrong: mean 0.000 on 8 right answers, 1.000 on 16 "
        "known-wrong ones"
    ),
}


def _candidate(index: int, source: str) -> dict:
    return {
        "params": {"learning_rate": 0.001 * (index + 1), "batch_size": 1, "loss": "ppo"},
        "reward_weights": {"format": 0.1, "length_penalty": 0.0},
        "rationale": f"candidate {index}",
        "reward_code": {"weight": 0.5, "source": source},
    }


def _get(app: Callable, path: str) -> bytes:
    """The body of a GET of `path` from a WSGI app; fails unless it answers 200."""
    environ: dict = {}
    setup_testing_defaults(environ)
    environ.update(PATH_INFO=path, QUERY_STRING="")
    statuses = []
    body = b"".join(app(environ, lambda status, headers, exc_info=None: statuses.append(status)))
    assert statuses == ["200 OK"], (statuses, body[:200])
    return body


class ConfigRecorder(LocalExecutor):
    """Takes the trial config of each launch and starts nothing."""

    def __init__(self, run_root: Path) -> None:
        super().__init__(run_root)
        self.configs: dict[str, TrialConfig] = {}

    def launch(self, run_id: str, config: TrialConfig, backend_url: str) -> None:
        self.configs[run_id] = config


@pytest.mark.slow  # the gate opens the task and runs six functions, one of them to its time limit: about 6-9 s
def test_the_llms_reward_code_is_admitted_or_refused_with_its_reason_and_the_controller_carries_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCRIPTED_LLM_KEY", "sk-test")
    sources = [GOOD, *HOSTILE]
    spec = tiny_spec(
        tmp_path,
        "http://127.0.0.1:9",  # proposing and admitting reach no backend
        llm={
            "base_url": "http://127.0.0.1:9/v1",
            "model": "scripted",
            "api_key_env": "SCRIPTED_LLM_KEY",
            "max_retries": 0,
            "share": 1.0,
        },
        search_space={
            **tiny_spec(tmp_path, "http://127.0.0.1:9").search_space.model_dump(exclude_none=True),
            "reward": {
                "components": {"format": {"low": 0.0, "high": 0.5}, "length_penalty": {"low": 0.0, "high": 0.2}},
                "code": {"low": 0.0, "high": 1.0},
            },
        },
        budget={"trials": 6, "concurrency": 6, "steps_per_trial": 1, "candidates_per_round": 6},
    )
    with scripted_llm() as llm:
        llm.say({"candidates": [_candidate(i, source) for i, source in enumerate(sources)]})
        spec = spec.model_copy(update={"llm": spec.llm.model_copy(update={"base_url": llm.url})})
        study = optuna.create_study(study_name=spec.study, storage=spec.storage_url(), direction="maximize")
        executor = ConfigRecorder(tmp_path / "trials")
        controller = Controller(spec, study, executor, LlmProposer(spec.llm), ["http://127.0.0.1:9"])
        controller.reward_code.limits = CodeLimits(cpu_s=1, wall_s=0.5)  # a loop is refused in half a second
        controller.propose({"round": 0, "analysed": 0})
        prompt = llm.requests[0]["messages"][-1]["content"]
    assert "def reward(completion, example, execution) -> float" in prompt

    # Every candidate's hyperparameters wait to run; only the first carries code.
    queued = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert [t.user_attrs["rationale"] for t in queued] == [f"candidate {i}" for i in range(6)]
    good = TrialAttributes.of(queued[0])
    assert good.reward_code_sha256 == sha256_of(GOOD) and good.reward_code_weight == 0.5
    for trial, reason in zip(queued[1:], HOSTILE.values(), strict=True):
        attributes = TrialAttributes.of(trial)
        assert attributes.reward_code_sha256 is None
        assert reason in attributes.reward_code_refused, attributes.reward_code_refused
    # The study's summary counts them and gives each refusal's reason.
    counted = llm_proposal_counts(study).reward_code
    assert (counted.proposed, counted.admitted) == (6, 1)
    assert all(reason in refusal for reason, refusal in zip(HOSTILE.values(), counted.refused, strict=True))

    # The admitted source is an artifact of the study, in the store beside its SQLite file, and optuna-dashboard
    # (its own WSGI app, started with that store as --artifact-dir) lists it on the study and serves it.
    (meta,) = get_all_artifact_meta(study)
    assert meta.artifact_id == good.reward_code_artifact and meta.filename.endswith(".py")
    dashboard = wsgi(spec.storage_url(), artifact_store=FileSystemArtifactStore(str(artifact_store_of(spec))))
    listed = json.loads(_get(dashboard, f"/api/studies/{study._study_id}"))["artifacts"]
    assert [a["artifact_id"] for a in listed] == [meta.artifact_id]
    assert _get(dashboard, f"/artifacts/{study._study_id}/{meta.artifact_id}").decode() == GOOD

    # Launched, the trial carries a copy of the code on its dashboard page, its reward holds the code by hash at its
    # weight, and scoring with it changes the rewards.
    trial = study.ask(distributions(spec))
    controller._start(trial)
    (copy,) = get_all_artifact_meta(trial)
    # A fresh dashboard app: one keeps the trials it read for two seconds.
    dashboard = wsgi(spec.storage_url(), artifact_store=FileSystemArtifactStore(str(artifact_store_of(spec))))
    shown = json.loads(_get(dashboard, f"/api/studies/{study._study_id}"))["trials"][0]["artifacts"]
    assert [a["artifact_id"] for a in shown] == [copy.artifact_id]
    assert _get(dashboard, f"/artifacts/{study._study_id}/{trial._trial_id}/{copy.artifact_id}").decode() == GOOD
    config = executor.configs[f"{spec.study}-0000"]
    code = json.loads(config.reward_spec.model_dump_json())["components"][-1]
    assert code["kind"] == "code" and code["weight"] == 0.5
    assert code["code"]["sha256"] == sha256_of(GOOD) and code["code"]["artifact_id"] == meta.artifact_id
    with Text2SqlTask.bundled() as task:
        example = task.split("train")[0]
        items = [(example, task.gold_completion(example)), (example, " SELECT nothing FROM nowhere;")]
        with_code = task.scorer.score_many(items, config.reward_spec)
        without = task.scorer.score_many(items, DEFAULT_REWARD_SPEC)
    assert [s.components["code"] for s in with_code] == [0.5, -0.5]
    assert [s.reward for s in with_code] != [s.reward for s in without]


def test_the_studys_sampler_takes_the_same_hyperparameters_with_new_reward_code_as_a_new_run(tmp_path: Path) -> None:
    spec = tiny_spec(tmp_path, "http://127.0.0.1:9", llm={"base_url": "http://127.0.0.1:9/v1", "model": "scripted"})
    study = optuna.create_study(direction="maximize")
    sampler = study_sampler(spec, study, LlmProposer(spec.llm, api_key="sk-test"))
    admitted = TrialAttributes(reward_code_sha256=sha256_of(GOOD), reward_code_weight=0.5).user_attrs()
    assert set(sampler.distinguishing_attrs) == set(admitted)
