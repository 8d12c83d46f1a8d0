"""The vLLM server process this backend supervises: started in vLLM's own Python environment (its pins clash with
ours) with LoRA hot-loading on, watched, and started again when it dies."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

import lifeline
from trainer_backend.errors import ServerError

log = logging.getLogger(__name__)

HEALTH_POLL_S = 0.5
# How long vLLM gets to shut down on SIGTERM before its process group is killed.
STOP_GRACE_S = 30.0
# What torchrun tells each process of its group (and `sharding/group.py` each follower it starts).
TORCHRUN_VARIABLES = frozenset(
    {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"}
)


class VllmUnavailableError(ServerError):
    """vLLM did not start, died, or did not answer; the message says which and ends with its log."""


@dataclass(frozen=True)
class VllmSettings:
    """How to start (or reach) the vLLM server."""

    model_folder: Path
    served_name: str
    python: Path | None = None  # the interpreter of vLLM's environment; None with `url`
    url: str | None = None  # a vLLM server already running (started with --enable-lora, runtime LoRA updating)
    max_loras: int = 8
    max_lora_rank: int = 64
    log_path: Path = Path("vllm.log")
    startup_timeout_s: float = 600.0
    device: str = "cpu"
    dtype: str = "float32"  # the trainer's, so that both compute the same log-probs
    gpu_memory_share: float = 0.4  # on a GPU: vLLM's share of its memory, the trainer keeps the rest
    tensor_parallel_size: int = 1  # GPUs vLLM splits the model over: a sharded backend's, one per process


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class VllmProcess:
    """The vLLM server this backend started; `ensure_running` starts it again if it died."""

    def __init__(self, settings: VllmSettings) -> None:
        self.settings = settings
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self.restarts = 0
        self.restarting = False  # between finding it down and its answering again
        self._lock = threading.Lock()

    def command(self) -> list[str]:
        s = self.settings
        # Eager mode: no graph capture on the CPU build.
        command = [
            str(s.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(s.model_folder),
            "--served-model-name", s.served_name, "--host", "127.0.0.1", "--port", str(self.port), "--dtype", s.dtype,
            "--enforce-eager", "--enable-lora", "--max-loras", str(s.max_loras),
            "--max-lora-rank", str(s.max_lora_rank), "--logprobs-mode", "processed_logprobs",
            # Structured output through llguidance, compact as the built-in engine's: vLLM's default (xgrammar) can
            # leave raw control characters inside a JSON string, which strict JSON refuses.
            "--structured-outputs-config", '{"backend": "guidance", "disable_any_whitespace": true}',
        ]  # fmt: skip
        if s.device != "cpu":
            command += ["--gpu-memory-utilization", str(s.gpu_memory_share)]
        if s.tensor_parallel_size > 1:
            command += ["--tensor-parallel-size", str(s.tensor_parallel_size)]
        return command

    def environment(self) -> dict[str, str]:
        """vLLM's environment: this process's, runtime LoRA loading on, and without torchrun's variables, which a
        sharded backend's leader has under torchrun. vLLM is a server of its own, not a process of the trainer's group:
        seeing them, vLLM would take itself for one of torchrun's processes."""
        environment = {name: value for name, value in os.environ.items() if name not in TORCHRUN_VARIABLES}
        environment["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        environment.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        return environment

    def start(self) -> None:
        environment = self.environment()
        log.info("starting vLLM: %s", " ".join(self.command()))
        with self.settings.log_path.open("ab") as output:
            # A session (process group) of its own: vLLM's engine runs in child processes, which must go with it. On
            # a lifeline: should this backend die without stopping it (SIGKILL, a crash), vLLM kills that group at
            # once itself; it holds nothing to save, and a GPU's memory is free for the next server soonest.
            self.process = lifeline.popen(
                self.command(),
                grace_s=0,
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=environment,
                start_new_session=True,
            )
        self._wait_until_healthy()

    def _wait_until_healthy(self) -> None:
        deadline = time.monotonic() + self.settings.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise VllmUnavailableError(
                    f"vLLM exited with status {self.process.returncode} while starting; its log "
                    f"({self.settings.log_path}) ends:\n{_tail(self.settings.log_path)}"
                )
            try:
                if httpx.get(f"{self.url}/v1/models", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(HEALTH_POLL_S)
        self.stop()
        raise VllmUnavailableError(
            f"vLLM did not answer within {self.settings.startup_timeout_s:.0f} s; its log ends:\n"
            + _tail(self.settings.log_path)
        )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def ensure_running(self) -> bool:
        """Start vLLM again if it died or stopped answering; True when it was restarted."""
        with self._lock:
            if self.alive() and self._answers():
                return False
            log.warning(
                "vLLM is not answering (exit status %s); starting it again", self.process and self.process.poll()
            )
            self.restarting = True
            try:
                self.stop()
                self.restarts += 1
                self.start()
            finally:
                self.restarting = False
            return True

    def _answers(self) -> bool:
        try:
            return httpx.get(f"{self.url}/v1/models", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        """Stop vLLM and its engine processes; those of a server that crashed are left running by it otherwise."""
        if self.process is not None:
            lifeline.stop(self.process, grace_s=STOP_GRACE_S)


def _tail(path: Path, lines: int = 20) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""
