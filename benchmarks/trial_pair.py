"""Two trials of one key on one backend, as a study runs them: how evenly they share the device, and what running them
together saves over one after the other.

Run: python -m benchmarks.trial_pair [--model google/gemma-3-270m] [--steps 20] [--eval-interval 10]
         [--eval-size 64] [--set FIELD=VALUE …] [--serial] [--before COMMIT] [--log-dir DIR]
         [--variants twice-pause-share …]
     python -m benchmarks.trial_pair --watch URL --run-dir TRIAL_DIR TRIAL_DIR [--minutes 60]
     either with [--plot PNG]: each window's share drawn, per server

A real server (`python -m trainer_backend serve` of this tree, of `--before` when given, and of this tree with each
scheduling variant of `--variants`, benchmarks/scheduler_variants.py) and two trials of the model's trial recipe under
the trials' default key, started at once: trial 1 evaluates every `--eval-interval` steps on `--eval-size` held-out
questions, trial 2 only at its end (one question), as a study's trials at different points of their runs do. The
backend's status is read every POLL_S seconds for each trial's device seconds (its sampling, training and saves) and
open requests. Reported, per server: each trial's median and longest step; the longest step of either against
the median step of both (goal: at most STEP_GOAL); each trial's share of the device over every WINDOW_S window of
the time both had requests queued or running on it (goal: within SHARE_GOAL of an even split), and how much of the
time that was; the device's busy fraction of the makespan; with `--serial`, the two trials one after the other
first, and the makespan together against that sum (the seed's goal: at most MAKESPAN_GOAL where the device has room,
which a 2-core CPU has little of); the backend's peak resident memory.

With `--watch`: two trials already running on a backend (a study's, under the trials' default key), followed for
`--minutes` or until one ends, their steps read from their run folders' metrics as they appear: the same figures
but the serial makespan and the memory.

A trial's device time and open requests are its training run's: its training, the samples of its weights, and the
base model's samples through its client session (its KL penalty's reference log-probs, its own step-0 evaluation).
A study's shared evaluation of the base model counts to no trial.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from autoresearch.device_share import device_use_by_trial
from autoresearch.sdk_logging import quiet_sdk_logs
from autoresearch.trials.backend import DEFAULT_API_KEY
from autoresearch.trials.config import TrialConfig, field_change, parse_trial_config
from benchmarks import ROOT, command_line
from benchmarks.against_commit import MemoryWatch, compared_trees, server_from
from benchmarks.fairness import DeviceCounters, Step, recipe_trial, run_b
from benchmarks.rl_step import REWARD_WITH_SPREAD
from benchmarks.scheduler_variants import add_variants_option
from trainer_backend.models.gemma import GEMMA_3_270M
from trainer_backend.models.qwen import QWEN_2_5_CODER_0_5B_INSTRUCT

log = logging.getLogger(__name__)

# Issue 48's goals: no step of either trial above this many times the median step of the two running together; each
# trial's share of the device within this much of an even split over any WINDOW_S window while both have work queued;
# together at most this share of one after the other.
STEP_GOAL = 2.0
SHARE_GOAL = 0.10
WINDOW_S = 300.0
MAKESPAN_GOAL = 0.9
# How often the backend's status is read for the trials' device seconds, and how often a watch reports.
POLL_S = 5.0
REPORT_S = 600.0
TRIALS = ("trial-1", "trial-2")


def pair_configs(
    model: str, steps: int, eval_interval: int, eval_size: int, changes: Sequence[str] = ()
) -> tuple[TrialConfig, TrialConfig]:
    """The model's recipe twice, with `changes` (FIELD=VALUE, as `autoresearch.trials --set` takes them): trial 1
    evaluating every `eval_interval` steps, trial 2 only at its end.

    Raises:
        ConfigurationError: a change that is not FIELD=VALUE, or whose value the field does not take.
    """
    base, max_tokens = recipe_trial(model)
    if changes:
        base = parse_trial_config({**base.model_dump(), **dict(map(field_change, changes))}, f"{model}'s recipe, --set")
    common = {
        "steps": steps, "warmup_steps": 0, "max_tokens": max_tokens, "reward_spec": REWARD_WITH_SPREAD,
        "checkpoint_interval": 1000, "eval_batch_invariant": False, "share_start_evaluation": False,
    }  # fmt: skip
    first = base.model_copy(update={**common, "eval_size": eval_size, "eval_interval": eval_interval})
    second = base.model_copy(update={**common, "seed": base.seed + 1, "eval_size": 1, "eval_interval": 0})
    return first, second


@dataclass(frozen=True)
class Reading:
    """One poll of the backend's status: when (wall clock), each trial's device seconds so far, and whether both
    trials had requests queued or running on the device."""

    at: float
    seconds: dict[str, float]
    both_working: bool = True


@dataclass(frozen=True)
class Shares:
    """Each trial's share of the device in the windows of the time both had work on it (or all that time, when
    shorter), and how much of the readings' span that time was."""

    window_s: float
    # Trial 1's share in each window, by where the window starts on the clock of the time both had work.
    window_shares: tuple[tuple[float, float], ...]
    both_working_s: float
    span_s: float

    @property
    def worst_deviation(self) -> float:
        """The largest |share - 1/2| of trial 1 over the windows."""
        return max(abs(share - 0.5) for _, share in self.window_shares)

    @property
    def windows(self) -> int:
        return len(self.window_shares)


def shares_over_windows(readings: Sequence[Reading], until: float, trials: tuple[str, str] = TRIALS) -> Shares | None:
    """From the readings up to `until` (the first trial's end), the first trial's share of the two trials' device time
    in every WINDOW_S window of the time both had work on the device (the intervals that begin with both working,
    end to end: while one trial scores or evaluates on its own side, the other using the device alone is no unfair
    share), one window per interval; None when no such interval ended."""
    readings = [reading for reading in readings if reading.at <= until]
    clock, used = 0.0, dict.fromkeys(trials, 0.0)
    timeline = [(clock, dict(used))]
    for before, after in itertools.pairwise(readings):
        if not before.both_working:
            continue
        clock += after.at - before.at
        for trial in trials:
            used[trial] += after.seconds.get(trial, 0.0) - before.seconds.get(trial, 0.0)
        timeline.append((clock, dict(used)))
    if len(timeline) < 2:
        return None
    window = min(WINDOW_S, clock)
    window_shares = []
    for index, (start, before_use) in enumerate(timeline):
        end_index = next((j for j in range(index + 1, len(timeline)) if timeline[j][0] - start >= window - 1e-9), None)
        if end_index is None:
            break
        after_use = timeline[end_index][1]
        window_use = {trial: after_use[trial] - before_use[trial] for trial in trials}
        total = sum(window_use.values())
        if total > 0:
            window_shares.append((start, window_use[trials[0]] / total))
    if not window_shares:
        return None
    return Shares(window, tuple(window_shares), clock, readings[-1].at - readings[0].at)


@dataclass(frozen=True)
class PairFigures:
    steps: dict[str, tuple[Step, ...]]
    together_s: float
    busy_s: float
    shares: Shares | None
    serial_s: float | None  # the two trials one after the other, with --serial
    peak_gib: float | None  # the backend's peak resident memory, where this process started it

    @property
    def step_ratio(self) -> float:
        every = [step.seconds for steps in self.steps.values() for step in steps]
        return max(every) / statistics.median(every)

    @property
    def passed(self) -> dict[str, bool]:
        verdicts = {f"longest step <= {STEP_GOAL}x the pair's median": self.step_ratio <= STEP_GOAL}
        if self.shares is not None:
            verdicts[f"device share within {SHARE_GOAL:.0%} of even over {self.shares.window_s:.0f} s"] = (
                self.shares.worst_deviation <= SHARE_GOAL
            )
        if self.serial_s is not None:
            verdicts[f"together <= {MAKESPAN_GOAL} of one after the other"] = (
                self.together_s <= MAKESPAN_GOAL * self.serial_s
            )
        return verdicts


def run_pair(
    tree: Path, workdir: Path, configs: tuple[TrialConfig, TrialConfig], serial: bool, launcher: Sequence[str]
) -> PairFigures:
    """With `serial`, each trial alone first; then both at once, the backend's status polled for their shares."""
    runs = workdir / "runs"
    serving = server_from(tree, workdir / "backend", Path(configs[0].base_model), launcher)
    with serving as (url, server), MemoryWatch(server) as watch:
        serial_s = None
        if serial:
            serial_s = 0.0
            for name, config in zip(TRIALS, configs, strict=True):
                began = time.time()
                run_b(config, url, runs, f"{name}-alone")
                serial_s += time.time() - began
        steps: dict[str, list[Step]] = {trial: [] for trial in TRIALS}
        ended: dict[str, float] = {}
        readings: list[Reading] = []

        def trial(name: str, config: TrialConfig) -> None:
            try:
                steps[name].extend(run_b(config, url, runs, name))
            finally:
                ended[name] = time.time()

        def poll() -> None:
            while len(ended) < len(TRIALS):
                readings.append(read_trials(url, DEFAULT_API_KEY, TRIALS))
                time.sleep(POLL_S)

        before = DeviceCounters.read(url)
        began = time.time()
        threads = [threading.Thread(target=trial, args=pair) for pair in zip(TRIALS, configs, strict=True)]
        threads.append(threading.Thread(target=poll, daemon=True))
        for thread in threads:
            thread.start()
        for thread in threads[:-1]:
            thread.join()
        together_s = time.time() - began
        busy_s = (DeviceCounters.read(url) - before).busy_s
        if any(not steps[name] for name in TRIALS):
            raise RuntimeError("a trial failed beside the other; the server log has the reason")
    return PairFigures(
        {name: tuple(found) for name, found in steps.items()},
        together_s,
        busy_s,
        shares_over_windows(readings, min(ended.values())),
        serial_s,
        watch.peak_bytes / 2**30,
    )


def watch_trials(
    url: str,
    run_dirs: tuple[Path, Path],
    minutes: float,
    api_key: str,
    on_progress: Callable[[PairFigures], None] = lambda _: None,
) -> PairFigures:
    """Follow two trials that run on `url` already (a study's), for `minutes` or until either ends: their steps from
    their run folders' metrics (each step placed on the wall clock when its line appears) and their device shares
    from the backend's status, as `run_pair` measures its own. `on_progress` gets the figures so far every
    REPORT_S, once both trials have ended a step. A backend that stops answering (restarted: its device seconds
    start again from zero) ends the watch with the figures so far."""
    names = (run_dirs[0].name, run_dirs[1].name)
    steps: dict[str, list[Step]] = {name: [] for name in names}
    seen = {name: _metric_lines(folder) for name, folder in zip(names, run_dirs, strict=True)}
    readings: list[Reading] = []
    # The device's busy share of each last minute, read at every poll: a call that began before the watch counts its
    # whole time when it ends, so the busy seconds of the watch alone would run past its length.
    busy: list[float] = []
    began = reported = time.time()

    def so_far() -> PairFigures | None:
        if any(not found for found in steps.values()) or not busy:
            return None
        now = time.time()
        found = {name: tuple(found) for name, found in steps.items()}
        busy_s = statistics.mean(busy) * (now - began)
        return PairFigures(found, now - began, busy_s, shares_over_windows(readings, now, names), None, None)

    while time.time() - began < minutes * 60 and not any((folder / "result.json").exists() for folder in run_dirs):
        try:
            reading, busy_1m = read_trials(url, api_key, names), _busy_fraction_1m(url, api_key)
        except httpx.TransportError as error:
            log.warning("the backend at %s stopped answering (%s): the watch ends here", url, error)
            break
        readings.append(reading)
        busy.append(busy_1m)
        now = reading.at
        for name, folder in zip(names, run_dirs, strict=True):
            lines = _metric_lines(folder)
            # Only the steps that began once the watch had: the others ran partly before it.
            ended = [Step(now - line["step_time_s"], now) for line in lines[len(seen[name]) :]]
            steps[name] += [step for step in ended if step.started >= began]
            seen[name] = lines
        if now - reported >= REPORT_S and (figures := so_far()) is not None:
            on_progress(figures)
            reported = now
        time.sleep(POLL_S)
    figures = so_far()
    if figures is None:
        raise RuntimeError(f"no step of both trials ended in {time.time() - began:.0f} s; watch for longer")
    return figures


def read_trials(url: str, api_key: str, trials: tuple[str, str]) -> Reading:
    """The trials' device seconds so far on the backend at `url`, and whether both have requests open there."""
    use = device_use_by_trial([url], api_key)
    return Reading(
        time.time(),
        {name: use[name].seconds for name in trials if name in use},
        all(name in use and use[name].open_requests > 0 for name in trials),
    )


def _busy_fraction_1m(url: str, api_key: str) -> float:
    reply = httpx.get(f"{url}/api/v1/status", headers={"X-API-Key": api_key}, timeout=5.0)
    reply.raise_for_status()
    return float(reply.json()["device"]["busy_fraction_1m"])


def _metric_lines(run_dir: Path) -> list[dict]:
    """A trial's metrics records so far (whole lines only: the last may be half written)."""
    path = run_dir / "metrics.jsonl"
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]


COLUMNS = (
    "server", "trial 1 median / longest", "trial 2 median / longest", "longest ÷ pair median", "worst share off even",
    "together", "busy", "one after the other", "peak",
)  # fmt: skip


def row(name: str, figures: PairFigures) -> list[str]:
    """One server's figures as a row of COLUMNS."""

    def steps_cell(steps: tuple[Step, ...]) -> str:
        seconds = [step.seconds for step in steps]
        return f"{statistics.median(seconds):.1f} / {max(seconds):.1f} s"

    shares, serial_s = figures.shares, figures.serial_s
    first, second = figures.steps.values()
    return [
        name,
        steps_cell(first),
        steps_cell(second),
        f"{figures.step_ratio:.2f}",
        f"{shares.worst_deviation:.1%} ({shares.windows} x {shares.window_s:.0f} s; "
        f"both busy {shares.both_working_s / shares.span_s:.0%})"
        if shares
        else "-",
        f"{figures.together_s:.0f} s",
        f"{figures.busy_s / figures.together_s:.0%}",
        f"{serial_s:.0f} s ({figures.together_s / serial_s:.2f})" if serial_s else "-",
        f"{figures.peak_gib:.1f} GiB" if figures.peak_gib is not None else "-",
    ]


def plot_shares(figures_by_name: dict[str, PairFigures], path: Path) -> None:
    """Trial 1's device share in each window of the time both trials had work, one line per server, the goal's
    band shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(10, 4))
    axis.axhspan(0.5 - SHARE_GOAL, 0.5 + SHARE_GOAL, color="tab:green", alpha=0.15, label="goal: within 10 points")
    window_s = WINDOW_S
    for name, figures in figures_by_name.items():
        if figures.shares is None:
            continue
        window_s = figures.shares.window_s
        starts, shares = zip(*figures.shares.window_shares, strict=True)
        worst = figures.shares.worst_deviation
        axis.plot([start / 60 for start in starts], shares, label=f"{name} (worst {worst:.0%} off even)")
    axis.set_ylim(0, 1)
    axis.set_xlabel("minutes of the time both trials had work on the device (the window's start)")
    axis.set_ylabel(f"trial 1's share of {window_s / 60:.0f} min")
    axis.legend(fontsize=8, loc="lower left")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)


def measured(
    before: str | None,
    configs: tuple[TrialConfig, TrialConfig],
    serial: bool,
    log_dir: Path | None,
    variants: Sequence[str] = (),
) -> Iterator[tuple[str, PairFigures]]:
    """The pair on the server of commit `before` (when given), then on this tree's, then on this tree's with each
    scheduling variant (`benchmarks.scheduler_variants`), each as it is measured."""
    with tempfile.TemporaryDirectory(prefix="trial-pair-") as scratch, compared_trees(before, "before") as trees:
        servers = [(tree.commit or "this tree", tree.folder, ("trainer_backend",)) for tree in trees]
        servers += [(variant, ROOT, ("benchmarks.scheduler_variants", variant)) for variant in variants]
        for name, tree_folder, launcher in servers:
            folder = Path(scratch) / name.replace(" ", "-")
            try:
                figures = run_pair(tree_folder, folder, configs, serial, launcher)
            finally:
                if log_dir is not None:
                    log_dir.mkdir(parents=True, exist_ok=True)
                    shutil.copy(folder / "backend" / "server.log", log_dir / f"{name.replace(' ', '-')}.log")
            yield name, figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", default="tiny-gemma3", help=f"tiny-gemma3, {GEMMA_3_270M} or {QWEN_2_5_CODER_0_5B_INSTRUCT}"
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--eval-interval", type=int, default=10, help="trial 1 evaluates every this many steps")
    parser.add_argument("--eval-size", type=int, default=64, help="held-out questions of trial 1's evaluations")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="a field of both trials' recipe changed (repeatable), e.g. --set kl_coef=0.01",
    )
    parser.add_argument("--serial", action="store_true", help="also run the two trials one after the other first")
    parser.add_argument("--before", default=None, help="also measure the server of this commit")
    parser.add_argument("--log-dir", type=Path, default=None, help="keep each server's log here")
    add_variants_option(parser)
    parser.add_argument("--watch", default=None, metavar="URL", help="follow two trials running on this backend")
    parser.add_argument("--run-dir", type=Path, nargs=2, default=None, help="with --watch: the two trials' folders")
    parser.add_argument("--minutes", type=float, default=60.0, help="with --watch: for at most this long")
    parser.add_argument("--plot", type=Path, default=None, help="draw each window's share to this PNG")
    args = parser.parse_args()
    if (args.watch is None) != (args.run_dir is None):
        parser.error("--watch and --run-dir go together")

    from rich.console import Console
    from rich.table import Table

    quiet_sdk_logs()
    console = Console(width=140)
    verdicts: list[str] = []
    plotted: dict[str, PairFigures] = {}

    def keep(name: str, figures: PairFigures) -> None:
        # Drawn as the figures come: a run stopped midway keeps its plot of what it measured.
        plotted[name] = figures
        if args.plot is not None:
            plot_shares(plotted, args.plot)

    if args.watch is not None:
        table = Table(title=f"two running trials on {args.watch}: {args.run_dir[0].name}, {args.run_dir[1].name}")

        def progress(so_far: PairFigures) -> None:
            console.print(f"so far ({so_far.together_s / 60:.0f} min): " + " | ".join(row("", so_far)))
            # Now, not when the buffer fills: a watch into a log file that is stopped keeps what it printed.
            console.file.flush()
            keep("watched", so_far)

        figures = watch_trials(args.watch, tuple(args.run_dir), args.minutes, DEFAULT_API_KEY, progress)
        keep("watched", figures)
        rows = [row("watched", figures)]
        verdicts += [f"watched: {goal}: {'pass' if ok else 'FAIL'}" for goal, ok in figures.passed.items()]
    else:
        configs = pair_configs(args.model, args.steps, args.eval_interval, args.eval_size, args.set)
        table = Table(
            title=f"two trials of one key ({args.steps} steps; trial 1 evaluates {args.eval_size} questions every "
            f"{args.eval_interval}), {args.model}"
        )
        rows = []
        for name, figures in measured(args.before, configs, args.serial, args.log_dir, args.variants):
            # Each server's figures as soon as they exist: a run stopped midway keeps what it measured.
            rows.append(row(name, figures))
            console.print(" | ".join(rows[-1]))
            console.file.flush()
            keep(name, figures)
            verdicts += [f"{name}: {goal}: {'pass' if ok else 'FAIL'}" for goal, ok in figures.passed.items()]
    for column in COLUMNS:
        table.add_column(column, justify="right")
    for cells in rows:
        table.add_row(*cells)
    console.print(table)
    for line in verdicts:
        console.print(line)
    console.print(command_line("benchmarks.trial_pair"))


if __name__ == "__main__":
    main()
