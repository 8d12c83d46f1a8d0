"""Anytime curves: the best objective so far against the number of trials, per arm the median over its seeds with a
bootstrap 95% interval of that median (seeds resampled with replacement, a fixed bootstrap seed so a report is
reproducible), and their plot."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Bootstrap resamples of the seeds, and the seed that draws them.
RESAMPLES = 10_000
BOOTSTRAP_SEED = 0


def best_so_far(values: Sequence[float]) -> list[float]:
    """The best (highest) objective among the first 1, 2, … trials."""
    return np.maximum.accumulate(np.asarray(values, dtype=float)).tolist()


@dataclass(frozen=True)
class AnytimeCurve:
    """One arm's best-so-far over its seeds; index t is after trial t + 1."""

    arm: str
    seeds: int
    median: tuple[float, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]

    @classmethod
    def of(cls, arm: str, runs_values: Sequence[Sequence[float]]) -> AnytimeCurve:
        """The curve of an arm's runs, one sequence of trial objectives per seed, all of one length."""
        best_S_T = np.array([best_so_far(values) for values in runs_values])
        median_T = np.median(best_S_T, axis=0)
        # Medians of resampled seed sets, trial by trial: resample index r draws seeds picks_R_S[r].
        seeds = best_S_T.shape[0]
        picks_R_S = np.random.default_rng(BOOTSTRAP_SEED).integers(0, seeds, size=(RESAMPLES, seeds))
        medians_R_T = np.median(best_S_T[picks_R_S], axis=1)
        low_T, high_T = np.percentile(medians_R_T, [2.5, 97.5], axis=0)
        return cls(arm, seeds, tuple(median_T.tolist()), tuple(low_T.tolist()), tuple(high_T.tolist()))

    def at(self, trials: int) -> tuple[float, float, float]:
        """Median, low and high after `trials` trials."""
        return self.median[trials - 1], self.low[trials - 1], self.high[trials - 1]


def checkpoints(trials: int) -> list[int]:
    """Trial counts the table reports: 1, 2, 4, 8, … up to `trials`, and `trials` itself."""
    counts = [2**k for k in range(trials.bit_length()) if 2**k <= trials]
    return counts if counts[-1] == trials else [*counts, trials]


def plot_curves(curves: Sequence[AnytimeCurve], path: Path, title: str, ylabel: str) -> None:
    """Median best-so-far per arm against trials, its 95% interval shaded, written as a PNG at `path`."""
    # A bare Figure draws with Agg and touches no GUI backend (as autoresearch/trials/plot.py does).
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.5))
    axes = figure.subplots()
    for curve in curves:
        trials = np.arange(1, len(curve.median) + 1)
        (line,) = axes.plot(trials, curve.median, marker=".", label=f"{curve.arm} ({curve.seeds} seeds)")
        axes.fill_between(trials, curve.low, curve.high, alpha=0.15, color=line.get_color())
    axes.set_xscale("log", base=2)
    counts = checkpoints(max(len(curve.median) for curve in curves))
    axes.set_xticks(counts, [str(count) for count in counts])
    axes.set_xlabel("trials")
    axes.set_ylabel(f"best {ylabel} so far (median, 95% CI)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120, bbox_inches="tight")
