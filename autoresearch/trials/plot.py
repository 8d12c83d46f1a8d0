"""The run's figure: the warm-up's loss, then training reward and held-out accuracy over RL steps."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

# A bare Figure draws with Agg and touches no GUI backend or pyplot global state: safe on servers and in threads.
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator


def plot_run(
    metrics: Sequence[dict], evals: Sequence[dict], path: Path, title: str, warmup: Sequence[dict] = ()
) -> None:
    """Reward mean (± std) per step above held-out accuracy per evaluation, written as a PNG.

    With warm-up records, a panel on the left shows the warm-up's cross-entropy per step first.
    """
    if warmup:
        figure = Figure(figsize=(11, 6))
        grid = figure.add_gridspec(2, 2, width_ratios=(1, 2))
        warmup_axes = figure.add_subplot(grid[:, 0])
        reward_axes = figure.add_subplot(grid[0, 1])
        eval_axes = figure.add_subplot(grid[1, 1], sharex=reward_axes)
        warmup_axes.plot([w["step"] for w in warmup], [w["nll_per_token"] for w in warmup], color="tab:purple")
        warmup_axes.set_xlabel("warm-up step (cross-entropy on gold SQL)")
        warmup_axes.set_ylabel("NLL per gold token")
        warmup_axes.grid(alpha=0.3)
    else:
        figure = Figure(figsize=(7, 6))
        reward_axes, eval_axes = figure.subplots(2, 1, sharex=True)
    steps = [m["step"] for m in metrics]
    means = [m["reward_mean"] for m in metrics]
    stds = [m["reward_std"] for m in metrics]
    reward_axes.plot(steps, means, marker=".", label="reward mean")
    reward_axes.fill_between(
        steps,
        [m - s for m, s in zip(means, stds, strict=True)],
        [m + s for m, s in zip(means, stds, strict=True)],
        alpha=0.2,
        label="± std",
    )
    reward_axes.set_ylabel("training reward")
    reward_axes.legend(loc="best")
    reward_axes.grid(alpha=0.3)
    eval_steps, eval_accuracies = [e["step"] for e in evals], [e["accuracy"] for e in evals]
    eval_axes.plot(eval_steps, eval_accuracies, marker="o", color="tab:green", label="all")
    # Where the questions say their form, the forms training shows and those it never shows, apart.
    for form, style in (("seen", "--"), ("unseen", ":")):
        points = [(e["step"], e["accuracy_by_form"][form]) for e in evals if e.get("accuracy_by_form", {}).get(form)]
        if points:
            steps_f, accuracies = zip(*points, strict=True)
            eval_axes.plot(steps_f, accuracies, marker="o", linestyle=style, label=f"{form} form")
    if any(e.get("accuracy_by_form") for e in evals):
        eval_axes.legend(loc="best")
    eval_axes.set_ylabel(f"held-out accuracy ({evals[0]['split']})" if evals else "held-out accuracy")
    eval_axes.set_ylim(-0.02, 1.02)
    eval_axes.set_xlabel("RL step")
    eval_axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    eval_axes.grid(alpha=0.3)
    # A long run id and model name wrap instead of running off both edges.
    figure.suptitle(title, wrap=True)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
