"""`lifeline`: a child started through it ends when its parent ends, however the parent ends, with the process group
it leads; real processes (tests/support/tethered.py), the parent killed with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.process_trees import NEEDS_PROC, alive, wait_until_gone

import lifeline

pytestmark = NEEDS_PROC
ROOT = Path(__file__).parents[2]
ENVIRONMENT = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}


class Family:
    """A parent (in a session of its own) and the child it started through the lifeline, once both reported."""

    def __init__(self, folder: Path, *options: str) -> None:
        self.folder = folder
        command = [sys.executable, "-m", "support.tethered", "parent", str(folder), *options]
        self.parent = subprocess.Popen(command, cwd=ROOT, env=ENVIRONMENT, start_new_session=True)
        deadline = time.monotonic() + 30
        while not all((folder / name).exists() for name in ("parent.json", "child.json")):
            assert self.parent.poll() is None and time.monotonic() < deadline, "the parent or its child did not start"
            time.sleep(0.02)
        time.sleep(0.05)  # the files are written in one call each, but not atomically
        self.parent_report = json.loads((folder / "parent.json").read_text())
        self.child_report = json.loads((folder / "child.json").read_text())
        self.child = self.child_report["pid"]

    def kill_parent(self) -> None:
        self.parent.kill()
        self.parent.wait()

    def everyone(self) -> set[int]:
        reported = [self.parent.pid, self.child, self.child_report["grandchild"], self.parent_report["forked"]]
        return {pid for pid in reported if pid}


@pytest.fixture
def family(tmp_path: Path) -> Iterator[Callable[..., Family]]:
    started: list[Family] = []

    def start(*options: str) -> Family:
        started.append(Family(tmp_path, *options))
        return started[-1]

    yield start
    for each in started:  # whatever a failing test left
        for pid in each.everyone():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_child_and_the_group_it_leads_end_at_once_when_their_parent_is_killed(family: Callable[..., Family]) -> None:
    tree = family("--new-session", "--child=--grandchild")
    assert tree.child_report["group"] == tree.child and alive(tree.child_report["grandchild"])
    tree.kill_parent()
    wait_until_gone([tree.child, tree.child_report["grandchild"]], within_s=2)


def test_a_child_that_leads_no_group_ends_alone_and_leaves_its_parents_group_alone(
    family: Callable[..., Family],
) -> None:
    tree = family("--child=--grandchild")  # the grandchild is in the parent's group, as the child is
    tree.kill_parent()
    wait_until_gone([tree.child], within_s=2)
    assert alive(tree.child_report["grandchild"])


def test_a_process_forked_from_the_parent_does_not_keep_its_children_alive(family: Callable[..., Family]) -> None:
    tree = family("--new-session", "--fork")
    tree.kill_parent()
    wait_until_gone([tree.child], within_s=2)
    assert alive(tree.parent_report["forked"])


def test_a_child_started_with_a_preexec_fn_keeps_its_lifeline_until_the_parent_ends(
    family: Callable[..., Family],
) -> None:
    tree = family("--new-session", "--preexec")
    time.sleep(0.5)
    assert alive(tree.child)
    tree.kill_parent()
    wait_until_gone([tree.child], within_s=2)


def test_a_child_gets_sigterm_and_finishes_its_shutdown_within_its_grace(family: Callable[..., Family]) -> None:
    tree = family("--new-session", "--grace", "10", "--child=--on-sigterm cleanup")
    tree.kill_parent()
    assert wait_until_gone([tree.child], within_s=5) < 5
    assert (tree.folder / "cleaned").read_text() == "yes"


def test_a_child_that_ignores_sigterm_gets_sigkill_after_its_grace(family: Callable[..., Family]) -> None:
    tree = family("--new-session", "--grace", "1", "--child=--on-sigterm ignore")
    tree.kill_parent()
    assert wait_until_gone([tree.child], within_s=3) > 0.8


def test_stop_ends_the_child_and_the_group_it_leads_with_sigterm(family: Callable[..., Family]) -> None:
    tree = family("--new-session", "--stop-child", "--grace", "5", "--child=--grandchild")
    deadline = time.monotonic() + 10
    while not (tree.folder / "stopped.json").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.05)
    assert json.loads((tree.folder / "stopped.json").read_text())["status"] == -signal.SIGTERM
    wait_until_gone([tree.child, tree.child_report["grandchild"]], within_s=2)
    tree.kill_parent()


def test_only_a_python_module_can_be_started() -> None:
    with pytest.raises(ValueError, match="python -m module"):
        lifeline.popen(["sleep", "1"], grace_s=0)
