"""The training server as tests run it: the tiny random model on CPU on a loopback port, in-process or as the
`python -m trainer_backend serve` process users start."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from autoresearch.trials.backend import wait_until_healthy
from trainer_backend.config import ServerConfig

# The SDK and transformers must not reach out: no telemetry, no Hub.
os.environ.setdefault("TINKER_TELEMETRY", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY = "tiny-gemma3"
REPOSITORY = Path(__file__).parents[2]
# The chat template users give a Gemma base model without one; the tiny model spells its markup out in characters.
GEMMA_CHAT_TEMPLATE = REPOSITORY / "experiments" / "chat_templates" / "gemma.jinja"


def tiny_server_config(storage_root: Path, **overrides: object) -> ServerConfig:
    """A server of the tiny model on CPU, on a port picked when it binds, with short long-polls."""
    settings = {
        "base_model": TINY,
        "device": "cpu",
        "storage_root": storage_root,
        "port": 0,
        "long_poll_s": 5.0,
        **overrides,
    }
    return ServerConfig(**settings)


def start_backend_process(
    storage_root: Path,
    port: int,
    *options: str,
    before_start: Callable[[], None] | None = None,
    healthy_within_s: float | None = 120,
) -> subprocess.Popen:
    """`python -m trainer_backend serve` of the tiny model on `port`, with one torch thread (the backend, the client
    and the test share two cores), once it answers /healthz (at once with `healthy_within_s=None`); its log goes to
    `storage_root/server.log`. `before_start` runs in the child before the server does (to set a resource limit)."""
    command = [
        sys.executable, "-m", "trainer_backend", "serve", "--base-model", TINY, "--device", "cpu",
        "--host", "127.0.0.1", "--port", str(port), "--storage-root", str(storage_root), *options,
    ]  # fmt: skip
    environment = {k: v for k, v in os.environ.items() if k != "TINKER_BASE_URL"} | {"OMP_NUM_THREADS": "1"}
    storage_root.mkdir(parents=True, exist_ok=True)
    log_path = storage_root / "server.log"
    with log_path.open("ab") as log:
        server = subprocess.Popen(
            command, cwd=REPOSITORY, env=environment, stdout=log, stderr=subprocess.STDOUT, preexec_fn=before_start
        )
    if healthy_within_s is not None:
        wait_until_healthy(server, f"http://127.0.0.1:{port}", log_path, timeout_s=healthy_within_s)
    return server
