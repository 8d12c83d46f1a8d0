"""Host memory a pass has freed goes back to the operating system at its end.

glibc's malloc keeps what a process frees for its own later allocations. A training pass allocates its activations
(gigabytes) and frees them when it ends, and glibc keeps most of those pages: between passes the backend held its
largest pass's peak, and whatever ran next (a generation batch, an evaluation) peaked on top of it. Handed back after
each training pass and generation batch, it holds between them what it uses (docs/reliability.md, "Memory of the
Gemma trial").
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, where the C library has one (not on macOS or musl)."""
    if not sys.platform.startswith("linux"):
        return None
    return getattr(ctypes.CDLL(None), "malloc_trim", None)


_TRIM = _malloc_trim()


def release_freed_memory() -> bool:
    """Hands the free pages of every malloc arena back to the OS; False where the C library cannot."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True
