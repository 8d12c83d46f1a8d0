"""The grids the tables are built on, by study name: a few values of each searched parameter that matters most,
the rest held where the study's spec would leave them (a reward component at weight 0 is left out)."""

from __future__ import annotations

from benchmarks import ROOT
from benchmarks.proposers.table import Grid

TABLES = ROOT / "benchmarks" / "proposers" / "tables"

GRIDS: dict[str, Grid] = {
    # experiments/text2sql.yaml, Qwen2.5-Coder-0.5B-Instruct: 24 points. The learning rate at the range's ends and
    # its geometric middle, the temperature at its ends, both losses, and the reward weight most tied to the
    # objective (the overlap of the query's result with the gold one) off and at its largest.
    "text2sql-qwen": Grid(
        axes={
            "learning_rate": (1.0e-5, 4.5e-5, 2.0e-4),
            "temperature": (0.7, 1.2),
            "loss": ("importance_sampling", "ppo"),
            "reward.result_overlap": (0.0, 0.5),
        },
        fixed={"reward.format": 0.0, "reward.schema_linking": 0.0},
    ),
}
