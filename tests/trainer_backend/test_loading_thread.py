"""The server loads its model on a thread that ends, so that the OpenMP workers loading starts end with it and the
device worker's parallel kernels are the only ones left (`trainer_backend.server.on_a_passing_thread`)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from trainer_backend.server import on_a_passing_thread


def test_the_value_comes_back_from_a_thread_that_has_ended() -> None:
    ran_on: list[threading.Thread] = []

    def build() -> str:
        ran_on.append(threading.current_thread())
        return "built"

    assert on_a_passing_thread(build) == "built"
    assert ran_on[0] is not threading.current_thread()
    assert not ran_on[0].is_alive()


def test_an_error_in_the_build_is_raised_on_the_callers_thread() -> None:
    def build() -> None:
        raise FileNotFoundError("no such model folder")

    with pytest.raises(FileNotFoundError, match="no such model folder"):
        on_a_passing_thread(build)


# In a process of its own: OpenMP workers that earlier tests' kernels started on pytest's thread would be counted.
# OpenMP's workers are among the process's threads that Python did not start; they leave a moment after their thread.
LEFTOVER_WORKERS = """
import os, sys, threading, time, torch
from trainer_backend.server import on_a_passing_thread
torch.set_num_threads(2)
def threads_python_did_not_start():
    return len(os.listdir("/proc/self/task")) - threading.active_count()
def parallel_kernel():
    return torch.ones(1 << 22).exp_().sum().item()
before = threads_python_did_not_start()
on_a_passing_thread(parallel_kernel)
deadline = time.monotonic() + 10
while threads_python_did_not_start() > before and time.monotonic() < deadline:
    time.sleep(0.05)
after_passing = threads_python_did_not_start()
parallel_kernel()
print(before, after_passing, threads_python_did_not_start())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="threads are counted in /proc/self/task")
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: OpenMP starts no workers")
def test_a_parallel_kernel_on_a_passing_thread_leaves_no_openmp_workers_behind() -> None:
    run = subprocess.run([sys.executable, "-c", LEFTOVER_WORKERS], capture_output=True, text=True, check=True)
    before, after_passing, after_main = (int(n) for n in run.stdout.split())
    assert after_main > before, "a kernel on the main thread started no workers: this test no longer shows a difference"
    assert after_passing == before
