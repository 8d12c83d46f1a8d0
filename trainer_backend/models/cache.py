"""Model folders built once per machine and shared by every process that asks for them."""

from __future__ import annotations

import fcntl
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

MARKER = "COMPLETE"


def _is_complete(folder: Path, fingerprint: str) -> bool:
    try:
        return (folder / MARKER).read_text() == fingerprint
    except (FileNotFoundError, NotADirectoryError):
        return False


def ensure_folder(folder: Path, fingerprint: str, build: Callable[[Path], None]) -> Path:
    """Return `folder`, first filling it with `build(scratch)` unless a build with this fingerprint is there.

    The build runs in a scratch folder beside the target, which is renamed into place with its marker only once
    complete, so a killed build never leaves a folder that looks done. An exclusive lock makes concurrent
    processes wait for one build instead of racing several (the Gemma conversion takes minutes and gigabytes).
    A folder whose marker holds another fingerprint (the build recipe changed) is replaced.
    """
    if _is_complete(folder, fingerprint):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch_prefix = f".building-{folder.name}-"
    with (folder.parent / f".{folder.name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also when the process dies
        if _is_complete(folder, fingerprint):
            return folder
        for leftover in folder.parent.glob(f"{scratch_prefix}*"):
            shutil.rmtree(leftover)  # only a killed build leaves these: nobody else builds while we hold the lock
        scratch = Path(tempfile.mkdtemp(prefix=scratch_prefix, dir=folder.parent))
        scratch.chmod(0o755)  # mkdtemp's private 0700 would hide the model from other users of a shared cache
        try:
            build(scratch)
            (scratch / MARKER).write_text(fingerprint)
            if folder.exists():
                stale = folder.parent / f"{scratch_prefix}stale"
                folder.rename(stale)
                scratch.rename(folder)
                shutil.rmtree(stale)
            else:
                scratch.rename(folder)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
    return folder
