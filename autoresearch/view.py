"""What a person watching the controller sees: a live table of the study's trials, and the summary at the end."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType

import optuna
from optuna.trial import TrialState
from rich.console import Console
from rich.live import Live
from rich.table import Table

from autoresearch.attributes import StudyAttributes, TrialAttributes
from autoresearch.device_share import DeviceUse
from autoresearch.study import llm_proposal_counts, proposed_by, rl_gain_of, summary_rows

# The live table shows the start of each rationale; summary.json and the dashboard have it whole.
_RATIONALE_CHARS = 80

log = logging.getLogger(__name__)


def trials_table(study: optuna.Study, device: Mapping[str, DeviceUse] | None = None) -> Table:
    """One row per started trial; `device`: each trial's device use by run id, where the backends tell it."""
    device = device or {}
    table = Table(title=f"study {study.study_name}{_references(study)}")
    columns = (
        "#", "state", "device 1m", "proposed by", "held-out at RL start", "latest held-out", "RL gain",
        "seen / unseen form", "score", "parameters",
    )  # fmt: skip
    for column in (*columns, "rationale"):
        table.add_column(column, overflow="fold")
    for trial in study.get_trials(deepcopy=False):
        if trial.state is TrialState.WAITING:
            continue
        latest = trial.intermediate_values[max(trial.intermediate_values)] if trial.intermediate_values else None
        gain = rl_gain_of(trial)
        attributes = TrialAttributes.of(trial)
        params = ", ".join(f"{k}={_short(v)}" for k, v in trial.params.items())
        table.add_row(
            str(trial.number),
            trial.state.name.lower(),
            _device(device.get(attributes.run_id or "")),
            proposed_by(attributes),
            _figure(gain.at_start),
            _figure(latest),
            _signed(gain.gain),
            _by_form(attributes.held_out_by_form),
            "-" if not trial.values else f"{trial.values[0]:.3f}",
            params,
            _clipped(attributes.rationale or attributes.llm_fallback or "-"),
        )
    return table


def _device(use: DeviceUse | None) -> str:
    """The trial's share of the device over about the last minute, and its device time in all."""
    return "-" if use is None else f"{use.share_1m:.0%} ({use.seconds:.0f} s)"


def _clipped(text: str) -> str:
    return text if len(text) <= _RATIONALE_CHARS else text[: _RATIONALE_CHARS - 1] + "…"


def _references(study: optuna.Study) -> str:
    """What trials compare against: the base model's held-out accuracy and, when shared, the warm-up's."""
    parts = []
    attributes = StudyAttributes.of(study)
    if attributes.baseline_accuracy is not None:
        parts.append(f"base model: {attributes.baseline_accuracy:.3f}")
    parts += [f"shared warm-up: {w.held_out_accuracy:.3f}" for w in attributes.shared_warmups.values()]
    return f" ({'; '.join(parts)})" if parts else ""


def _by_form(accuracies: dict[str, float | None] | None) -> str:
    """The latest evaluation's seen-form and unseen-form accuracy, where the questions say their form."""
    if not accuracies:
        return "-"
    return f"{_figure(accuracies.get('seen'))} / {_figure(accuracies.get('unseen'))}"


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.3f}"


def _short(value: object) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


class StudyView:
    """The live table, refreshed on every controller tick; log lines instead when there is no terminal.
    `device_use`: asked on every refresh for the trials' device use by run id."""

    def __init__(
        self,
        enabled: bool,
        console: Console | None = None,
        device_use: Callable[[], Mapping[str, DeviceUse]] | None = None,
    ) -> None:
        self.console = console or Console()
        self.enabled = enabled
        self.device_use = device_use
        self._live = Live(console=self.console, refresh_per_second=1) if enabled else None
        self._last_states: dict[int, str] = {}

    def __enter__(self) -> StudyView:
        if self._live is not None:
            self._live.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._live is not None:
            self._live.__exit__(kind, error, traceback)

    def update(self, study: optuna.Study) -> None:
        if self._live is not None:
            self._live.update(trials_table(study, self.device_use() if self.device_use is not None else None))
            return
        for trial in study.get_trials(deepcopy=False):
            if self._last_states.get(trial.number) != trial.state.name:
                self._last_states[trial.number] = trial.state.name
                log.info("trial %d %s %s", trial.number, trial.state.name.lower(), dict(trial.params))


def write_summary(study: optuna.Study, folder: Path, console: Console) -> Path:
    """Print the best trials, save Optuna's plots and a summary.json into `folder`; returns the summary's path."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = summary_rows(study)
    table = Table(title=f"best trials of {study.study_name}")
    columns = (
        "#", "score", "at RL start", "RL gain", "seen / unseen form", "proposed by", "parameters", "reward components"
    )  # fmt: skip
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        components = ", ".join(f"{c['kind']}×{c.get('weight', 1.0):.2g}" for c in row.reward_spec.get("components", []))
        params = ", ".join(f"{k}={_short(v)}" for k, v in row.params.items())
        table.add_row(
            str(row.number),
            f"{row.held_out_accuracy:.3f}",
            _figure(row.held_out_at_rl_start),
            _signed(row.rl_gain),
            _by_form(row.held_out_by_form),
            row.proposed_by,
            params,
            components,
        )
    console.print(table)
    states = {state.name.lower(): 0 for state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)}
    for trial in study.get_trials(deepcopy=False):
        if trial.state.name.lower() in states:
            states[trial.state.name.lower()] += 1
    console.print("trials: " + ", ".join(f"{count} {state}" for state, count in states.items()))
    attributes = StudyAttributes.of(study)
    baseline = attributes.baseline_accuracy
    if baseline is not None:
        console.print(f"baseline: the base model scores {baseline:.3f} on the same held-out questions")
    proposals = llm_proposal_counts(study)
    if proposals.proposed or proposals.rejected or proposals.fallbacks:
        console.print(
            f"LLM candidates: {proposals.proposed} proposed, {proposals.valid} valid, {proposals.run} run, "
            f"{len(proposals.rejected)} rejections"
        )
        if proposals.fallbacks:
            kinds = ", ".join(f"{count} {kind}" for kind, count in proposals.fallbacks.items())
            console.print(f"LLM turns that TPE took instead: {kinds}")
        for reason in proposals.rejected:
            console.print(f"  rejected: {reason}", markup=False)
    code = proposals.reward_code
    if code.proposed:
        console.print(f"LLM reward code: {code.proposed} proposed, {code.admitted} admitted")
        for reason in code.refused:
            console.print(f"  refused: {reason}", markup=False)
    warmups = attributes.shared_warmups
    for url, warmup in warmups.items():
        console.print(f"shared warm-up on {url}: held-out {warmup.held_out_accuracy:.3f}, state {warmup.path}")
    if rows:
        console.print(f"best adapter: {rows[0].sampler_path} (run {rows[0].run_id})")
    _save_plots(study, folder)
    summary = folder / "summary.json"
    summary.write_text(
        json.dumps(
            {
                "trials": states,
                "baseline": baseline,
                "shared_warmups": {url: warmup.model_dump() for url, warmup in warmups.items()},
                "llm_proposals": proposals.model_dump(),
                "best": [row.model_dump() for row in rows],
            },
            indent=2,
            default=str,
        )
    )
    return summary


def _save_plots(study: optuna.Study, folder: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as optuna_plots

    plots = {
        "history.png": optuna_plots.plot_optimization_history,
        "intermediate_values.png": optuna_plots.plot_intermediate_values,
        "param_importances.png": optuna_plots.plot_param_importances,
    }
    for name, plot in plots.items():
        try:
            axes = plot(study)
        except (ValueError, RuntimeError) as error:  # too few complete trials for this plot
            log.info("no %s: %s", name, error)
            continue
        axes.figure.savefig(folder / name, dpi=110, bbox_inches="tight")
        plt.close(axes.figure)
