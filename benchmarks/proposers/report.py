"""What `compare` prints: the anytime curves at a few trial counts, each LLM arm's use of its LLM, and whether the
goal of issue 40 holds (the hybrid's median best at 8 trials at least TPE's at 16); and what `confirm` prints: each
arm's configuration trained again for real."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from rich.table import Table as RichTable

from benchmarks.proposers.arms import ArmRun, Bench, point_text
from benchmarks.proposers.confirm import Confirmation, RealTrial
from benchmarks.proposers.curves import AnytimeCurve, checkpoints

GOAL_HYBRID_TRIALS = 8
GOAL_TPE_TRIALS = 16


def curves_table(curves: Sequence[AnytimeCurve], objective: str) -> RichTable:
    """Per arm, the median best so far and its 95% interval after 1, 2, 4, 8, … trials."""
    counts = checkpoints(len(curves[0].median))
    table = RichTable(title=f"best {objective} so far: median over seeds [95% bootstrap interval]")
    table.add_column("arm")
    table.add_column("seeds", justify="right")
    for count in counts:
        table.add_column(f"{count} trial{'s' if count > 1 else ''}", justify="right")
    for curve in curves:
        cells = [f"{m:.3f} [{lo:.3f}, {hi:.3f}]" for m, lo, hi in (curve.at(count) for count in counts)]
        table.add_row(curve.arm, str(curve.seeds), *cells)
    return table


def llm_table(runs: Sequence[ArmRun]) -> RichTable | None:
    """Per LLM arm, over its seeds: its turns and the share that fell back to TPE (by kind), the candidates it
    proposed and those valid, and the seconds its calls took; None without an LLM arm."""
    by_arm: dict[str, list[ArmRun]] = {}
    for run in runs:
        if run.llm is not None:
            by_arm.setdefault(run.arm, []).append(run)
    if not by_arm:
        return None
    table = RichTable(title="the LLM's proposals (all seeds)")
    for column in ("arm", "LLM turns", "fell back", "why", "candidates valid", "calls", "seconds", "s per call"):
        table.add_column(column, justify="left" if column in ("arm", "why") else "right")
    for arm, arm_runs in by_arm.items():
        uses = [run.llm for run in arm_runs if run.llm is not None]
        turns = sum(use.turns for use in uses)
        failed = sum(use.failed for use in uses)
        kinds = sum((Counter(use.fallbacks) for use in uses), Counter())
        calls = sum(use.calls for use in uses)
        seconds = sum(use.seconds for use in uses)
        table.add_row(
            arm,
            str(turns),
            f"{failed} ({failed / turns:.0%})" if turns else "0",
            ", ".join(f"{kind} {count}" for kind, count in kinds.items()) or "-",
            f"{sum(use.valid for use in uses)} of {sum(use.proposed for use in uses)}",
            str(calls),
            f"{seconds:.1f}",
            f"{seconds / calls:.1f}" if calls else "-",
        )
    return table


def goal(curves: Sequence[AnytimeCurve]) -> str:
    """Whether the hybrid's median best at 8 trials is at least TPE's at 16, with both figures."""
    named = {curve.arm: curve for curve in curves}
    hybrid, tpe = named.get("hybrid"), named.get("tpe")
    wording = f"the hybrid's median best at {GOAL_HYBRID_TRIALS} trials ≥ TPE's at {GOAL_TPE_TRIALS}"
    if hybrid is None or tpe is None or len(tpe.median) < GOAL_TPE_TRIALS:
        return f"goal ({wording}): not judged, it needs the hybrid and tpe arms and --trials {GOAL_TPE_TRIALS} or more"
    ours, theirs = hybrid.at(GOAL_HYBRID_TRIALS)[0], tpe.at(GOAL_TPE_TRIALS)[0]
    verdict = "holds" if ours >= theirs else "does not hold"
    return f"goal ({wording}): {verdict}, {ours:.3f} against {theirs:.3f}"


def confirmation_table(
    bench: Bench, baseline: RealTrial, confirmations: Sequence[Confirmation], objective: str
) -> RichTable:
    """Per arm, the configuration it settles on, the table's mean there, the real trial at the confirming seed, and
    that trial against the default configuration's at the same seed (questions gained and lost, McNemar's p)."""
    seed = baseline.outcome.seed
    seeds = len(bench.table.seeds())
    table = RichTable(title=f"{objective}: each arm's configuration trained again at seed {seed}")
    for column in ("arm", "configuration", "chosen by", f"table ({seeds} seeds)", f"seed {seed}", "vs default"):
        table.add_column(column, justify="left" if column in ("arm", "configuration") else "right")
    default_key = bench.table.key(baseline.point)
    table.add_row(
        "default",
        point_text(baseline.point),
        "-",
        f"{bench.table.mean_score(default_key):.3f}",
        f"{baseline.outcome.score:.3f}",
        "-",
    )
    for confirmation in confirmations:
        choice, paired = confirmation.choice, confirmation.against_default
        table.add_row(
            choice.arm,
            point_text(choice.point),
            f"{choice.chosen_by} of {choice.seeds} seeds",
            f"{choice.table_mean:.3f}",
            f"{confirmation.trial.outcome.score:.3f}",
            f"+{paired.gained} −{paired.lost} of {paired.questions}, p = {paired.p_value:.2g}",
        )
    return table
