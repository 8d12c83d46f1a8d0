"""Benchmarks that print measured figures and the command that produced them.

Each module is a command of its own, run from the repository root: `python -m benchmarks.rl_step --model …`. The
package is not installed with the project (as `tests/` is not): a benchmark measures the code of the tree it is run
from.
"""

from pathlib import Path

# The repository root: this tree's code, experiments/ and docs/.
ROOT = Path(__file__).resolve().parent.parent
