"""Which Tinker backend a trial talks to: a given URL, $TINKER_BASE_URL, or a local server it starts itself.

The local server runs as a subprocess (`python -m trainer_backend serve`): a trial talks to any backend only
through the Tinker API, so nothing of the server is imported here.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

import lifeline
from autoresearch.errors import BackendStartError

# Checkpoints belong to the key that saved them, so a resumed trial must come back with the same one.
DEFAULT_API_KEY = "tml-local"
# The user_metadata key of a trial's training runs that holds its run id: the backend's status lists the caller's
# runs with it, which is how the controller tells each trial's share of the device.
TRIAL_METADATA_KEY = "trial"
# How long a local backend gets to shut down on SIGTERM (its requests, a vLLM it started) before SIGKILL.
STOP_GRACE_S = 30.0


def api_key() -> str:
    """$TINKER_API_KEY, else the fixed key a local backend (open mode) accepts."""
    return os.environ.get("TINKER_API_KEY") or DEFAULT_API_KEY


def free_port() -> int:
    """A loopback port no one listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _tail(path: Path, lines: int = 20) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


@contextmanager
def local_backend(base_model: str, storage_root: Path, startup_timeout_s: float = 900.0) -> Iterator[str]:
    """Start `python -m trainer_backend serve` on a free loopback port, yield its URL once healthy, stop it after.

    The first start of the real Gemma converts its weights (about a minute), hence the long timeout.

    Raises:
        BackendStartError: the server exited or did not answer /healthz in time; the message ends with its log.
    """
    storage_root.mkdir(parents=True, exist_ok=True)
    log_path = storage_root / "server.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        sys.executable, "-m", "trainer_backend", "serve",
        "--base-model", base_model, "--host", "127.0.0.1", "--port", str(port), "--storage-root", str(storage_root),
    ]  # fmt: skip
    with log_path.open("ab") as log:
        # On a lifeline: a caller killed outright (SIGKILL) takes its backend with it, after the backend's own
        # shutdown (which stops a vLLM it started).
        server = lifeline.popen(
            command, grace_s=STOP_GRACE_S, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    try:
        wait_until_healthy(server, url, log_path, startup_timeout_s)
        yield url
    finally:
        lifeline.stop(server, grace_s=STOP_GRACE_S)


def wait_until_healthy(server: subprocess.Popen, url: str, log_path: Path, timeout_s: float) -> None:
    """Return once `url`/healthz answers 200; raises BackendStartError if `server` exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise BackendStartError(
                f"the local backend exited with status {server.returncode}; its log ({log_path}) ends:\n"
                + _tail(log_path)
            )
        try:
            if httpx.get(f"{url}/healthz", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise BackendStartError(f"the local backend did not answer {url}/healthz within {timeout_s:.0f} s; see {log_path}")


@contextmanager
def backend_for(base_model: str, backend_url: str | None, storage_root: Path) -> Iterator[str]:
    """`backend_url`, else $TINKER_BASE_URL, else a local backend serving `base_model` from `storage_root`."""
    url = backend_url or os.environ.get("TINKER_BASE_URL")
    if url:
        yield url
        return
    with local_backend(base_model, storage_root) as local_url:
        yield local_url
