"""The project's commands run as a user runs them: `python -m <module> …`, in a process of its own."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping


def run_command(
    module: str, *args: str, timeout_s: float, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m module args…` run to its end (`env`: its whole environment; None: this process's): its exit status,
    and what it wrote to stdout and stderr, as text."""
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout_s, check=False, env=env
    )
