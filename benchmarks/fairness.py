"""Which tenant goes next, and what one tenant's big evaluation costs another's RL steps.

Run: python -m benchmarks.fairness [--heavy-queue 40] [--light-requests 20] [--work-ms 20]
     python -m benchmarks.fairness --engine [--model google/gemma-3-270m] [--before COMMIT] [--steps 3] [--log-dir DIR]
         [--same-key] [--variants no-joining no-nesting no-pause-share-limit no-gathering-window join-within-budget]

Without `--engine`: the real scheduler and ledger, with device work replaced by a fixed sleep so that only the policy
differs (least recently served, the server's, against first come, first served). A heavy tenant keeps a deep queue
(it submits `--heavy-queue` operations in order, and one more each time one finishes, as an RL loop with many
requests in flight does); a light tenant sends one operation at a time and waits for it, as a loop that samples,
scores and steps does. Reported: the light tenant's wait from submission to start (median and 95th percentile) and
both tenants' share of the device.

With `--engine`: a real server (`python -m trainer_backend serve` of this tree, and of `--before` when given) and the
real engine. Tenant B runs a trial of `--steps` RL steps of the model's trial recipe (8 prompts x 4 completions)
alone; tenant A (another API key) runs the trial's held-out evaluation of the whole dev split (332 prompts, every one
sent at once) alone; then both are started at once. Reported: B's median step alone and while A's evaluation runs
(its steps wholly inside A's), A's evaluation alone and beside B (`--same-key`: A under B's key, as a study's
trials and evaluations run, the two runs of one tenant), the makespan of both at once against the sum of the
two alone, the device's busy seconds alone and together (the server's /metrics), the backend's peak resident memory,
and whether the goals hold: B's step beside A at most B_STEP_GOAL times alone, the makespan at most MAKESPAN_GOAL of
the sum alone (sharing the device costs nothing and gains batching's share). `--log-dir` keeps each server's log;
`--variants` also measures this tree's server with a scheduling mechanism set otherwise
(benchmarks/scheduler_variants.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import astuple, dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from autoresearch.sdk_logging import quiet_sdk_logs
from autoresearch.trials.backend import DEFAULT_API_KEY
from autoresearch.trials.config import TrialConfig, load_trial_config
from autoresearch.trials.evaluation import evaluate_checkpoint
from autoresearch.trials.rl_loop import run_trial
from benchmarks import ROOT, command_line
from benchmarks.against_commit import MemoryWatch, compared_trees, server_from
from benchmarks.process_tree import tree_cpu_seconds
from benchmarks.rl_step import RECIPES, REWARD_WITH_SPREAD
from benchmarks.scheduler_variants import add_variants_option
from trainer_backend.ledger import Ledger, ResultFormat
from trainer_backend.models.gemma import GEMMA_3_270M
from trainer_backend.models.qwen import QWEN_2_5_CODER_0_5B_INSTRUCT
from trainer_backend.models.registry import default_cache_root, resolve_base_model
from trainer_backend.operations import Operation
from trainer_backend.scheduler import Scheduler, SchedulingPolicy

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


# Goals of the engine scenario (issue 42): B's RL step beside A's evaluation at most this many times its step alone,
# and the two tenants together within this share of the time they take one after the other.
B_STEP_GOAL = 1.5
MAKESPAN_GOAL = 0.9
# A's key; B's trial uses the default key of a trial. Two keys make two tenants on /metrics; with --same-key A uses
# B's, as a study's trials and evaluations all do, and the two are told apart by run only.
A_API_KEY = "tml-fairness-tenant-a"


@dataclass(frozen=True)
class DeviceCounters:
    """What the server's /metrics counts of the device's work, read at one moment (or the difference of two reads)."""

    busy_s: float  # seconds the device ran operations
    operations: int
    batched_operations: int  # operations that ran in a device call with others
    generated_tokens: int
    trained_tokens: int  # through forward and forward_backward passes

    @classmethod
    def read(cls, url: str) -> DeviceCounters:
        families = {family.name: family for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)}

        def total(name: str, **labels: str) -> float:
            samples = families[name].samples if name in families else []
            return sum(s.value for s in samples if all(s.labels.get(k) == v for k, v in labels.items()))

        return cls(
            busy_s=total("trainer_device_busy_seconds"),
            operations=int(total("trainer_operations")),
            batched_operations=int(total("trainer_batched_operations")),
            generated_tokens=int(total("trainer_tokens", phase="sampled")),
            trained_tokens=int(total("trainer_tokens", phase="trained")),
        )

    def __sub__(self, earlier: DeviceCounters) -> DeviceCounters:
        return DeviceCounters(*(mine - theirs for mine, theirs in zip(astuple(self), astuple(earlier), strict=True)))

    def __add__(self, other: DeviceCounters) -> DeviceCounters:
        return DeviceCounters(*(mine + theirs for mine, theirs in zip(astuple(self), astuple(other), strict=True)))


def preemptions(pid: int) -> int:
    """Times the threads of process `pid` were taken off a core against their will (Linux's nonvoluntary context
    switches): on a CPU shared with other processes, how often the device's work was interrupted."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        total += int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0])
    return total


@dataclass(frozen=True)
class Phase:
    """One phase of the scenario: its wall time, the device's work in it, the CPU seconds the server and the clients
    (this process and its workers) used, and how often the server's threads were preempted."""

    wall_s: float
    device: DeviceCounters
    server_cpu_s: float
    client_cpu_s: float
    server_preemptions: int


@dataclass(frozen=True)
class EngineFigures:
    b_alone: Phase  # B's whole trial alone
    b_steps_alone: tuple[float, ...]
    a_alone: Phase  # A's whole evaluation alone
    together: Phase  # both at once, from their start to the later one's end (the makespan)
    a_beside_b_s: float
    b_beside_a_s: float  # B's whole trial beside A
    b_steps_beside_a: tuple[float, ...]  # B's steps that ran wholly while A's evaluation did
    peak_gib: float

    @property
    def b_step_ratio(self) -> float:
        if not self.b_steps_beside_a:
            return float("nan")
        return statistics.median(self.b_steps_beside_a) / statistics.median(self.b_steps_alone)

    @property
    def sum_alone_s(self) -> float:
        return self.a_alone.wall_s + self.b_alone.wall_s

    @property
    def makespan_ratio(self) -> float:
        return self.together.wall_s / self.sum_alone_s

    @property
    def passed(self) -> dict[str, bool]:
        return {
            f"B's step beside A <= {B_STEP_GOAL}x alone": self.b_step_ratio <= B_STEP_GOAL,
            f"makespan <= {MAKESPAN_GOAL} of the sum alone": self.makespan_ratio <= MAKESPAN_GOAL,
        }


def recipe_trial(model: str) -> tuple[TrialConfig, int]:
    """The model's trial recipe (the tiny trial for a tiny model) on its converted weights, and the completion length
    its benchmarks sample."""
    if model.startswith("tiny-"):
        return load_trial_config(TINY_TRIAL).model_copy(update={"base_model": model}), 16
    folder = resolve_base_model(model, default_cache_root()).folder
    recipe = RECIPES[model]
    return load_trial_config(recipe.trial).model_copy(update={"base_model": str(folder)}), recipe.max_tokens


def tenant_configs(model: str, steps: int) -> tuple[TrialConfig, TrialConfig]:
    """B's RL recipe (8 prompts x 4 completions, the model's trial prompts) and A's evaluation of the dev split."""
    base, max_tokens = recipe_trial(model)
    b = base.model_copy(
        update={
            "steps": steps, "warmup_steps": 0, "batch_size": 8, "group_size": 4, "max_tokens": max_tokens,
            "reward_spec": REWARD_WITH_SPREAD, "eval_size": 1, "eval_interval": 0, "checkpoint_interval": 1000,
        }
    )  # fmt: skip
    # A's evaluation batches, as when docs/performance.md's figures were measured: what this measures is how a batched
    # evaluation and RL steps share the device (a batch-invariant one shares no batch: benchmarks.batch_invariance).
    return b, base.model_copy(update={"eval_size": DEV_QUESTIONS, "eval_batch_invariant": False})


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


def timed(work: Callable[[], object]) -> tuple[float, float]:
    """Run `work`; when it began and ended on the wall clock."""
    began = time.time()
    work()
    return began, time.time()


def run_engine(
    tree: Path,
    workdir: Path,
    model: str,
    steps: int,
    launcher: Sequence[str] = ("trainer_backend",),
    a_api_key: str = A_API_KEY,
) -> EngineFigures:
    """B's trial alone, A's evaluation alone, then both started at once; each phase's wall time and device work.
    `launcher`: the module that serves (`benchmarks.scheduler_variants` and a variant's name, for a variant).
    `a_api_key`: A's key (B's trial uses a trial's default key)."""
    b_config, a_config = tenant_configs(model, steps)
    runs = workdir / "runs"
    serving = server_from(tree, workdir / "backend", Path(b_config.base_model), launcher)
    with serving as (url, server), MemoryWatch(server) as watch:

        def cpu_seconds() -> tuple[float, float]:
            """The server's, and the clients' (this process and its other children: the server is one of them)."""
            server_s = tree_cpu_seconds(server.pid)
            return server_s, tree_cpu_seconds(os.getpid()) - server_s

        def phase(work: Callable[[], object]) -> Phase:
            before, (server_cpu, client_cpu), preempted = (
                DeviceCounters.read(url),
                cpu_seconds(),
                preemptions(server.pid),
            )
            began, ended = timed(work)
            server_after, client_after = cpu_seconds()
            return Phase(
                ended - began,
                DeviceCounters.read(url) - before,
                server_after - server_cpu,
                client_after - client_cpu,
                preemptions(server.pid) - preempted,
            )

        b_steps_alone: list[Step] = []
        b_alone = phase(lambda: b_steps_alone.extend(run_b(b_config, url, runs, "b-alone")))
        a_alone = phase(lambda: evaluate_checkpoint(a_config, url, api_key=a_api_key))

        windows: dict[str, tuple[float, float]] = {}
        b_steps_beside: list[Step] = []

        def both() -> None:
            def a() -> None:
                windows["a"] = timed(lambda: evaluate_checkpoint(a_config, url, api_key=a_api_key))

            def b() -> None:
                windows["b"] = timed(lambda: b_steps_beside.extend(run_b(b_config, url, runs, "b-beside-a")))

            tenants = [threading.Thread(target=a), threading.Thread(target=b)]
            for tenant in tenants:
                tenant.start()
            for tenant in tenants:
                tenant.join()
            if len(windows) < 2:
                raise RuntimeError("a tenant failed beside the other; the server log has the reason")

        together = phase(both)
    a_began, a_ended = windows["a"]
    return EngineFigures(
        b_alone=b_alone,
        b_steps_alone=tuple(step.seconds for step in b_steps_alone),
        a_alone=a_alone,
        together=together,
        a_beside_b_s=a_ended - a_began,
        b_beside_a_s=windows["b"][1] - windows["b"][0],
        b_steps_beside_a=tuple(s.seconds for s in b_steps_beside if s.started >= a_began and s.ended <= a_ended),
        peak_gib=watch.peak_bytes / 2**30,
    )


def engine_main(
    model: str, before: str | None, steps: int, log_dir: Path | None, variants: Sequence[str], same_key: bool
) -> None:
    from rich.console import Console
    from rich.table import Table

    quiet_sdk_logs()
    console = Console(width=140)
    keys = "one key" if same_key else "two keys"
    table = Table(
        title=f"tenant B's trial ({steps} RL steps of 8 x 4), tenant A's {DEV_QUESTIONS}-prompt evaluation, {keys}, "
        f"{model}"
    )
    columns = (
        "server", "B's step alone", "beside A", "ratio", "A alone", "beside B", "B's trial alone", "beside A",
        "both at once", "÷ sum alone", "device s alone / together", "peak",
    )  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right")
    verdicts: list[str] = []
    with tempfile.TemporaryDirectory(prefix="fairness-") as scratch, compared_trees(before, "before") as trees:
        workdir = Path(scratch)
        # Each server in turn: the commit's, this tree's, then this tree's with each variant.
        servers = [(tree.commit or "this tree", tree.folder, ("trainer_backend",)) for tree in trees]
        servers += [(variant, ROOT, ("benchmarks.scheduler_variants", variant)) for variant in variants]
        for name, tree_folder, launcher in servers:
            folder = workdir / name.replace(" ", "-")
            try:
                a_key = DEFAULT_API_KEY if same_key else A_API_KEY
                figures = run_engine(tree_folder, folder, model, steps, launcher, a_key)
            finally:
                if log_dir is not None:
                    log_dir.mkdir(parents=True, exist_ok=True)
                    shutil.copy(folder / "backend" / "server.log", log_dir / f"{name.replace(' ', '-')}.log")
            device_alone = figures.a_alone.device + figures.b_alone.device
            cells = (
                name,
                f"{statistics.median(figures.b_steps_alone):.1f} s",
                f"{statistics.median(figures.b_steps_beside_a):.1f} s ({len(figures.b_steps_beside_a)})"
                if figures.b_steps_beside_a
                else "no step wholly beside A",
                f"{figures.b_step_ratio:.2f}",
                f"{figures.a_alone.wall_s:.1f} s",
                f"{figures.a_beside_b_s:.1f} s",
                f"{figures.b_alone.wall_s:.1f} s",
                f"{figures.b_beside_a_s:.1f} s",
                f"{figures.together.wall_s:.1f} s",
                f"{figures.makespan_ratio:.2f}",
                f"{device_alone.busy_s:.0f} / {figures.together.device.busy_s:.0f}",
                f"{figures.peak_gib:.1f} GiB",
            )
            # Each server's figures as soon as they exist: a run stopped midway keeps what it measured.
            console.print(" | ".join(cells))
            table.add_row(*cells)
            verdicts += [f"{name}: {goal}: {'pass' if ok else 'FAIL'}" for goal, ok in figures.passed.items()]
            together = figures.together.device
            verdicts.append(
                f"{name}: alone, one after the other: {device_alone.operations} operations "
                f"({device_alone.batched_operations} batched), {device_alone.generated_tokens:,} tokens generated, "
                f"{device_alone.trained_tokens:,} trained; together: {together.operations} "
                f"({together.batched_operations}), {together.generated_tokens:,}, {together.trained_tokens:,}; "
                f"device busy {together.busy_s / figures.together.wall_s:.0%} of the makespan"
            )
            alone_phases = (figures.b_alone, figures.a_alone)
            verdicts.append(
                f"{name}: CPU seconds, server / clients: alone {sum(p.server_cpu_s for p in alone_phases):.0f} / "
                f"{sum(p.client_cpu_s for p in alone_phases):.0f}, together {figures.together.server_cpu_s:.0f} / "
                f"{figures.together.client_cpu_s:.0f}; the server's threads preempted "
                f"{sum(p.server_preemptions for p in alone_phases):,} times alone, "
                f"{figures.together.server_preemptions:,} together"
            )
    console.print(table)
    for line in verdicts:
        console.print(line)
    console.print(command_line("benchmarks.fairness"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heavy-queue", type=int, default=40)
    parser.add_argument("--light-requests", type=int, default=20)
    parser.add_argument("--work-ms", type=float, default=20.0)
    parser.add_argument("--engine", action="store_true", help="the real-engine scenario (tenants A and B)")
    parser.add_argument(
        "--model",
        default="tiny-gemma3",
        help=f"with --engine: tiny-gemma3, {GEMMA_3_270M} or {QWEN_2_5_CODER_0_5B_INSTRUCT}",
    )
    parser.add_argument("--before", default=None, help="with --engine: also measure the server of this commit")
    parser.add_argument("--steps", type=int, default=3, help="with --engine: B's RL steps per trial")
    parser.add_argument("--log-dir", type=Path, default=None, help="with --engine: keep each server's log here")
    parser.add_argument(
        "--same-key",
        action="store_true",
        help="with --engine: A's evaluation under B's key, as a study's trials run (two runs of one tenant)",
    )
    add_variants_option(parser, "with --engine: ")
    args = parser.parse_args()
    if args.engine:
        engine_main(args.model, args.before, args.steps, args.log_dir, args.variants, args.same_key)
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
    console.print(command_line("benchmarks.fairness"))


if __name__ == "__main__":
    main()
