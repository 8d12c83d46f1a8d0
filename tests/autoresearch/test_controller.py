"""The controller end to end on the tiny model: a scripted LLM proposes, trials run on a real backend, Optuna keeps
the study; and a controller killed mid-run finishes the budget when started again, losing and repeating nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState
from optuna_dashboard import get_note
from pydantic import ValidationError
from support.process_trees import NEEDS_PROC, alive, listening_ports, port_free, wait_until_gone
from support.scripted_llm import ScriptedLlm
from support.studies import run_study_with_a_real_llm, run_study_with_llm, tiny_spec

from autoresearch.attributes import SHARED_WARMUP_PREFIX, SharedWarmup, StudyAttributes
from autoresearch.controller import RELAUNCHES, Controller
from autoresearch.controller_state import open_controller_state
from autoresearch.executors import LocalExecutor
from autoresearch.executors.local import PID_FILE
from autoresearch.proposer import LlmProposer
from autoresearch.search import distributions
from autoresearch.shared_warmup import shared_warmup_run_id
from autoresearch.spec import StudySpec
from autoresearch.study import open_study
from autoresearch.trials.config import TrialConfig
from autoresearch.trials.run_dir import RunDirectory
from autoresearch.trials.start_evaluations import FOLDER_NAME

ROOT = Path(__file__).resolve().parents[2]


PROPOSAL = {
    "candidates": [
        {
            "params": {"learning_rate": 0.003, "batch_size": 1, "loss": "ppo"},
            "reward_weights": {"format": 0.3, "length_penalty": 0.0},
            "rationale": "PPO + fmt",
        },
        {
            "params": {"learning_rate": 0.001, "batch_size": 2, "loss": "importance_sampling"},
            "reward_weights": {"format": 0.0, "length_penalty": 0.1},
            "rationale": "batch 2",
        },
    ]
}
# The scripted server does not constrain its replies to the schema: a reward component the study does not search
# makes the reply invalid, and the round's rejection names it.
OUTSIDE_THE_SPACE = {
    "candidates": [
        {
            "params": {"learning_rate": 0.001, "batch_size": 2, "loss": "ppo"},
            "reward_weights": {"format": 0.0, "length_penalty": 0.1, "style_points": 1.0},
            "rationale": "reward style",
        }
    ]
}


def proposing_spec(tmp_path: Path, llm: ScriptedLlm, budget: dict, **llm_settings: object) -> StudySpec:
    """The tiny spec with `llm` proposing, for a round of proposals only: it reaches no backend."""
    scripted = {"base_url": llm.url, "model": "scripted", "api_key_env": "SCRIPTED_LLM_KEY", **llm_settings}
    return tiny_spec(tmp_path, "http://127.0.0.1:9", llm=scripted, budget=budget)


def test_a_study_runs_its_budget_with_llm_proposals_rejections_pruning_and_notes(
    backend_url: str, tmp_path: Path, llm: ScriptedLlm
) -> None:
    llm.say(PROPOSAL)
    llm.default_proposal = json.dumps(OUTSIDE_THE_SPACE)
    llm.default_analysis = "PPO with a format bonus did no better; the tiny model cannot write SQL."
    spec = tiny_spec(
        tmp_path,
        backend_url,
        llm={"base_url": llm.url, "model": "scripted", "api_key_env": "SCRIPTED_LLM_KEY", "max_retries": 0},
        pruning={"kind": "threshold", "lower": 0.5, "warmup_steps": 1},
        objective={"metric": "unseen_form_accuracy"},
    )
    study = run_study_with_llm(spec, backend_url, tmp_path)

    trials = study.get_trials(deepcopy=False)
    assert any(t.state is TrialState.PRUNED for t in trials)
    # Judged on the questions of forms training never shows: each finished trial's value is its unseen-form score,
    # and every trial that evaluated shows both forms' accuracy.
    for trial in trials:
        if trial.state is TrialState.COMPLETE:
            result = RunDirectory(tmp_path / "trials" / trial.user_attrs["run_id"]).read_result()
            assert trial.values == [result.held_out_by_form["unseen"]]
        if trial.intermediate_values:
            assert set(trial.user_attrs["held_out_by_form"]) == {"seen", "unseen"}
    first = trials[0]
    assert first.user_attrs["source"] == "llm" and first.user_attrs["rationale"] == "PPO + fmt"
    assert first.params["loss"] == "ppo" and first.params["reward.format"] == 0.3
    assert json.loads(first.user_attrs["reward_spec"])["components"][1] == {"kind": "format", "weight": 0.3}
    assert all(t.user_attrs["rationale"] for t in trials)
    rejected = study.user_attrs["rejected_proposals"]
    assert any("reward_weights.style_points" in reason for reason in rejected), rejected
    # The LLM's turns are 30% of the trials, the first always (trials 0 and 3 at seed 0): its malformed reply for
    # trial 3 left that trial to TPE, which says why.
    assert [t.user_attrs["source"] for t in trials] == ["llm", "sampler", "sampler", "sampler"]
    assert trials[3].user_attrs["llm_fallback"].startswith("malformed: the LLM's proposal is not valid")
    assert "PPO with a format bonus did no better" in get_note(study)


def test_a_candidate_that_repeats_a_trial_or_another_candidate_is_rejected_by_name(
    tmp_path: Path, llm: ScriptedLlm
) -> None:
    """A trial's seed is fixed, so a repeat of an earlier trial's values would retrace its run: the LLM's repeat of
    trial 0, and its second copy of a new candidate, are rejected with what they repeat; the new one is queued."""
    first, second = PROPOSAL["candidates"]
    llm.say({"candidates": [first, second, second]})
    budget = {"trials": 4, "concurrency": 3, "steps_per_trial": 1, "candidates_per_round": 3}
    spec = proposing_spec(tmp_path, llm, budget, max_retries=0)
    study = open_study(spec)
    ran = {**first["params"], **{f"reward.{kind}": w for kind, w in first["reward_weights"].items()}}
    study.add_trial(optuna.trial.create_trial(params=ran, distributions=distributions(spec), values=[0.25]))
    controller = Controller(spec, study, LocalExecutor(tmp_path / "trials"), LlmProposer(spec.llm), [llm.url])
    controller.propose({"round": 0, "analysed": 0})

    queued = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert [t.user_attrs["rationale"] for t in queued] == ["batch 2"]
    rejected = StudyAttributes.of(study).rejected_proposals
    assert len(rejected) == 2, rejected
    assert "'PPO + fmt' rejected: it repeats trial 0's parameters" in rejected[0]
    assert "'batch 2' rejected: it repeats candidate 2 of this round's parameters" in rejected[1]


def test_each_llm_trial_carries_its_own_rationale_tied_to_the_trials_it_read(tmp_path: Path, llm: ScriptedLlm) -> None:
    """The LLM is shown the best and latest trials, with their scores, curves and rationales; each candidate names
    the trials it builds on and gives its own reason, and its trial shows that reason with those trials' scores."""
    first, second = PROPOSAL["candidates"]
    llm.say(
        {
            "candidates": [
                {**first, "based_on": [0], "rationale": "#0's PPO scored best; a format bonus on top"},
                {**second, "based_on": [1, 0], "rationale": "#1 learnt nothing at batch 1; batch 2 instead"},
            ]
        }
    )
    budget = {"trials": 4, "concurrency": 2, "steps_per_trial": 1, "candidates_per_round": 2}
    spec = proposing_spec(tmp_path, llm, budget, share=1.0)
    study = open_study(spec)
    for values, score, rationale in [("ppo", 0.25, "try PPO"), ("importance_sampling", 0.125, "the default")]:
        params = {"learning_rate": 0.001, "batch_size": 1, "loss": values, "reward.format": 0.0}
        params["reward.length_penalty"] = 0.0
        study.add_trial(
            optuna.trial.create_trial(
                params=params,
                distributions=distributions(spec),
                values=[score],
                intermediate_values={0: 0.0, 1: score},
                user_attrs={"rationale": rationale, "source": "llm"},
            )
        )
    controller = Controller(spec, study, LocalExecutor(tmp_path / "trials"), LlmProposer(spec.llm), [llm.url])
    controller.propose({"round": 0, "analysed": 0})

    request = llm.requests[0]
    prompt = request["messages"][-1]["content"]
    assert "The best trials so far" in prompt and "The latest trials:" in prompt
    assert "#0 COMPLETE acc=0.250 curve=[0:0.00, 1:0.25]" in prompt and "rationale='try PPO'" in prompt
    assert "#1 COMPLETE acc=0.125" in prompt and "rationale='the default'" in prompt
    # Under constrained decoding a candidate can cite only the trials the LLM was shown.
    based_on = request["response_format"]["json_schema"]["schema"]["$defs"]["ProposedCandidate"]["properties"]
    assert based_on["based_on"]["items"]["enum"] == [0, 1]
    queued = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert [t.user_attrs["rationale"] for t in queued] == [
        "#0's PPO scored best; a format bonus on top [builds on #0 (0.250)]",
        "#1 learnt nothing at batch 1; batch 2 instead [builds on #1 (0.125), #0 (0.250)]",
    ]
    assert [t.system_attrs["fixed_params"]["loss"] for t in queued] == ["ppo", "importance_sampling"]


def test_a_study_whose_llm_is_a_real_model_under_a_json_schema_finishes_its_budget(
    backend_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The LLM is the backend's own /v1 endpoint: the tiny random model writes every proposal, constrained to the
    proposal's JSON schema, so each reply parses. What it proposes is judged against the search space: a candidate
    that fits (a random model can write one, such as empty params and weights) runs as the LLM's trial, one that
    does not is recorded with its reason and TPE fills the slot."""
    # The tiny model's context (2048) holds the prompt (about 820 of its tokens) and this many more.
    run_study_with_a_real_llm(backend_url, backend_url, tmp_path, monkeypatch, max_tokens=256)


def count_ended(storage: str, study_name: str) -> int:
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:  # the controller has not created the study yet
        return 0
    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)))


def test_a_killed_controller_started_again_finishes_the_budget_without_repeating_or_losing_trials(
    backend_url: str, tmp_path: Path
) -> None:
    spec = tiny_spec(
        tmp_path,
        backend_url,
        pruning={"kind": "none"},
        budget={"trials": 4, "concurrency": 2, "steps_per_trial": 3, "trial_time_limit_s": 300},
    )
    command = controller_command(spec, tmp_path)
    env = {**os.environ, "TINKER_TELEMETRY": "0"}
    first = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + 240
    while count_ended(spec.storage, spec.study) < 1:
        assert first.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)  # the controller; its trials end with it (their lifelines)
    first.wait()
    assert count_ended(spec.storage, spec.study) < spec.budget.trials

    again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]

    study = optuna.load_study(study_name=spec.study, storage=spec.storage)
    trials = study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * spec.budget.trials
    run_ids = [t.user_attrs["run_id"] for t in trials]
    assert run_ids == [f"{spec.study}-{i:04d}" for i in range(spec.budget.trials)]
    trial_dirs = sorted(p.name for p in (tmp_path / "runs" / spec.study / "trials").iterdir() if p.name != FOLDER_NAME)
    assert trial_dirs == run_ids
    assert all((tmp_path / "runs" / spec.study / "trials" / r / "result.json").exists() for r in run_ids)
    summary = json.loads((tmp_path / "runs" / spec.study / "summary" / "summary.json").read_text())
    # The base model was scored once, on the trials' held-out questions, before the first trial.
    assert summary["baseline"] == study.user_attrs["baseline_accuracy"] and 0.0 <= summary["baseline"] <= 1.0
    # What RL added over its warm-up: from the evaluation where RL started (step 0) to the final score, on each
    # trial for the dashboard and in the summary.
    for trial in trials:
        assert trial.user_attrs["held_out_at_rl_start"] == trial.intermediate_values[0]
        assert trial.user_attrs["rl_gain"] == pytest.approx(trial.values[0] - trial.intermediate_values[0])
    by_number = {t.number: t for t in trials}
    for row in summary["best"]:
        assert row["rl_gain"] == pytest.approx(by_number[row["number"]].user_attrs["rl_gain"])
        assert row["held_out_at_rl_start"] == by_number[row["number"]].intermediate_values[0]


def controller_command(spec: StudySpec, tmp_path: Path) -> list[str]:
    """The command that runs `spec`'s study (written to tmp_path/spec.yaml) with its runs under tmp_path/runs."""
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    run_root = tmp_path / "runs"
    return [
        sys.executable, "-m", "autoresearch", str(spec_path), "--run-root", str(run_root), "--no-progress", "--poll-s",
        "0.2",
    ]  # fmt: skip


@pytest.mark.slow
def test_a_trial_outlasts_more_controller_stops_than_it_has_relaunches(backend_url: str, tmp_path: Path) -> None:
    """A long study is stopped and started again many times while one trial runs: each stop ends the trial's process
    with the controller's, which is no fault of the trial's, so the next controller resumes it without counting a
    relaunch (which a trial that dies on its own gets only RELAUNCHES of before it fails)."""
    spec = tiny_spec(
        tmp_path,
        backend_url,
        pruning={"kind": "none"},
        budget={"trials": 1, "concurrency": 1, "steps_per_trial": 2, "trial_time_limit_s": 300},
    )
    command = controller_command(spec, tmp_path)
    pid_file = tmp_path / "runs" / spec.study / "trials" / f"{spec.study}-0000" / PID_FILE
    env = {**os.environ, "TINKER_TELEMETRY": "0"}
    trial_pids: list[int] = []
    for _ in range(RELAUNCHES + 1):
        controller = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        deadline = time.monotonic() + 120
        while not pid_file.exists() or json.loads(pid_file.read_text())["pid"] in trial_pids:
            assert controller.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        trial_pids.append(json.loads(pid_file.read_text())["pid"])
        os.killpg(controller.pid, signal.SIGKILL)
        controller.wait()
        wait_until_gone(trial_pids[-1:], within_s=35)  # the trial's lifeline ends it

    again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    (trial,) = optuna.load_study(study_name=spec.study, storage=spec.storage).get_trials(deepcopy=False)
    assert trial.state is TrialState.COMPLETE, trial.user_attrs.get("failure")
    assert "relaunches" not in trial.user_attrs
    assert len(set(trial_pids)) == RELAUNCHES + 1


def test_a_resumed_study_draws_new_values_instead_of_retracing_its_first_trials(tmp_path: Path) -> None:
    spec = tiny_spec(tmp_path, "local")
    first_run = open_study(spec)
    for value in (0.1, 0.2):
        first_run.tell(first_run.ask(distributions(spec)), value)
    drawn_before = [trial.params for trial in first_run.get_trials(deepcopy=False)]
    resumed = open_study(spec)  # the study's next run, on its storage
    assert resumed.ask(distributions(spec)).params not in drawn_before


def processes_mentioning(text: str) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in cmdline.read_bytes().decode(errors="replace"):
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


@pytest.mark.slow
@NEEDS_PROC
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=lambda signum: signum.name)
def test_a_controller_stopped_or_killed_leaves_neither_its_local_backend_nor_its_trials_running(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """SIGTERM (a CronJob's stop) unwinds the controller, which stops its local backend; SIGKILL leaves that to the
    lifelines of the backend and the trials. Either way they are gone within the backend's grace (30 s) and the
    backend's port is free; the next controller resumes the trials from their checkpoints."""
    spec = tiny_spec(tmp_path, "local", pruning={"kind": "none"})
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    runs = tmp_path / "runs"
    command = [sys.executable, "-m", "autoresearch", str(spec_path), "--run-root", str(runs), "--no-progress"]
    controller = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    backend_storage, trials = str(runs / spec.study / "backend"), str(runs / spec.study / "trials")
    deadline = time.monotonic() + 300
    # The checkpoint file is opened once the local backend answers: the controller is then in its loop.
    while not (runs / spec.study / "controller.sqlite3").exists() or not processes_mentioning(trials):
        assert controller.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    started = set(processes_mentioning(backend_storage)) | set(processes_mentioning(trials))
    ports = listening_ports(started)
    assert ports
    try:
        controller.send_signal(signum)
        assert controller.wait(60) == (128 + signal.SIGTERM if signum == signal.SIGTERM else -signal.SIGKILL)
        wait_until_gone(started, within_s=35)
        assert [port for port in ports if not port_free(port)] == []
    finally:
        for pid in filter(alive, started):
            os.kill(pid, signal.SIGKILL)


def test_a_trial_asked_but_never_launched_before_a_crash_is_recorded_and_run_by_the_next_controller(
    backend_url: str, tmp_path: Path
) -> None:
    spec = tiny_spec(tmp_path, backend_url, pruning={"kind": "none"}, budget={"trials": 1, "steps_per_trial": 2})
    study = open_study(spec)
    orphan = study.ask(distributions(spec))  # what a controller killed right after `ask` leaves behind
    assert orphan.user_attrs == {}
    controller = Controller(spec, study, LocalExecutor(tmp_path / "trials"), None, [backend_url], poll_s=0.2)
    with open_controller_state(spec.storage_url(), tmp_path) as checkpointer:
        controller.run(checkpointer)
    (trial,) = study.get_trials(deepcopy=False)
    assert trial.state is TrialState.COMPLETE
    assert trial.user_attrs["run_id"] == f"{spec.study}-0000" and trial.user_attrs["source"] == "sampler"
    assert json.loads(trial.user_attrs["trial_config"])["run_id"] == f"{spec.study}-0000"


class RecordingExecutor(LocalExecutor):
    """The real local executor, noting each run id it is asked to launch."""

    def __init__(self, run_root: Path) -> None:
        super().__init__(run_root)
        self.launched: list[str] = []

    def launch(self, run_id: str, config: TrialConfig, backend_url: str) -> None:
        self.launched.append(run_id)
        super().launch(run_id, config, backend_url)


def test_a_shared_warmup_runs_once_and_every_trial_starts_its_rl_from_it(backend_url: str, tmp_path: Path) -> None:
    trial = {**tiny_spec(tmp_path, backend_url).trial, "warmup_steps": 2, "warmup_batch_size": 2}
    budget = {"trials": 2, "concurrency": 2, "steps_per_trial": 1, "trial_time_limit_s": 300}
    spec = tiny_spec(tmp_path, backend_url, shared_warmup=True, trial=trial, pruning={"kind": "none"}, budget=budget)
    study = open_study(spec)
    executor = RecordingExecutor(tmp_path / "trials")
    with open_controller_state(spec.storage_url(), tmp_path) as checkpointer:
        Controller(spec, study, executor, None, [backend_url], poll_s=0.2).run(checkpointer)

    warmup_run = shared_warmup_run_id(spec, backend_url)
    assert executor.launched[0] == warmup_run and executor.launched.count(warmup_run) == 1
    warmup = StudyAttributes.of(study).shared_warmups[backend_url]
    warmup_result = json.loads((tmp_path / "trials" / warmup_run / "result.json").read_text())
    assert warmup.path == warmup_result["checkpoint_path"] and warmup.path.endswith("/weights/warmup-000002")
    assert warmup.examples_seen == 4 and warmup.held_out_accuracy == warmup_result["held_out_accuracy"]
    trials = study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2
    for each in trials:
        config = TrialConfig.model_validate_json(each.user_attrs["trial_config"])
        assert config.init_from == warmup.initial_state() and config.warmup_steps == 0
        assert RunDirectory(tmp_path / "trials" / each.user_attrs["run_id"]).warmup.read() == []

    # A controller run again with a larger budget reuses the warm-up the study recorded.
    more = spec.model_copy(update={"budget": spec.budget.model_copy(update={"trials": 3})})
    executor.launched.clear()
    with open_controller_state(spec.storage_url(), tmp_path) as checkpointer:
        Controller(more, study, executor, None, [backend_url], poll_s=0.2).run(checkpointer)
    assert executor.launched == [f"{spec.study}-0002"]
    assert len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))) == 3


def test_with_a_shared_warmup_new_trials_go_only_to_backends_that_hold_one(tmp_path: Path) -> None:
    # Two backends, of which only the second has its warm-up (the first was added to a resumed study): nothing is
    # launched here, so the URLs need no server behind them.
    urls = ["http://127.0.0.1:9/", "http://127.0.0.2:9/"]
    trial = {**tiny_spec(tmp_path, urls[0]).trial, "warmup_steps": 2, "warmup_batch_size": 2}
    spec = tiny_spec(tmp_path, urls, shared_warmup=True, trial=trial)
    study = open_study(spec)
    warmup = SharedWarmup(
        run_id="w", path="tinker://r:train:0/weights/warmup-000002", examples_seen=4, held_out_accuracy=0
    )
    study.set_user_attr(SHARED_WARMUP_PREFIX + urls[1], warmup.model_dump())
    controller = Controller(spec, study, LocalExecutor(tmp_path / "trials"), None, urls)
    assert controller._least_busy_backend() == urls[1]


def test_the_main_command_proposes_with_its_local_backends_own_model_and_reports_how_the_candidates_fared(
    tmp_path: Path,
) -> None:
    spec = tiny_spec(
        tmp_path,
        "local",
        base_model="tiny-qwen2",
        llm={"base_url": "local", "max_tokens": 256, "max_retries": 0},
        pruning={"kind": "none"},
        eval_size=2,
        budget={"trials": 2, "concurrency": 2, "steps_per_trial": 1, "trial_time_limit_s": 300},
    )
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True)))
    runs = tmp_path / "runs"
    command = [sys.executable, "-m", "autoresearch", str(spec_path), "--run-root", str(runs), "--no-progress"]
    # No key in the environment: the local backend's own /v1 needs none.
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "TINKER_BASE_URL")}
    finished = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stdout[-2000:] + finished.stderr[-2000:]
    assert "tiny-qwen2 on the local backend's" in finished.stdout

    summary = json.loads((runs / spec.study / "summary" / "summary.json").read_text())
    proposals = summary["llm_proposals"]
    # The tiny random model's answers fit the reply schema (constrained decoding) but not necessarily the search
    # space: every candidate it gave was either queued or rejected with its reason, and none went unaccounted.
    assert proposals["proposed"] >= 1 or proposals["rejected"]
    assert proposals["valid"] <= proposals["proposed"] and proposals["run"] <= proposals["valid"]
    study = optuna.load_study(study_name=spec.study, storage=spec.storage)
    trials = study.get_trials(deepcopy=False)
    assert sum(t.user_attrs["source"] == "llm" for t in trials) == proposals["run"]
    assert all(t.user_attrs["rationale"] for t in trials)
    assert {row["source"] for row in summary["best"]} <= {"llm", "sampler"}


def test_a_local_llm_needs_the_local_backend_and_an_endpoints_llm_needs_its_model(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"llm.base_url: 'local' is the /v1 of the backend"):
        tiny_spec(tmp_path, "http://10.0.0.5:8000", llm={"base_url": "local"})
    with pytest.raises(ValidationError, match=r"model: required for an endpoint's URL"):
        tiny_spec(tmp_path, "local", llm={"base_url": "http://10.0.0.5:8001/v1"})
    local = tiny_spec(tmp_path, "local", llm={"base_url": "local"}).llm
    assert local is not None
    served = local.served_by("http://127.0.0.1:4321", "tiny-qwen2")
    assert (served.base_url, served.model) == ("http://127.0.0.1:4321/v1", "tiny-qwen2")
