"""This tree against a commit: the commit's code checked out in a temporary directory, and a module of either tree run
in a process of its own, so that one benchmark run measures both with nothing else different.

`compared_trees` gives the trees to measure in turn (the commit's, then this one); `server_from` serves a base model
with a tree's `python -m trainer_backend serve` (`start_server`: on a given port, with more flags), and `MemoryWatch`
follows its resident memory; `run_module` runs a module of a tree to its end and returns the JSON object it printed
last (a measurement in a fresh process).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from autoresearch.trials.backend import free_port, wait_until_healthy
from benchmarks import ROOT
from benchmarks.periodic import Periodic
from benchmarks.process_tree import rss_bytes


@dataclass(frozen=True)
class Tree:
    """The code one run of a comparison measures."""

    name: str  # the benchmark's name for the run: "new" for this tree, the caller's for the commit's ("shipped", …)
    folder: Path  # the root of the tree's code
    commit: str | None = None  # None: this working tree, uncommitted changes included


THIS_TREE = Tree("new", ROOT)


@contextmanager
def checkout(commit: str) -> Iterator[Path]:
    """The files of this repository's `commit` in a temporary directory, for as long as the block runs.

    Written with `git archive`: nothing is registered in the repository, so a run that is killed leaves nothing in it
    (a `git worktree` would stay listed). Raises subprocess.CalledProcessError when git does not know `commit`."""
    with tempfile.TemporaryDirectory(prefix="checkout-") as scratch:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", "--format=tar", commit], capture_output=True, check=True
        )
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as files:
            files.extractall(scratch, filter="data")
        yield Path(scratch)


@contextmanager
def compared_trees(commit: str | None, name: str) -> Iterator[list[Tree]]:
    """The trees a comparison measures in turn: `commit`'s (named `name`), then this one; this one alone when
    `commit` is None."""
    if commit is None:
        yield [THIS_TREE]
        return
    with checkout(commit) as folder:
        yield [Tree(name, folder, commit), THIS_TREE]


def _module_command(module: str, arguments: Sequence[str]) -> list[str]:
    """`python -m module arguments`, with this interpreter."""
    return [sys.executable, "-m", module, *arguments]


def environment_for(tree: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment with `extra` added and the code of `tree` first on the import path (before a copy
    installed with `pip install -e .`, which may be another tree's)."""
    return {**os.environ, **(extra or {}), "PYTHONPATH": str(tree)}


def run_module(
    module: str, arguments: Sequence[str], tree: Path = ROOT, environment: Mapping[str, str] | None = None
) -> dict:
    """`python -m module arguments` with the code of `tree` (and `environment` added to this process's), run to its
    end: the JSON object it printed on its last line.

    Raises subprocess.CalledProcessError when the module exits non-zero."""
    command = _module_command(module, arguments)
    done = subprocess.run(
        command, cwd=tree, env=environment_for(tree, environment), capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def start_server(
    tree: Path,
    storage: Path,
    model_folder: Path,
    port: int,
    launcher: Sequence[str] = ("trainer_backend",),
    options: Sequence[str] = (),
) -> subprocess.Popen:
    """`python -m trainer_backend serve` of the model folder with the code of `tree` on loopback `port`, with
    `options` added to its flags: its process once it answers (its log appended to `storage`/server.log).
    `launcher`: the module (and its arguments) that takes `serve` and its flags, if not trainer_backend's own.

    Raises BackendStartError (the server is stopped) when it exits or does not answer in time."""
    storage.mkdir(parents=True, exist_ok=True)
    log_path = storage / "server.log"
    module, *arguments = launcher
    command = _module_command(module, [*arguments, "serve", "--base-model", str(model_folder)])
    command += ["--host", "127.0.0.1", "--port", str(port), "--storage-root", str(storage), *options]
    with log_path.open("ab") as log:
        server = subprocess.Popen(command, cwd=tree, env=environment_for(tree), stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until_healthy(server, f"http://127.0.0.1:{port}", log_path, 900.0)
    except BaseException:
        server.terminate()
        server.wait(timeout=60)
        raise
    return server


@contextmanager
def server_from(
    tree: Path, storage: Path, model_folder: Path, launcher: Sequence[str] = ("trainer_backend",)
) -> Iterator[tuple[str, subprocess.Popen]]:
    """`start_server` on a free loopback port: its URL and process once it answers, stopped when the block ends."""
    port = free_port()
    server = start_server(tree, storage, model_folder, port, launcher)
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.terminate()
        server.wait(timeout=60)


class MemoryWatch(Periodic):
    """Samples a process's resident memory twice a second for as long as the block runs; with `limit_bytes`, stops
    the process when it grows past it."""

    def __init__(self, process: subprocess.Popen, limit_bytes: int | None = None) -> None:
        super().__init__(interval_s=0.5)
        self.process, self.limit_bytes = process, limit_bytes
        self.peak_bytes = 0
        self.exceeded = False

    def tick(self) -> bool:
        rss = rss_bytes(self.process.pid)
        if rss is None:
            return False
        self.peak_bytes = max(self.peak_bytes, rss)
        if self.limit_bytes is not None and self.peak_bytes > self.limit_bytes:
            self.exceeded = True
            self.process.kill()
            return False
        return True
