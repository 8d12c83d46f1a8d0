"""What a test needs to see that a process and everything it started ended: the tree under a pid, the ports its
processes listen on, and a wait until none of them is left (Linux's /proc)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

NEEDS_PROC = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from Linux's /proc")


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def alive(pid: int) -> bool:
    """A process with this pid runs and is not a zombie (this container's init may never reap orphans).

    A process still dying counts as alive: after SIGKILL its main thread shows as a zombie while its other threads
    are still exiting, and those still hold its open files (its listening sockets among them)."""
    try:
        threads = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return False
    for thread in threads:
        try:
            stat = (thread / "stat").read_text()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2] not in ("Z", "X"):
            return True
    return False


def tree(root: int) -> set[int]:
    """`root` and every live process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        fields = _stat_fields(int(entry.name))
        if fields is not None and fields[0] not in ("Z", "X"):
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, frontier = {root}, [root]
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in found:
                found.add(child)
                frontier.append(child)
    return {pid for pid in found if alive(pid)}


def listening_ports(pids: Iterable[int] | None = None) -> set[int]:
    """The TCP ports these processes listen on; with no pids, those any process listens on."""
    inodes = set()
    for pid in pids or ():
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            try:
                target = str(fd.readlink())
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and (pids is None or fields[9] in inodes):  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def port_free(port: int) -> bool:
    """A server can bind `port` on loopback again, as uvicorn binds (SO_REUSEADDR: past the connections a killed
    server left in TIME_WAIT)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_until_gone(pids: Iterable[int], within_s: float) -> float:
    """Seconds until none of `pids` is alive; fails the test naming the survivors and their command lines if some
    outlive `within_s`."""
    pids = set(pids)
    started = time.monotonic()
    while (left := {pid for pid in pids if alive(pid)}) and time.monotonic() - started < within_s:
        time.sleep(0.05)
    assert not left, f"still alive after {within_s:g} s: " + "; ".join(f"{pid} {command_line(pid)}" for pid in left)
    return time.monotonic() - started


def wait_until_closed(ports: set[int], within_s: float) -> float:
    """Seconds until no process listens on any of `ports`; fails the test naming those still listened on."""
    started = time.monotonic()
    while (left := ports & listening_ports()) and time.monotonic() - started < within_s:
        time.sleep(0.05)
    assert not left, f"still listened on after {within_s:g} s: {sorted(left)}"
    return time.monotonic() - started


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"
