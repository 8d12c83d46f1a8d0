"""How busy one shared backend keeps the device with 1, 2, 3 and 6 concurrent RL trials, and what running three
trials at once saves over running them one after another.

Run: python -m benchmarks.duty_cycle [--model tiny-gemma3] [--concurrency 1 2 3 6] [--steps 8] [--plot PATH]

A real training server runs in this process (the device worker is its thread); each trial is a real subprocess,
`python -m autoresearch.trials`, talking to it over loopback with the tinker SDK, scoring its completions on
DuckDB. For each concurrency the benchmark reports:

- busy fraction: time the device worker spent in device calls ÷ the window from the first device call to the
  last (trial start-up and the final evaluation's scoring are outside the device's control either way);
- aggregate RL steps per minute over that window.

Then three identical trials run one after another: the makespan ratio (concurrent ÷ sequential) against the
ideal ratio, max(total device time, longest single trial) ÷ sequential makespan.

On a CPU-only machine the "device" is the same CPU the trials score on, so concurrent trials also compete with
the worker for cores; the figures say how well requests interleave, not what a GPU would do.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from autoresearch.trials.config import load_trial_config
from benchmarks import ROOT, command_line
from trainer_backend.config import ServerConfig
from trainer_backend.duty_cycle import Interval
from trainer_backend.server import RunningServer, running_server

BASE_CONFIG = ROOT / "experiments" / "trials" / "text2sql_tiny.yaml"


@dataclass(frozen=True)
class Scenario:
    name: str
    trials: int
    makespan_s: float
    longest_trial_s: float
    window_s: float
    busy_s: float
    steps: int
    intervals: list[Interval]
    started: float

    @property
    def busy_fraction(self) -> float:
        return self.busy_s / self.window_s if self.window_s > 0 else 0.0

    @property
    def steps_per_minute(self) -> float:
        return 60 * self.steps / self.window_s if self.window_s > 0 else 0.0


def trial_config(args: argparse.Namespace, folder: Path) -> Path:
    """The tiny trial config with the benchmark's model and step count, no mid-run evaluation or checkpoints."""
    config = load_trial_config(BASE_CONFIG).model_dump(mode="json")
    config.update(
        base_model=args.model,
        steps=args.steps,
        warmup_steps=0,
        batch_size=args.batch_size,
        group_size=args.group_size,
        max_tokens=args.max_tokens,
        eval_interval=0,
        eval_size=4,
        checkpoint_interval=max(args.steps, 1),
        run_id=None,
        # vLLM cannot load a LoRA on lm_head.
        train_unembed=args.vllm_python is None and config["train_unembed"],
    )
    path = folder / "trial.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def launch(config: Path, url: str, run_dir: Path, run_id: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "autoresearch.trials", str(config), "--backend-url", url]
    command += ["--run-dir", str(run_dir), "--run-id", run_id, "--no-progress"]
    log = (run_dir / f"{run_id}.log").open("w")
    return subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})


def wait(process: subprocess.Popen, run_dir: Path, run_id: str) -> float:
    process.wait()
    if process.returncode != 0:
        raise SystemExit(f"trial {run_id} failed:\n{(run_dir / f'{run_id}.log').read_text()[-3000:]}")
    return time.monotonic()


def measure(
    name: str, server: RunningServer, config: Path, run_dir: Path, trials: int, steps: int, sequential: bool = False
) -> Scenario:
    started = time.monotonic()
    durations = []
    ids = [f"{name}-{i}" for i in range(trials)]
    if sequential:
        for run_id in ids:
            begun = time.monotonic()
            durations.append(wait(launch(config, server.url, run_dir, run_id), run_dir, run_id) - begun)
    else:
        processes = [launch(config, server.url, run_dir, run_id) for run_id in ids]
        durations = [wait(p, run_dir, run_id) - started for p, run_id in zip(processes, ids, strict=True)]
    finished = time.monotonic()
    intervals = server.service.duty_cycle.intervals(since=started)
    window = intervals[-1][1] - intervals[0][0] if intervals else 0.0
    return Scenario(
        name=name,
        trials=trials,
        makespan_s=finished - started,
        longest_trial_s=max(durations),
        window_s=window,
        busy_s=sum(end - start for start, end in intervals),
        steps=trials * steps,
        intervals=intervals,
        started=started,
    )


def plot_timelines(scenarios: list[Scenario], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(len(scenarios), 1, figsize=(10, 1.2 + 1.1 * len(scenarios)), sharex=True)
    axes = [axes] if len(scenarios) == 1 else list(axes)
    for axis, scenario in zip(axes, scenarios, strict=True):
        bars = [(start - scenario.started, end - start) for start, end in scenario.intervals]
        axis.broken_barh(bars, (0, 1), facecolors="tab:blue")
        axis.set_yticks([])
        axis.set_ylabel(f"{scenario.trials} trial{'s' * (scenario.trials > 1)}", rotation=0, ha="right", va="center")
        axis.set_title(
            f"busy {scenario.busy_fraction:.0%} of the window, {scenario.steps_per_minute:.1f} RL steps/min",
            fontsize=9,
            loc="left",
        )
    axes[-1].set_xlabel("seconds since the trials started (blue: device busy)")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-gemma3", help="tiny-gemma3 or google/gemma-3-270m")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 3, 6])
    parser.add_argument("--steps", type=int, default=8, help="RL steps per trial")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--no-sequential", action="store_true", help="skip the concurrent-vs-sequential comparison")
    parser.add_argument("--vllm-python", type=Path, help="sample through vLLM (--sampler vllm), with this interpreter")
    parser.add_argument("--plot", type=Path, default=ROOT / "benchmarks" / "results" / "duty_cycle.png")
    args = parser.parse_args()

    from rich.console import Console
    from rich.table import Table

    console = Console(width=120)
    with tempfile.TemporaryDirectory(prefix="duty-cycle-") as scratch:
        folder = Path(scratch)
        config = trial_config(args, folder)
        sampler = {"sampler": "vllm", "vllm_python": args.vllm_python} if args.vllm_python is not None else {}
        server_config = ServerConfig(
            base_model=args.model, device=args.device, storage_root=folder / "backend", port=0, **sampler
        )
        with running_server(server_config) as server:
            server.service.duty_cycle.keep_s = 24 * 3600.0
            scenarios = []
            for trials in args.concurrency:
                with console.status(f"{trials} concurrent trial(s) of {args.steps} steps"):
                    scenarios.append(measure(f"c{trials}", server, config, folder, trials, args.steps))
            sequential = None
            if not args.no_sequential:
                with console.status("3 trials one after another"):
                    sequential = measure("seq3", server, config, folder, 3, args.steps, sequential=True)

    table = Table(
        title=f"{args.model}, {args.steps} RL steps per trial, batch {args.batch_size} × group "
        f"{args.group_size}, {args.max_tokens} tokens, {args.device}"
    )
    for column in ("concurrent trials", "busy fraction", "RL steps / min", "device busy s", "window s", "makespan s"):
        table.add_column(column, justify="right")
    for s in scenarios:
        table.add_row(
            str(s.trials),
            f"{s.busy_fraction:.1%}",
            f"{s.steps_per_minute:.1f}",
            f"{s.busy_s:.1f}",
            f"{s.window_s:.1f}",
            f"{s.makespan_s:.1f}",
        )
    console.print(table)
    concurrent3 = next((s for s in scenarios if s.trials == 3), None)
    if sequential is not None and concurrent3 is not None:
        ideal = max(concurrent3.busy_s, sequential.longest_trial_s)
        console.print(
            f"3 trials concurrently: makespan {concurrent3.makespan_s:.1f} s; one after another: "
            f"{sequential.makespan_s:.1f} s; ratio {concurrent3.makespan_s / sequential.makespan_s:.2f} "
            f"(ideal {ideal / sequential.makespan_s:.2f}: max(device time {concurrent3.busy_s:.1f} s, longest single "
            f"trial {sequential.longest_trial_s:.1f} s)); concurrent makespan ÷ ideal "
            f"{concurrent3.makespan_s / ideal:.2f}"
        )
    shown = [s for s in scenarios if s.trials in (1, 3)] or scenarios
    plot_timelines(shown, args.plot)
    console.print(f"busy timeline: {args.plot}")
    console.print(command_line("benchmarks.duty_cycle"))


if __name__ == "__main__":
    main()
