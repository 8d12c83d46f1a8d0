"""What `tasks.pipe_worker` owns that neither sandbox's tests reach: a child's stray print cannot corrupt a message,
an owner dropped without closing leaves no worker behind, and a worker started after its owner closed is ended. Its
deadlines, kills and parent death are tested through both sandboxes (tests/text2sql/test_reward_code.py,
tests/text2sql/test_sandbox_workers.py). A real child process (tests/support/pipe_echo.py)."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
from support.process_trees import NEEDS_PROC, wait_until_gone

from tasks.pipe_worker import LiveWorkers, PipeWorker

ECHO = "support.pipe_echo"


@pytest.fixture(autouse=True)
def support_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The child imports `support` as the tests do: tests/ on its path (PipeWorker puts the repository root first)."""
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parents[1]))


# Were the line to reach the pipe, its first bytes would be read as a message's length and the receive would wait
# for gigabytes: a timeout, not a wrong answer.
@pytest.mark.timeout(30)
def test_what_a_child_prints_to_stdout_does_not_reach_the_parent_as_a_message() -> None:
    worker = PipeWorker(ECHO)
    try:
        for message in (b"select 1", b"select 2"):
            worker.send(message)
            assert worker.receive(timeout_s=30) == message.upper()
    finally:
        worker.kill()


class _Owner:
    """Stands for a sandbox: what holds the `LiveWorkers`."""


@NEEDS_PROC
def test_an_owner_dropped_without_closing_leaves_no_worker_behind() -> None:
    owner = _Owner()
    live = LiveWorkers(owner)
    workers = [PipeWorker(ECHO) for _ in range(2)]
    for worker in workers:
        live.add(worker)
    pids = live.pids()
    try:
        del owner
        gc.collect()
        wait_until_gone(pids, within_s=5)
    finally:
        for worker in workers:
            worker.kill()


@NEEDS_PROC
def test_a_worker_added_after_its_owner_closed_is_ended_not_kept() -> None:
    """A sandbox's thread may start a worker while another closes the sandbox: the worker must not outlive it."""
    owner = _Owner()
    live = LiveWorkers(owner)
    live.kill_all()
    late = PipeWorker(ECHO)
    try:
        assert live.add(late) is False
        assert live.pids() == []
        wait_until_gone([late.pid], within_s=5)
    finally:
        late.kill()
