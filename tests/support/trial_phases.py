"""Waiting for a trial to reach a phase, whichever executor runs it."""

from __future__ import annotations

import time

from autoresearch.executors import TrialExecutor, TrialPhase, TrialStatus


def wait_for_phase(executor: TrialExecutor, run_id: str, phases: set[TrialPhase], timeout: float = 240) -> TrialStatus:
    deadline = time.monotonic() + timeout
    while True:
        status = executor.status(run_id)
        if status.phase in phases:
            return status
        assert time.monotonic() < deadline, f"{run_id} still {status.phase}"
        time.sleep(0.1)
