"""Trials as Kubernetes Jobs, against a local stand-in of the `batch/v1` Jobs API (tests/support/kube_stand_in.py):
no cluster can be reached from here, so the API server is the boundary; the client, the executor, the controller, the
trial processes (the stand-in's "pods") and the backend they train on are all real.
"""

from __future__ import annotations

import math
import re
import threading
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from support.kube_stand_in import JobsApi, jobs_api
from support.loopback import free_port
from support.studies import tiny_spec
from support.trial_phases import wait_for_phase

from autoresearch.controller import Controller
from autoresearch.controller_state import open_controller_state
from autoresearch.errors import ExecutorError
from autoresearch.executors import TrialPhase
from autoresearch.executors.kubernetes import KubernetesExecutor, job_name, label_value
from autoresearch.spec import KubernetesExecutorSettings, StudySpec
from autoresearch.study import open_study
from autoresearch.trials.config import TrialConfig

NAMESPACE = "rl-posttrain"
SECRETS = {"rl-posttrain": {"api-key": "tml-from-the-secret"}}
SETTINGS = KubernetesExecutorSettings(
    kind="kubernetes",
    image="rl-posttrain:test",
    namespace=NAMESPACE,
    runs_claim="runs",
    api_key_secret="rl-posttrain",
    service_account="autoresearch-trial",
    backoff_limit=0,
)


def executor_for(api: JobsApi, tmp_path: Path, deadline_s: float = 600, **changes: object) -> KubernetesExecutor:
    settings = SETTINGS.model_copy(update=changes)
    return KubernetesExecutor(
        settings, "study", tmp_path / "trials", tmp_path, deadline_s, api=api.client(), first_backoff_s=0.05
    )


def test_a_trial_job_runs_to_its_result_and_is_made_once(
    backend_url: str, tiny_trial_config: TrialConfig, tmp_path: Path
) -> None:
    with jobs_api(tmp_path, SECRETS) as api:
        executor = executor_for(api, tmp_path, deadline_s=599.5)
        assert executor.status("t-0").phase is TrialPhase.NOT_STARTED
        executor.launch("t-0", tiny_trial_config, backend_url)
        executor.launch("t-0", tiny_trial_config, backend_url)  # a second controller's launch: already running
        done = wait_for_phase(executor, "t-0", {TrialPhase.FINISHED, TrialPhase.FAILED})
        assert done.phase is TrialPhase.FINISHED, done.failure
        executor.launch("t-0", tiny_trial_config, backend_url)  # finished: not run again

    assert done.result.run_id == "t-0" and set(done.evaluations) == {0, 2, 3}
    (job,) = api.created
    assert job["metadata"]["name"] == "trial-t-0"
    labels = job["metadata"]["labels"]
    assert labels["rl-posttrain/study"] == "study" and labels["rl-posttrain/run-id"] == "t-0"
    spec = job["spec"]
    assert spec["backoffLimit"] == 0 and spec["activeDeadlineSeconds"] == 600
    assert spec["ttlSecondsAfterFinished"] == SETTINGS.ttl_seconds_after_finished
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["serviceAccountName"] == "autoresearch-trial"
    assert pod["volumes"] == [{"name": "runs", "persistentVolumeClaim": {"claimName": "runs"}}]
    (container,) = pod["containers"]
    assert container["image"] == "rl-posttrain:test"
    assert container["volumeMounts"] == [{"name": "runs", "mountPath": str(tmp_path)}]
    assert container["command"][:3] == ["python", "-m", "autoresearch.trials"]
    assert container["command"][container["command"].index("--backend-url") + 1] == backend_url
    assert {"name": "TINKER_API_KEY", "valueFrom": {"secretKeyRef": {"name": "rl-posttrain", "key": "api-key"}}} in (
        container["env"]
    )
    assert container["resources"]["requests"] == {"cpu": SETTINGS.cpu, "memory": SETTINGS.memory}


def test_a_failed_pod_fails_the_job_past_its_backoff_limit_and_is_retried_within_it(
    backend_url: str, tiny_trial_config: TrialConfig, tmp_path: Path
) -> None:
    with jobs_api(tmp_path, SECRETS) as api:
        strict = executor_for(api, tmp_path, backoff_limit=0)
        strict.launch("no-retry", tiny_trial_config, backend_url)
        wait_for_phase(strict, "no-retry", {TrialPhase.RUNNING})
        api.kill_pod(NAMESPACE, "trial-no-retry")
        failed = wait_for_phase(strict, "no-retry", {TrialPhase.FAILED, TrialPhase.FINISHED})
        assert failed.phase is TrialPhase.FAILED
        assert "failed (BackoffLimitExceeded)" in failed.failure
        assert f"kubectl logs -n {NAMESPACE} job/trial-no-retry" in failed.failure

        forgiving = executor_for(api, tmp_path, backoff_limit=1)
        forgiving.launch("one-retry", tiny_trial_config, backend_url)
        wait_for_phase(forgiving, "one-retry", {TrialPhase.RUNNING})
        api.kill_pod(NAMESPACE, "trial-one-retry")
        # The Job starts a second pod, which resumes the trial from its run directory and checkpoint.
        done = wait_for_phase(forgiving, "one-retry", {TrialPhase.FAILED, TrialPhase.FINISHED})
        assert done.phase is TrialPhase.FINISHED, done.failure


def test_a_job_over_its_deadline_fails_with_that_reason(tiny_trial_config: TrialConfig, tmp_path: Path) -> None:
    # Pointed at a port nobody listens on, the trial keeps retrying its backend until the deadline kills it.
    with jobs_api(tmp_path, SECRETS) as api:
        executor = executor_for(api, tmp_path, deadline_s=1.5)
        executor.launch("slow", tiny_trial_config, f"http://127.0.0.1:{free_port()}")
        assert api.created[0]["spec"]["activeDeadlineSeconds"] == math.ceil(1.5)
        failed = wait_for_phase(executor, "slow", {TrialPhase.FAILED, TrialPhase.FINISHED}, timeout=60)
    assert failed.phase is TrialPhase.FAILED
    assert "exceeded the trial time limit (the Job's activeDeadlineSeconds)" in failed.failure


def test_a_job_deleted_from_under_the_controller_is_reported_dead_and_a_relaunch_resumes_it(
    backend_url: str, tiny_trial_config: TrialConfig, tmp_path: Path
) -> None:
    with jobs_api(tmp_path, SECRETS) as api:
        executor = executor_for(api, tmp_path)
        executor.launch("gone", tiny_trial_config, backend_url)
        wait_for_phase(executor, "gone", {TrialPhase.RUNNING})
        api.delete_from_under(NAMESPACE, "trial-gone")
        died = executor.status("gone")
        assert died.phase is TrialPhase.DIED and "was deleted before the trial wrote a result" in died.failure
        executor.launch("gone", tiny_trial_config, backend_url)
        done = wait_for_phase(executor, "gone", {TrialPhase.FAILED, TrialPhase.FINISHED})
    assert done.phase is TrialPhase.FINISHED, done.failure
    assert len(api.created) == 2


def test_a_briefly_unavailable_api_is_retried(backend_url: str, tiny_trial_config: TrialConfig, tmp_path: Path) -> None:
    with jobs_api(tmp_path, SECRETS) as api:
        executor = executor_for(api, tmp_path)
        api.unavailable_for = 3  # the first three tries to read the Job get 503; the fourth gets through
        executor.launch("t", tiny_trial_config, backend_url)
        assert executor.status("t").phase in (TrialPhase.RUNNING, TrialPhase.FINISHED)
        executor.stop("t")
    assert len(api.created) == 1


def test_an_unreachable_api_fails_the_call_clearly_and_the_trial_with_the_reason(
    backend_url: str, tiny_trial_config: TrialConfig, tmp_path: Path
) -> None:
    with jobs_api(tmp_path, SECRETS) as api:
        api.unavailable_for = 1000
        executor = executor_for(api, tmp_path)
        executor.attempts = 3
        with pytest.raises(ExecutorError, match=r"Kubernetes API at http://127\.0\.0\.1:\d+ failed 3 tries: 503"):
            executor.launch("t", tiny_trial_config, backend_url)

        spec = cluster_spec(tmp_path, [backend_url], budget={"trials": 1, "steps_per_trial": 1})
        study = open_study(spec)
        run_controller(spec, study, executor, tmp_path)
    (trial,) = study.get_trials(deepcopy=False)
    assert trial.state is TrialState.FAIL
    failure = trial.user_attrs["failure"]
    assert re.search(r"could not launch: could not read Job trial-\S+: the Kubernetes API at \S+ failed 3", failure)


def cluster_spec(tmp_path: Path, backends: list[str], **changes: object) -> StudySpec:
    return tiny_spec(tmp_path, backends, executor=SETTINGS.model_dump(mode="json"), pruning={"kind": "none"}, **changes)


def run_controller(spec: StudySpec, study: optuna.Study, executor: KubernetesExecutor, tmp_path: Path) -> None:
    controller = Controller(spec, study, executor, None, spec.backend_urls, poll_s=0.2)
    with open_controller_state(spec.storage_url(), tmp_path) as checkpointer:
        controller.run(checkpointer)


def test_a_study_runs_its_trials_as_jobs_spread_over_the_backends(backend_url: str, tmp_path: Path) -> None:
    # Two endpoints of one server: the controller cannot tell, and each trial must stay with the one it was given.
    backends = [backend_url, backend_url.replace("127.0.0.1", "localhost")]
    spec = cluster_spec(
        tmp_path, backends, budget={"trials": 3, "concurrency": 2, "steps_per_trial": 2, "trial_time_limit_s": 300}
    )
    with jobs_api(tmp_path, SECRETS) as api:
        executor = KubernetesExecutor(
            spec.executor, spec.study, tmp_path / "trials", tmp_path, spec.budget.trial_time_limit_s, api=api.client()
        )
        study = open_study(spec)
        run_controller(spec, study, executor, tmp_path)

    trials = study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3
    assert [job["metadata"]["name"] for job in api.created] == [job_name(t.user_attrs["run_id"]) for t in trials]
    # The first two start together, one on each backend; the third goes where fewer trials run.
    assert {trials[0].user_attrs["backend_url"], trials[1].user_attrs["backend_url"]} == set(backends)
    for trial, job in zip(trials, api.created, strict=True):
        command = job["spec"]["template"]["spec"]["containers"][0]["command"]
        assert command[command.index("--backend-url") + 1] == trial.user_attrs["backend_url"]
        assert job["metadata"]["labels"]["rl-posttrain/study"] == spec.study


def test_job_names_and_labels_are_valid_and_distinct_for_any_study_name() -> None:
    long_study = "A.Study_name-" + "x" * 70
    names = {job_name(f"{long_study}-{i:04d}") for i in range(3)}
    assert len(names) == 3
    assert all(re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", name) for name in names)
    assert job_name("text2sql-gemma-0003") == "trial-text2sql-gemma-0003"
    assert label_value("text2sql-gemma") == "text2sql-gemma"
    long_label = label_value(long_study)
    assert len(long_label) <= 63 and re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", long_label)
    assert long_label != label_value(long_study + "y")


def test_jobs_that_fail_or_vanish_end_in_the_right_optuna_states(backend_url: str, tmp_path: Path) -> None:
    spec = cluster_spec(
        tmp_path, [backend_url], budget={"trials": 3, "concurrency": 3, "steps_per_trial": 1, "trial_time_limit_s": 300}
    )
    failing, vanishing = job_name(f"{spec.study}-0000"), job_name(f"{spec.study}-0001")
    with jobs_api(tmp_path, SECRETS) as api:
        disturbed: set[str] = set()
        stop = threading.Event()

        def disturb() -> None:
            # What a cluster does to a study now and then: a pod killed (out of memory), a Job deleted by a person.
            while not stop.wait(0.05) and len(disturbed) < 2:
                if failing not in disturbed and (NAMESPACE, failing) in api.jobs:
                    api.kill_pod(NAMESPACE, failing)
                    disturbed.add(failing)
                if vanishing not in disturbed and (NAMESPACE, vanishing) in api.jobs:
                    api.delete_from_under(NAMESPACE, vanishing)
                    disturbed.add(vanishing)

        disturber = threading.Thread(target=disturb, daemon=True)
        disturber.start()
        executor = KubernetesExecutor(
            spec.executor, spec.study, tmp_path / "trials", tmp_path, spec.budget.trial_time_limit_s, api=api.client()
        )
        study = open_study(spec)
        try:
            run_controller(spec, study, executor, tmp_path)
        finally:
            stop.set()
            disturber.join(5)

    failed, relaunched, untouched = study.get_trials(deepcopy=False)
    assert failed.state is TrialState.FAIL and "failed (BackoffLimitExceeded)" in failed.user_attrs["failure"]
    assert relaunched.state is TrialState.COMPLETE and relaunched.user_attrs["relaunches"] == 1
    assert untouched.state is TrialState.COMPLETE and "relaunches" not in untouched.user_attrs
    assert [job["metadata"]["name"] for job in api.created].count(vanishing) == 2


def test_an_api_lost_while_a_trial_runs_fails_it_saying_so(backend_url: str, tmp_path: Path) -> None:
    spec = cluster_spec(tmp_path, [backend_url], budget={"trials": 1, "steps_per_trial": 1})
    with jobs_api(tmp_path, SECRETS) as api:
        executor = executor_for(api, tmp_path)
        executor.attempts = 3

        def lose_the_api_once_the_job_runs() -> None:
            while not api.created:
                time.sleep(0.02)
            api.unavailable_for = 10_000

        lost = threading.Thread(target=lose_the_api_once_the_job_runs, daemon=True)
        lost.start()
        study = open_study(spec)
        run_controller(spec, study, executor, tmp_path)
        lost.join()
    (trial,) = study.get_trials(deepcopy=False)
    assert trial.state is TrialState.FAIL
    assert re.search(
        r"lost track of the trial: could not read Job \S+: the Kubernetes API .* failed 3", trial.user_attrs["failure"]
    )
