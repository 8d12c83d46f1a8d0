"""Nothing is left behind when a server stops: `python -m trainer_backend serve --sampler vllm` of the tiny model,
stopped with SIGTERM or Ctrl-C (SIGINT; both its orderly shutdown) or killed with SIGKILL. Within the times below no
process of its tree (the server, vLLM's API server, vLLM's engine process) is alive, and the ports they listened on
are free. Real processes, vLLM's CPU build (tests/support/vllm.py)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator

import pytest
from support.backends import start_backend_process
from support.loopback import free_port
from support.process_trees import (
    NEEDS_PROC,
    alive,
    command_line,
    listening_ports,
    port_free,
    tree,
    wait_until_closed,
    wait_until_gone,
)
from support.vllm import NEEDS_VLLM, VLLM_PYTHON

from autoresearch.trials.backend import wait_until_healthy

pytestmark = [*NEEDS_VLLM, NEEDS_PROC]
# SIGTERM, SIGINT: the server stops vLLM (SIGTERM to its process group, which vLLM answers in a few seconds), then
# exits with the status below. SIGKILL: vLLM's lifeline kills its process group at once.
GONE_WITHIN_S = {signal.SIGTERM: 30.0, signal.SIGINT: 30.0, signal.SIGKILL: 5.0}
EXIT_STATUS = {signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGINT: 0}
VLLM_SERVER = "vllm.entrypoints.openai.api_server"


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[signal.Signals, tuple[subprocess.Popen, int]]]:
    """A server and its port for each way to stop one, started side by side: each vLLM takes about a minute to start,
    mostly on one core."""
    started = {}
    for signum in GONE_WITHIN_S:
        root = tmp_path_factory.mktemp(signum.name.lower())
        port = free_port()
        options = ("--sampler", "vllm", "--vllm-python", VLLM_PYTHON)
        started[signum] = (start_backend_process(root, port, *options, healthy_within_s=None), port, root)
    everyone: set[int] = set()
    try:
        for server, port, root in started.values():
            wait_until_healthy(server, f"http://127.0.0.1:{port}", root / "server.log", timeout_s=600)
            everyone |= tree(server.pid)
        yield {signum: (server, port) for signum, (server, port, _) in started.items()}
    finally:
        for pid in everyone | {server.pid for server, _, _ in started.values()}:  # whatever a failure left
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("signum", list(GONE_WITHIN_S), ids=lambda signum: signum.name)
def test_a_stopped_vllm_server_leaves_no_process_and_no_port_behind(
    servers: dict[signal.Signals, tuple[subprocess.Popen, int]], signum: signal.Signals
) -> None:
    server, port = servers[signum]
    processes = tree(server.pid)
    (vllm,) = [pid for pid in processes if VLLM_SERVER in command_line(pid)]
    assert len(processes) >= 3, [command_line(pid) for pid in processes]  # and vLLM's engine
    vllm_port = int(command_line(vllm).split(" --port ")[1].split()[0])
    ports = listening_ports(processes)
    assert {port, vllm_port} <= ports  # vLLM's engine listens on more

    server.send_signal(signum)
    if signum in EXIT_STATUS:
        # An orderly shutdown: the server stopped vLLM before it exited, not vLLM's lifeline after.
        assert server.wait(timeout=GONE_WITHIN_S[signum]) == EXIT_STATUS[signum]
        assert not alive(vllm)
    wait_until_gone(processes, within_s=GONE_WITHIN_S[signum])
    wait_until_closed(ports, within_s=GONE_WITHIN_S[signum])
    # (The engine's own ports may be held in TIME_WAIT for a minute, as TCP does; no server of ours waits on them.)
    assert port_free(port) and port_free(vllm_port)
