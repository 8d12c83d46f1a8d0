"""Trials as Kubernetes Jobs, one per run id, in the controller's namespace.

Each Job runs the same command a local trial runs, in the project's image, with the runs volume mounted where the
controller has it, so the controller reads a trial's progress from its run directory as it does locally. The Job
API tells the rest: a Job that is active runs; one that failed (past its `backoffLimit`, or over its
`activeDeadlineSeconds`) failed for good; one that vanished before its trial wrote a result died, and a relaunch
resumes the trial from its last checkpoint. Calls to the API are retried with back-off; when it stays unreachable
the call fails with an `ExecutorError` that says so.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from urllib3.exceptions import HTTPError

from autoresearch.errors import ExecutorError
from autoresearch.executors.base import (
    TrialPhase,
    TrialStatus,
    read_progress,
    trial_command,
    write_launch_config,
)
from autoresearch.spec import KubernetesExecutorSettings
from autoresearch.trials.config import TrialConfig

log = logging.getLogger(__name__)

IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
PART_OF = "rl-posttrain"
STUDY_LABEL = "rl-posttrain/study"
RUN_LABEL = "rl-posttrain/run-id"
# Status codes worth another try: throttled, or the API server (or a proxy in front of it) in trouble.
TRANSIENT = {429, 500, 502, 503, 504}
# Written beside a trial's run files when its Job is created: a Job missing later was deleted, not never made.
JOB_MARKER = "job.name"

T = TypeVar("T")


class KubernetesExecutor:
    """Runs each trial as a Job; `run_root` must be on the volume `settings.runs_claim`, mounted at `mount_path`."""

    def __init__(
        self,
        settings: KubernetesExecutorSettings,
        study: str,
        run_root: Path,
        mount_path: Path,
        deadline_s: float,
        api: client.BatchV1Api | None = None,
        attempts: int = 5,
        first_backoff_s: float = 0.5,
    ) -> None:
        if not run_root.is_relative_to(mount_path):
            raise ValueError(f"the run root {run_root} is not under the runs volume's mount path {mount_path}")
        self.settings = settings
        self.study = study
        self.run_root = run_root
        self.mount_path = mount_path
        self.deadline_s = deadline_s
        self.api = api or client.BatchV1Api(_api_client())
        self.namespace = settings.namespace or _own_namespace()
        self.attempts = attempts
        self.first_backoff_s = first_backoff_s

    # --- the executor interface ----------------------------------------------------------------------------------

    def launch(self, run_id: str, config: TrialConfig, backend_url: str) -> None:
        """Create the trial's Job unless it runs or finished; a Job left from a dead attempt is replaced."""
        phase = self.status(run_id).phase
        if phase in (TrialPhase.RUNNING, TrialPhase.FINISHED):
            return
        name = job_name(run_id)
        if phase is not TrialPhase.NOT_STARTED:
            self._delete(name)
        root = self.run_root / run_id
        config_path = write_launch_config(root, config)
        command = trial_command("python", config_path, backend_url, self.run_root, run_id)
        job = self.job_manifest(name, run_id, command)
        self._call(f"create Job {name}", lambda: self._create_replacing(job))
        (root / JOB_MARKER).write_text(name)

    def status(self, run_id: str) -> TrialStatus:
        progress = read_progress(self.run_root / run_id)
        evaluations = progress.evaluations
        if progress.result is not None:
            return TrialStatus(TrialPhase.FINISHED, evaluations, result=progress.result)
        name = job_name(run_id)
        job = self._call(f"read Job {name}", lambda: self._read(name))
        if job is None:
            if (self.run_root / run_id / JOB_MARKER).exists():
                failure = f"its Job {self.namespace}/{name} was deleted before the trial wrote a result"
                return TrialStatus(TrialPhase.DIED, evaluations, failure=failure)
            return TrialStatus(TrialPhase.NOT_STARTED, evaluations)
        # A Job just created may have no status yet.
        job_status = job.status or client.V1JobStatus()
        started = job_status.start_time or job.metadata.creation_timestamp
        started_at = started.timestamp() if started is not None else None
        for condition in job_status.conditions or []:
            if condition.status != "True":
                continue
            if condition.type == "Failed":
                failure = _failure_of(condition, self.namespace, name)
                return TrialStatus(TrialPhase.FAILED, evaluations, failure=failure, started_at=started_at)
            if condition.type == "Complete":
                # The trial may have written its result and exited between the first look and the Job's read.
                result = read_progress(self.run_root / run_id).result
                if result is not None:
                    return TrialStatus(TrialPhase.FINISHED, evaluations, result=result)
                failure = (
                    f"Job {self.namespace}/{name} completed, but {self.run_root / run_id} holds no result: is the "
                    f"volume {self.settings.runs_claim} mounted at {self.mount_path} in the controller as well?"
                )
                return TrialStatus(TrialPhase.FAILED, evaluations, failure=failure, started_at=started_at)
        return TrialStatus(TrialPhase.RUNNING, evaluations, started_at=started_at)

    def stop(self, run_id: str) -> None:
        """Delete the trial's Job and its pods (pruned, or over its time limit); its checkpoints stay."""
        self._delete(job_name(run_id))

    # --- the Job ------------------------------------------------------------------------------------------------

    def job_manifest(self, name: str, run_id: str, command: list[str]) -> client.V1Job:
        """The Job that runs `command` for a trial."""
        labels = {
            "app.kubernetes.io/part-of": PART_OF,
            "app.kubernetes.io/component": "trial",
            STUDY_LABEL: label_value(self.study),
            RUN_LABEL: label_value(run_id),
        }
        env = []
        if self.settings.api_key_secret is not None:
            secret = client.V1SecretKeySelector(name=self.settings.api_key_secret, key="api-key")
            env.append(client.V1EnvVar(name="TINKER_API_KEY", value_from=client.V1EnvVarSource(secret_key_ref=secret)))
        container = client.V1Container(
            name="trial",
            image=self.settings.image,
            command=command,
            env=env,
            resources=client.V1ResourceRequirements(
                requests={"cpu": self.settings.cpu, "memory": self.settings.memory},
                limits={"memory": self.settings.memory},
            ),
            volume_mounts=[client.V1VolumeMount(name="runs", mount_path=str(self.mount_path))],
        )
        claim = client.V1PersistentVolumeClaimVolumeSource(claim_name=self.settings.runs_claim)
        pod = client.V1PodSpec(
            restart_policy="Never",
            service_account_name=self.settings.service_account,
            automount_service_account_token=False,
            containers=[container],
            volumes=[client.V1Volume(name="runs", persistent_volume_claim=claim)],
        )
        return client.V1Job(
            api_version="batch/v1",
            kind="Job",
            metadata=client.V1ObjectMeta(name=name, labels=labels, annotations={RUN_LABEL: run_id}),
            spec=client.V1JobSpec(
                backoff_limit=self.settings.backoff_limit,
                active_deadline_seconds=math.ceil(self.deadline_s),
                ttl_seconds_after_finished=self.settings.ttl_seconds_after_finished,
                template=client.V1PodTemplateSpec(metadata=client.V1ObjectMeta(labels=labels), spec=pod),
            ),
        )

    # --- API calls ----------------------------------------------------------------------------------------------

    def _read(self, name: str) -> client.V1Job | None:
        try:
            return self.api.read_namespaced_job(name, self.namespace)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def _create_replacing(self, job: client.V1Job) -> None:
        try:
            self.api.create_namespaced_job(self.namespace, job)
        except ApiException as error:
            # A Job of an earlier attempt still being deleted: the retry loop tries again.
            if error.status == 409:
                raise _ConflictError(error) from None
            raise

    def _delete(self, name: str) -> None:
        def delete() -> None:
            try:
                self.api.delete_namespaced_job(name, self.namespace, propagation_policy="Background")
            except ApiException as error:
                if error.status != 404:
                    raise

        self._call(f"delete Job {name}", delete)

    def _call(self, what: str, call: Callable[[], T]) -> T:
        """Run one API call, retrying with exponential back-off while the API is unreachable or busy."""
        backoff = self.first_backoff_s
        for attempt in range(1, self.attempts + 1):
            try:
                return call()
            except ApiException as error:
                if error.status not in TRANSIENT:
                    raise ExecutorError(f"Kubernetes refused to {what}: {error.status} {error.reason}") from None
                last = f"{error.status} {error.reason}"
            except _ConflictError as error:
                last = f"409 {error.error.reason} (an earlier Job of that name is still being deleted)"
            except HTTPError as error:
                last = str(error)
            if attempt < self.attempts:
                log.warning("could not %s (try %d of %d): %s", what, attempt, self.attempts, last)
                time.sleep(backoff)
                backoff *= 2
        host = self.api.api_client.configuration.host
        raise ExecutorError(f"could not {what}: the Kubernetes API at {host} failed {self.attempts} tries: {last}")


class _ConflictError(Exception):
    def __init__(self, error: ApiException) -> None:
        super().__init__(str(error))
        self.error = error


def _failure_of(condition: client.V1JobCondition, namespace: str, name: str) -> str:
    if condition.reason == "DeadlineExceeded":
        what = "exceeded the trial time limit (the Job's activeDeadlineSeconds)"
    else:
        what = f"failed ({condition.reason})"
    return f"Job {namespace}/{name} {what}: {condition.message}; its logs: kubectl logs -n {namespace} job/{name}"


def job_name(run_id: str) -> str:
    """A Job name for a run id: lower-case DNS label characters, at most 63, unique per run id."""
    return _dns_label(f"trial-{run_id}".lower())


def label_value(text: str) -> str:
    """A label value for any study name or run id: at most 63 of [A-Za-z0-9._-], unique per text."""
    return _dns_label(text, allowed=r"[^A-Za-z0-9._-]")


def _dns_label(text: str, allowed: str = r"[^a-z0-9-]") -> str:
    cleaned = re.sub(allowed, "-", text).strip("-._")
    if cleaned == text and len(text) <= 63:
        return text
    # Changed or too long: a digest of the original keeps two run ids that clean up alike apart.
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{cleaned[:54].rstrip('-._')}-{digest}"


def _api_client() -> client.ApiClient:
    """In a pod, its service account; elsewhere the user's kubeconfig."""
    try:
        config.load_incluster_config()
    except ConfigException:
        try:
            config.load_kube_config()
        except (ConfigException, OSError) as error:
            raise ExecutorError(f"no Kubernetes access: not in a cluster, and no usable kubeconfig ({error})") from None
    return client.ApiClient()


def _own_namespace() -> str:
    try:
        return IN_CLUSTER_NAMESPACE.read_text().strip()
    except OSError:
        return "default"
