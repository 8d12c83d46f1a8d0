"""A process and the processes it started, read from Linux's /proc: who they are and the memory they hold."""

from __future__ import annotations

from pathlib import Path


def tree_pids(pid: int) -> list[int]:
    """`pid` and its living descendants; empty when `pid` has ended."""
    try:
        children = [
            int(child)
            for task in Path(f"/proc/{pid}/task").iterdir()
            for child in (task / "children").read_text().split()
        ]
    except OSError:  # it ended meanwhile
        return []
    return [pid, *(descendant for child in children for descendant in tree_pids(child))]


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of `pid` and its living descendants: their VmRSS summed (a page two share counts twice)."""
    total = 0
    for member in tree_pids(pid):
        try:
            status = Path(f"/proc/{member}/status").read_text()
        except OSError:
            continue
        rss = [line for line in status.splitlines() if line.startswith("VmRSS:")]
        total += int(rss[0].split()[1]) * 1024 if rss else 0
    return total
