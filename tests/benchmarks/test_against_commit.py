"""The harness that measures this tree against a commit: the commit's files apart from this tree and gone after the
run, the commit measured before this tree, a module run to its end with a tree's code, and a server of a tree's code."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest
from support.backends import TINY

from benchmarks import ROOT
from benchmarks.against_commit import checkout, compared_trees, run_module, server_from


def test_a_commit_is_checked_out_as_its_tracked_files_and_removed_after_the_block() -> None:
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "-r", "--name-only", "HEAD"], capture_output=True)
    tracked = set(listed.stdout.decode().splitlines())
    with checkout("HEAD") as folder:
        assert folder != ROOT
        assert {path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file()} == tracked
    assert not folder.exists()


def test_a_commit_git_does_not_know_is_refused() -> None:
    with pytest.raises(subprocess.CalledProcessError), checkout("no-such-commit"):
        pass


def test_the_commit_is_measured_first_then_this_tree() -> None:
    with compared_trees("HEAD", "before") as trees:
        assert [(tree.name, tree.commit) for tree in trees] == [("before", "HEAD"), ("new", None)]
        assert trees[0].folder != ROOT
        assert trees[1].folder == ROOT


def test_without_a_commit_this_tree_alone_is_measured() -> None:
    with compared_trees(None, "before") as trees:
        assert [(tree.name, tree.folder) for tree in trees] == [("new", ROOT)]


def test_a_module_runs_with_the_code_of_its_tree_and_gives_the_json_it_printed_last(tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(
        "import json, os, sys\n"
        "print('warming up')\n"
        "print(json.dumps({'arguments': sys.argv[1:], 'folder': os.getcwd(), 'added': os.environ['PROBE_ADDED']}))\n"
    )
    figures = run_module("probe", ["--steps", "2"], tree=tmp_path, environment={"PROBE_ADDED": "yes"})
    assert figures == {"arguments": ["--steps", "2"], "folder": str(tmp_path), "added": "yes"}


def test_a_module_that_fails_raises(tmp_path: Path) -> None:
    (tmp_path / "failing.py").write_text("raise SystemExit(3)\n")
    with pytest.raises(subprocess.CalledProcessError):
        run_module("failing", [], tree=tmp_path)


def test_a_server_of_a_tree_answers_until_the_block_ends(tmp_path: Path) -> None:
    with server_from(ROOT, tmp_path / "backend", Path(TINY)) as (url, server):
        assert httpx.get(f"{url}/healthz").status_code == 200
    assert server.poll() is not None
    assert (tmp_path / "backend" / "server.log").exists()
