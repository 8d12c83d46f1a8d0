"""Where a loader's cache folder lies, how a file in it is replaced without a reader seeing half of it, and how
processes that fill the same folder take turns."""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def default_cache_dir(format_name: str, root: Path) -> Path:
    """~/.cache/rl-posttrain/text2sql/<format>-<hash of the root path>: the data set folder may be read-only."""
    digest = hashlib.sha256(str(root.expanduser().resolve()).encode()).hexdigest()[:16]
    return Path.home() / ".cache" / "rl-posttrain" / "text2sql" / f"{format_name}-{digest}"


def write_atomically(path: Path, text: str) -> None:
    """Replace a cache file in one step, so that a concurrent load reads the old text or the new one."""
    partial = path.with_name(path.name + f".{os.getpid()}.partial")
    partial.write_text(text, encoding="utf-8")
    partial.replace(path)


@contextmanager
def exclusive(cache_dir: Path) -> Iterator[None]:
    """Hold the cache folder alone: a second process waits, then finds the first one's conversions done."""
    with (cache_dir / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also when the process dies
        yield
