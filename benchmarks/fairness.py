"""Which tenant goes next, and what one tenant's big evaluation costs another's RL steps.

Run: python -m benchmarks.fairness [--heavy-queue 40] [--light-requests 20] [--work-ms 20]
     python -m benchmarks.fairness --engine [--model google/gemma-3-270m] [--before COMMIT] [--steps 3]

Without `--engine`: the real scheduler and ledger, with device work replaced by a fixed sleep so that only the policy
differs (least recently served, the server's, against first come, first served). A heavy tenant keeps a deep queue
(it submits `--heavy-queue` operations in order, and one more each time one finishes, as an RL loop with many
requests in flight does); a light tenant sends one operation at a time and waits for it, as a loop that samples,
scores and steps does. Reported: the light tenant's wait from submission to start (median and 95th percentile) and
both tenants' share of the device.

With `--engine`: a real server (`python -m trainer_backend serve` of this tree, and of `--before` when given) and the
real engine. Tenant B runs RL steps of the model's trial recipe (8 prompts x 4 completions) alone; tenant A runs the
trial's held-out evaluation of the whole dev split (332 prompts, every one sent at once) alone; then both at once.
Reported: B's median step alone and while A's evaluation runs, A's evaluation alone and beside B, and the backend's
peak resident memory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from autoresearch.sdk_logging import quiet_sdk_logs
from autoresearch.trials.config import TrialConfig, load_trial_config
from autoresearch.trials.evaluation import evaluate_checkpoint
from autoresearch.trials.rl_loop import run_trial
from benchmarks import ROOT
from benchmarks.against_commit import MemoryWatch, compared_trees, server_from
from benchmarks.rl_step import RECIPES, REWARD_WITH_SPREAD
from trainer_backend.ledger import Ledger, ResultFormat
from trainer_backend.models.gemma import GEMMA_3_270M
from trainer_backend.models.registry import default_cache_root, resolve_base_model
from trainer_backend.scheduler import Operation, Scheduler, SchedulingPolicy

TINY_TRIAL = ROOT / "experiments" / "trials" / "text2sql_tiny.yaml"
DEV_QUESTIONS = 332


def run(policy: SchedulingPolicy, heavy_queue: int, light_requests: int, work_s: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="fairness-") as folder:
        ledger = Ledger(Path(folder) / "ledger.sqlite3")
        scheduler = Scheduler(ledger, max_queued=10_000, policy=policy)
        served = {"heavy": 0, "light": 0}
        heavy_seq = iter(range(1, 1_000_000))
        stop = threading.Event()

        def operation(lane: str, seq_id: int, started: list[float] | None) -> Operation:
            record, _ = ledger.submit("bench", "op", f"{lane}-{seq_id}", lane, seq_id)

            def work() -> tuple[bytes, ResultFormat]:
                if started is not None:
                    started.append(time.monotonic())
                time.sleep(work_s)
                served[lane] += 1
                if lane == "heavy" and not stop.is_set():
                    scheduler.submit(operation("heavy", next(heavy_seq), None))
                return b"{}", ResultFormat.JSON

            return Operation(record.request_id, "op", lane, work, seq_id)

        for _ in range(heavy_queue):
            scheduler.submit(operation("heavy", next(heavy_seq), None))
        waits = []
        began = time.monotonic()
        for seq_id in range(1, light_requests + 1):
            started: list[float] = []
            submitted = time.monotonic()
            light = operation("light", seq_id, started)
            scheduler.submit(light)
            while not ledger.get(light.request_id).finished:
                time.sleep(work_s / 10)
            waits.append(started[0] - submitted)
            time.sleep(work_s)  # the light loop's own work (scoring) between requests
        elapsed = time.monotonic() - began
        stop.set()
        scheduler.stop()
        ledger.close()
    total = served["heavy"] + served["light"]
    return {
        "light_wait_p50_ms": 1000 * statistics.median(waits),
        "light_wait_p95_ms": 1000 * statistics.quantiles(waits, n=20)[-1],
        "light_share": served["light"] / total,
        "light_ops_per_s": light_requests / elapsed,
    }


@dataclass(frozen=True)
class EngineFigures:
    b_step_alone_s: float
    b_step_beside_a_s: float
    b_steps_beside_a: int
    a_alone_s: float
    a_beside_b_s: float
    peak_gib: float


def tenant_configs(model: str, steps: int) -> tuple[TrialConfig, TrialConfig]:
    """B's RL recipe (8 prompts x 4 completions, the model's trial prompts) and A's evaluation of the dev split."""
    if model.startswith("tiny-"):
        base = load_trial_config(TINY_TRIAL).model_copy(update={"base_model": model})
        max_tokens = 16
    else:
        folder = resolve_base_model(model, default_cache_root()).folder
        base = load_trial_config(RECIPES[model].trial).model_copy(update={"base_model": str(folder)})
        max_tokens = RECIPES[model].max_tokens
    b = base.model_copy(
        update={
            "steps": steps, "warmup_steps": 0, "batch_size": 8, "group_size": 4, "max_tokens": max_tokens,
            "reward_spec": REWARD_WITH_SPREAD, "eval_size": 1, "eval_interval": 0, "checkpoint_interval": 1000,
        }
    )  # fmt: skip
    return b, base.model_copy(update={"eval_size": DEV_QUESTIONS})


@dataclass(frozen=True)
class Step:
    """One of B's RL steps on the wall clock."""

    started: float
    ended: float

    @property
    def seconds(self) -> float:
        return self.ended - self.started


# How often B's metrics file is read for steps that have just ended: the resolution of a step's end time.
STEP_POLL_S = 0.5


def run_b(config: TrialConfig, url: str, runs: Path, run_id: str) -> list[Step]:
    """One trial of B's RL steps on `url`, each step placed on the wall clock: it ends when its metrics line appears
    (read every STEP_POLL_S) and began its `step_time_s` before."""
    metrics = runs / run_id / "metrics.jsonl"
    ended_at: list[float] = []
    done = threading.Event()

    def watch() -> None:
        while not done.wait(STEP_POLL_S):
            # Whole lines only: one may be half written.
            finished = metrics.read_text().count("\n") if metrics.exists() else 0
            ended_at.extend([time.time()] * (finished - len(ended_at)))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        run_trial(config.model_copy(update={"run_id": run_id}), url, runs, progress=False)
    finally:
        done.set()
        watcher.join()
    lines = metrics.read_text().splitlines()
    ended_at.extend([time.time()] * (len(lines) - len(ended_at)))
    times = [json.loads(line)["step_time_s"] for line in lines]
    return [Step(end - seconds, end) for end, seconds in zip(ended_at, times, strict=True)]


def run_engine(tree: Path, workdir: Path, model: str, steps: int) -> EngineFigures:
    b_config, a_config = tenant_configs(model, steps)
    model_name = b_config.base_model
    with server_from(tree, workdir / "backend", Path(model_name)) as (url, server), MemoryWatch(server) as watch:
        alone = [step.seconds for step in run_b(b_config, url, workdir / "runs", "b-alone")]
        started = time.time()
        evaluate_checkpoint(a_config, url)
        a_alone = time.time() - started

        a_window: list[float] = []

        def evaluate() -> None:
            began = time.time()
            evaluate_checkpoint(a_config, url)
            a_window.extend([began, time.time()])

        a_thread = threading.Thread(target=evaluate)
        a_thread.start()
        beside: list[Step] = []
        trials = 0
        while a_thread.is_alive():
            beside += run_b(b_config, url, workdir / "runs", f"b-beside-{trials}")
            trials += 1
        a_thread.join()
    begin, end = a_window
    # Only B's steps that ran wholly while A's evaluation did.
    during = [step.seconds for step in beside if step.started >= begin and step.ended <= end]
    return EngineFigures(
        b_step_alone_s=statistics.median(alone),
        b_step_beside_a_s=statistics.median(during) if during else float("nan"),
        b_steps_beside_a=len(during),
        a_alone_s=a_alone,
        a_beside_b_s=end - begin,
        peak_gib=watch.peak_bytes / 2**30,
    )


def engine_main(model: str, before: str | None, steps: int) -> None:
    from rich.console import Console
    from rich.table import Table

    quiet_sdk_logs()
    console = Console(width=120)
    table = Table(title=f"tenant B's RL steps (8 x 4) and tenant A's evaluation of {DEV_QUESTIONS} prompts, {model}")
    columns = ("server", "B's step alone", "B's step beside A", "ratio", "A alone", "A beside B", "ratio", "peak")
    for column in columns:
        table.add_column(column, justify="right")
    with tempfile.TemporaryDirectory(prefix="fairness-") as scratch, compared_trees(before, "before") as trees:
        workdir = Path(scratch)
        for tree in trees:
            name = tree.commit or "this tree"
            figures = run_engine(tree.folder, workdir / name.replace(" ", "-"), model, steps)
            # Each server's figures as soon as they exist: a run stopped midway keeps what it measured.
            console.print(f"{name}: {figures}")
            table.add_row(
                name,
                f"{figures.b_step_alone_s:.1f} s",
                f"{figures.b_step_beside_a_s:.1f} s ({figures.b_steps_beside_a} steps)",
                f"{figures.b_step_beside_a_s / figures.b_step_alone_s:.2f}",
                f"{figures.a_alone_s:.1f} s",
                f"{figures.a_beside_b_s:.1f} s",
                f"{figures.a_beside_b_s / figures.a_alone_s:.2f}",
                f"{figures.peak_gib:.1f} GiB",
            )
    console.print(table)
    console.print("command: python -m benchmarks.fairness " + " ".join(sys.argv[1:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heavy-queue", type=int, default=40)
    parser.add_argument("--light-requests", type=int, default=20)
    parser.add_argument("--work-ms", type=float, default=20.0)
    parser.add_argument("--engine", action="store_true", help="the real-engine scenario (tenants A and B)")
    parser.add_argument("--model", default="tiny-gemma3", help=f"with --engine: tiny-gemma3 or {GEMMA_3_270M}")
    parser.add_argument("--before", default=None, help="with --engine: also measure the server of this commit")
    parser.add_argument("--steps", type=int, default=3, help="with --engine: B's RL steps per run")
    args = parser.parse_args()
    if args.engine:
        engine_main(args.model, args.before, args.steps)
        return

    from rich.console import Console
    from rich.table import Table

    console = Console(width=120)
    table = Table(
        title=f"a tenant with {args.heavy_queue} queued operations and one with 1, {args.work_ms:.0f} ms each"
    )
    for column in ("policy", "light tenant wait p50 ms", "p95 ms", "light tenant's device share", "light ops/s"):
        table.add_column(column, justify="right")
    for policy in ("least_recently_served", "fifo"):
        figures = run(policy, args.heavy_queue, args.light_requests, args.work_ms / 1000)
        table.add_row(
            policy,
            f"{figures['light_wait_p50_ms']:.0f}",
            f"{figures['light_wait_p95_ms']:.0f}",
            f"{figures['light_share']:.1%}",
            f"{figures['light_ops_per_s']:.1f}",
        )
    console.print(table)
    console.print("command: python -m benchmarks.fairness " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
