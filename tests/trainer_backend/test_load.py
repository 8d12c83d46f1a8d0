"""A small run of the load benchmark: several SDK clients at once on a real server lose no future, get no error, and
each gets the losses its requests give when run alone (so none ran out of seq_id order or on another's weights)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_many_clients_at_once_lose_nothing_and_keep_their_order() -> None:
    command = [sys.executable, "-m", "benchmarks.load", "--clients", "4", "--requests", "12", "--check"]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "│      48 │    0 │      0 │                    0 │" in run.stdout, run.stdout
