"""A process and the processes it started, read from Linux's /proc: who they are, the memory they hold and the CPU time
they used."""

from __future__ import annotations

import os
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


def rss_bytes(pid: int) -> int | None:
    """Resident memory of `pid` (its VmRSS); None when it has ended."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    rss = [line for line in status.splitlines() if line.startswith("VmRSS:")]
    return int(rss[0].split()[1]) * 1024 if rss else 0


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of `pid` and its living descendants: their VmRSS summed (a page two share counts twice)."""
    return sum(rss_bytes(member) or 0 for member in tree_pids(pid))


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user and system) that `pid` and its living descendants have used: on a CPU the clients' own work
    (prompts, scoring) takes the same cores as the device's."""
    total = 0.0
    for member in tree_pids(pid):
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended meanwhile
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total
