"""The live view of a trial: a rich progress bar with the figures that matter, or log lines without a terminal."""

from __future__ import annotations

import logging
from types import TracebackType

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from autoresearch.trials.evaluation import HeldOutReport
from autoresearch.trials.metrics import StepMetrics

log = logging.getLogger(__name__)


class TrialProgress:
    """Shows each step's reward, batch accuracy, loss, throughput and the last held-out accuracy."""

    def __init__(self, run_id: str, enabled: bool) -> None:
        self.run_id = run_id
        self.enabled = enabled
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[figures]}"),
            disable=not enabled,
        )
        self._task = self._progress.add_task(run_id, total=None, figures="", start=False)
        self._held_out = ""

    def __enter__(self) -> TrialProgress:
        self._progress.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._progress.__exit__(kind, error, traceback)

    def phase(self, name: str, total: int, completed: int) -> None:
        """Start a phase (warm-up, RL) of `total` steps of which `completed` are done."""
        self._progress.reset(self._task, total=total, completed=completed, description=f"{self.run_id} {name}")
        self._progress.start_task(self._task)
        if not self.enabled:
            log.info("%s: %s from step %d of %d", self.run_id, name, completed, total)

    def note(self, text: str) -> None:
        """A fact about the run worth a line of its own (how its prompts are rendered)."""
        if self.enabled:
            self._progress.console.print(f"{self.run_id}: {text}")
        else:
            log.info("%s: %s", self.run_id, text)

    def warmup_step(self, step: int, loss: float) -> None:
        self._progress.update(self._task, completed=step, figures=f"nll/token {loss:.3f}")
        if not self.enabled:
            log.info("%s: warm-up step %d, nll/token %.4f", self.run_id, step, loss)

    def rl_step(self, metrics: StepMetrics) -> None:
        figures = (
            f"reward {metrics.reward_mean:+.3f}±{metrics.reward_std:.2f}  acc {metrics.accuracy:.2f}  "
            f"loss {'-' if metrics.loss is None else f'{metrics.loss:+.4f}'}  "
            f"{metrics.tokens_per_s:.0f} tok/s  {metrics.step_time_s:.1f} s/step{self._held_out}"
        )
        if metrics.turns_mean is not None:
            figures = f"turns {metrics.turns_mean:.2f}  " + figures
        self._progress.update(self._task, completed=metrics.step, figures=figures)
        if not self.enabled:
            log.info("%s: step %d  %s", self.run_id, metrics.step, figures)

    def held_out(self, report: HeldOutReport) -> None:
        self._held_out = f"  held-out {report.accuracy:.3f}"
        by_form = ", ".join(f"{form} {'-' if a is None else f'{a:.3f}'}" for form, a in report.accuracy_by_form.items())
        by_form = f" ({by_form})" if by_form else ""
        if self.enabled:
            self._progress.console.print(
                f"{self.run_id}: step {report.step}: held-out accuracy on {report.split} {report.accuracy:.3f}{by_form}"
            )
        else:
            log.info("%s: step %d: held-out accuracy %.3f%s", self.run_id, report.step, report.accuracy, by_form)
