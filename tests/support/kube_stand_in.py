"""A local stand-in for the Kubernetes `batch/v1` Jobs API, with a kubelet that runs each Job's pod as a subprocess.

No cluster can be reached from here, so this is the boundary the Job executor is tested at: a real HTTP server on
loopback, spoken to by the real `kubernetes` client. It keeps Jobs as the API server would (create, read, delete,
409 for a name in use, 404 for one that is not) and moves their status as the Job controller would: a pod runs the
container's command on this machine; its exit code makes the Job Complete, or, past `backoffLimit` failures,
Failed with reason BackoffLimitExceeded; a Job active longer than `activeDeadlineSeconds` has its pod killed and
fails with reason DeadlineExceeded. Volumes are not mounted: paths are the same on both sides here. Not modelled:
ttlSecondsAfterFinished, pod objects, watches, resource versions.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from kubernetes import client

from support.loopback import serving


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int, reason: str, message: str) -> JSONResponse:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason}
    return JSONResponse({**body, "code": code}, status_code=code)


@dataclass
class StandInJob:
    body: dict
    started: float = field(default_factory=time.monotonic)
    pod: subprocess.Popen | None = None
    failures: int = 0

    @property
    def name(self) -> str:
        return self.body["metadata"]["name"]


@dataclass
class JobsApi:
    """The stand-in's state, for tests to look at and disturb."""

    root: Path
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)
    jobs: dict[tuple[str, str], StandInJob] = field(default_factory=dict)
    created: list[dict] = field(default_factory=list)
    # The next this many requests get 503 Service Unavailable.
    unavailable_for: int = 0
    url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def client(self) -> client.BatchV1Api:
        configuration = client.Configuration()
        configuration.host = self.url
        return client.BatchV1Api(client.ApiClient(configuration))

    def delete_from_under(self, namespace: str, name: str) -> None:
        """What `kubectl delete job` by someone else does."""
        with self.lock:
            job = self.jobs.pop((namespace, name))
        _kill(job.pod)

    def kill_pod(self, namespace: str, name: str) -> None:
        """The pod dies the way an out-of-memory kill ends it."""
        with self.lock:
            pod = self.jobs[(namespace, name)].pod
        _kill(pod)

    # --- the kubelet and the Job controller ---------------------------------------------------------------------

    def start_pod(self, job: StandInJob) -> None:
        container = job.body["spec"]["template"]["spec"]["containers"][0]
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        for variable in container.get("env", []):
            if "value" in variable:
                env[variable["name"]] = variable["value"]
            else:
                ref = variable["valueFrom"]["secretKeyRef"]
                env[variable["name"]] = self.secrets[ref["name"]][ref["key"]]
        log = (self.root / f"{job.name}.log").open("a")
        job.pod = subprocess.Popen(
            container["command"] + container.get("args", []),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        status = job.body["status"]
        status["active"] = 1
        status.setdefault("startTime", _now())

    def step(self) -> None:
        with self.lock:
            for job in list(self.jobs.values()):
                self._advance(job)

    def _advance(self, job: StandInJob) -> None:
        spec, status = job.body["spec"], job.body["status"]
        if job.pod is None or any(c["status"] == "True" for c in status.get("conditions", [])):
            return
        deadline = spec.get("activeDeadlineSeconds")
        if deadline is not None and time.monotonic() - job.started > deadline:
            _kill(job.pod)
            self._finish(job, "Failed", "DeadlineExceeded", "Job was active longer than specified deadline")
            return
        code = job.pod.poll()
        if code is None:
            return
        if code == 0:
            status["succeeded"] = 1
            status["completionTime"] = _now()
            self._finish(job, "Complete", None, None)
            return
        job.failures += 1
        status["failed"] = job.failures
        if job.failures > spec.get("backoffLimit", 6):
            self._finish(job, "Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit")
        else:
            self.start_pod(job)

    @staticmethod
    def _finish(job: StandInJob, kind: str, reason: str | None, message: str | None) -> None:
        status = job.body["status"]
        status["active"] = 0
        condition = {"type": kind, "status": "True", "lastTransitionTime": _now()}
        if reason is not None:
            condition |= {"reason": reason, "message": message}
        status["conditions"] = [condition]


def _kill(pod: subprocess.Popen | None) -> None:
    if pod is not None and pod.poll() is None:
        os.killpg(pod.pid, signal.SIGKILL)
        pod.wait()


def _app(api: JobsApi) -> FastAPI:
    app = FastAPI()
    jobs_path = "/apis/batch/v1/namespaces/{namespace}/jobs"

    @app.middleware("http")
    async def maybe_unavailable(request: Request, call_next):
        if api.unavailable_for > 0:
            api.unavailable_for -= 1
            return _status(503, "ServiceUnavailable", "the stand-in API server is unavailable")
        return await call_next(request)

    @app.post(jobs_path)
    async def create(namespace: str, request: Request) -> JSONResponse:
        body = await request.json()
        name = body["metadata"]["name"]
        with api.lock:
            if (namespace, name) in api.jobs:
                return _status(409, "AlreadyExists", f'jobs.batch "{name}" already exists')
            body["metadata"] |= {"namespace": namespace, "uid": str(uuid.uuid4()), "creationTimestamp": _now()}
            body["status"] = {}
            job = StandInJob(body)
            api.jobs[(namespace, name)] = job
            api.created.append(body)
            api.start_pod(job)
        return JSONResponse(body, status_code=201)

    @app.get(jobs_path + "/{name}")
    async def read(namespace: str, name: str) -> JSONResponse:
        with api.lock:
            job = api.jobs.get((namespace, name))
            if job is None:
                return _status(404, "NotFound", f'jobs.batch "{name}" not found')
            return JSONResponse(job.body)

    @app.delete(jobs_path + "/{name}")
    async def delete(namespace: str, name: str) -> JSONResponse:
        with api.lock:
            job = api.jobs.pop((namespace, name), None)
        if job is None:
            return _status(404, "NotFound", f'jobs.batch "{name}" not found')
        _kill(job.pod)
        return JSONResponse({"kind": "Status", "apiVersion": "v1", "status": "Success", "details": {"name": name}})

    return app


@contextmanager
def jobs_api(root: Path, secrets: dict[str, dict[str, str]] | None = None) -> Iterator[JobsApi]:
    """The stand-in on a loopback port, its Job controller ticking every 50 ms; pods left running are killed after."""
    api = JobsApi(root, secrets or {})
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(0.05):
            api.step()

    ticker = threading.Thread(target=tick, daemon=True)
    with serving(_app(api)) as url:
        api.url = url
        ticker.start()
        try:
            yield api
        finally:
            stop.set()
            ticker.join(5)
            for job in api.jobs.values():
                _kill(job.pod)
