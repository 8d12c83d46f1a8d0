"""Benchmarks that print measured figures and the command that produced them.

Each module is a command of its own, run from the repository root: `python -m benchmarks.rl_step --model …`. The
package is not installed with the project (as `tests/` is not): a benchmark measures the code of the tree it is run
from.
"""

import sys
from collections.abc import Sequence
from pathlib import Path

# The repository root: this tree's code, experiments/ and docs/.
ROOT = Path(__file__).resolve().parent.parent


def command_line(module: str, argv: Sequence[str] | None = None) -> str:
    """The line that ends a benchmark's output: the command that produced its figures, `module` run with `argv` (None:
    this process's arguments)."""
    arguments = sys.argv[1:] if argv is None else argv
    return f"command: python -m {module} {' '.join(arguments)}"
