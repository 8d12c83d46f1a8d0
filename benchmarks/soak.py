"""A soak with a crash in the middle: many tenants on one backend for a while, the backend killed and restarted.

Run: python -m benchmarks.soak [--model Qwen/Qwen2.5-Coder-0.5B-Instruct] [--minutes 30] [--tenants 3 2 1]
     [--kill-at 0.5] [--log-dir DIR]

`python -m trainer_backend serve` of the model (this tree's code) on a loopback port, and tenants on API keys of their
own (benchmarks/soak_tenants.py): `--tenants RL EVAL CHECKPOINTS`, by default three running small RL steps through
the `tinker` SDK, two evaluating through the OpenAI-compatible /v1/completions with 16 requests in flight each (the
first on the base model, the second on an adapter it saved, and so on alternately), and one saving, loading and
deleting checkpoints against its key's storage quota. At `--kill-at` of the run the backend is killed (SIGKILL) and
started again on the same storage root and port: the RL tenants resume from their last saved state, the others carry
on, each retrying connection errors while the backend is down. The outage does not count toward `--minutes`: the
tenants stop that long after they started plus the time from the kill to the restarted backend's health.

Before the soak, on a first start of the same server: one save measures a training state's bytes (the storage quota,
`--max-storage-bytes-per-key`, is set to QUOTA_STATES of them, then the server is restarted with it), and one
evaluating tenant runs alone for ALONE_SHARE of the soak's length: the throughput the evaluating tenants are compared
with.

Prints per tenant: requests sent and how they ended (answered, refused, failed by name by the restart, connection
errors retried, 5xx, lost: no answer at all), its share of the device (the server's /metrics), p50 / p99 latency of
its answered requests, RL steps and resumes; then the goals, each met or not: nothing lost, no 5xx (the clients' and
the server's access log), the evaluating tenants' throughput together against one alone, their device shares
against each other in every sampled window, the backend's peak memory (its process tree, /proc), its memory at the
end against the start, and the time from the kill to the first answered request after it.
"""

from __future__ import annotations

import argparse
import logging
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import httpx
import tinker
from prometheus_client.parser import text_string_to_metric_families

from autoresearch.sdk_logging import quiet_sdk_logs
from autoresearch.trials.backend import free_port
from benchmarks import ROOT, command_line
from benchmarks.against_commit import start_server
from benchmarks.periodic import Periodic
from benchmarks.process_tree import tree_rss_bytes
from benchmarks.soak_tenants import (
    LORA_RANK,
    Deadline,
    EvalShape,
    Outcome,
    Request,
    RlShape,
    TenantLog,
    checkpoint_tenant,
    evaluating_tenant,
    rl_tenant,
    saved_adapter,
    train_once,
)
from trainer_backend.auth import owner_of_key
from trainer_backend.models.qwen import QWEN_2_5_CODER_0_5B_INSTRUCT
from trainer_backend.models.registry import default_cache_root, resolve_base_model
from trainer_backend.tenant_usage import tenant_label

# Goals (issue 42 §4).
PEAK_MEMORY_GOAL_GIB = 8.0
MEMORY_DRIFT_GOAL = 0.10  # the memory at the end within this share of the start
EVAL_THROUGHPUT_GOAL = 0.8  # the evaluating tenants together against one alone
EVAL_SHARE_GOAL = 0.6  # the smaller evaluating tenant's device seconds against the larger's, in every window

# The storage quota in training states (adapter and optimizer) of the soak's LoRA rank: the checkpoint tenant fills it
# every few saves; an RL tenant keeps two states and two sampler saves, well within it.
QUOTA_STATES = 4.5
# The phase of one evaluating tenant alone, as a share of the soak's length (at least ALONE_MIN_S).
ALONE_SHARE = 0.1
ALONE_MIN_S = 5.0
# The memory at the start and at the end: the median of the samples in a window of this share of the soak, the first
# after one such window of warm-up (the tenants' adapters and sampler weights loaded, the first batches run) and the
# last.
MEMORY_WINDOW_SHARE = 0.1
MEMORY_SAMPLE_S = 0.5


@dataclass(frozen=True)
class SoakSettings:
    model: str = QWEN_2_5_CODER_0_5B_INSTRUCT
    minutes: float = 30.0
    rl_tenants: int = 3
    eval_tenants: int = 2
    checkpoint_tenants: int = 1
    kill_at: float = 0.5  # share of the soak after which the backend is killed
    in_flight: int = 16  # requests each evaluating tenant keeps in flight
    log_dir: Path | None = None  # keep the backend's storage and log here


@dataclass(frozen=True)
class ModelShape:
    """How big each tenant's work is on a model: small on the tiny one, near a real recipe's on a real one."""

    rl: RlShape
    eval_max_tokens: int
    checkpoint_period_s: float  # between the checkpoint tenant's saves
    share_window_s: float  # how often the device's use by tenant is read


def shape_for(model: str) -> ModelShape:
    if model.startswith("tiny-"):
        return ModelShape(RlShape(prompts=2, group=4, max_tokens=16, checkpoint_every=2), 16, 0.3, 2.0)
    return ModelShape(RlShape(prompts=4, group=4, max_tokens=48, checkpoint_every=2), 48, 5.0, 15.0)


class Backend:
    """The soak's server: its lives on one port and one storage root, each started with the same flags."""

    def __init__(self, model: str, storage: Path) -> None:
        self.model, self.storage = model, storage
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.options: list[str] = []
        self.process: subprocess.Popen | None = None
        self.lives = 0

    def start(self) -> None:
        self.lives += 1  # first: a reading of /metrics once it answers belongs to the new life
        self.process = start_server(ROOT, self.storage, Path(self.model), self.port, options=self.options)

    def kill(self) -> None:
        """SIGKILL: nothing of the server's shutdown runs, as when a node dies or the OOM killer strikes."""
        self.process.kill()
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=60)

    def pid(self) -> int | None:
        process = self.process
        return process.pid if process is not None and process.poll() is None else None


@dataclass(frozen=True)
class DeviceReading:
    at: float
    life: int
    seconds: dict[str, float]  # device seconds by tenant name, since the life started


def read_device_seconds(backend: Backend, labels: dict[str, str]) -> DeviceReading | None:
    """Each tenant's device seconds from the server's /metrics; None while it cannot be reached."""
    life = backend.lives
    try:
        text = httpx.get(f"{backend.url}/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    by_label = {
        sample.labels["tenant"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "trainer_tenant_device_seconds"
        for sample in family.samples
    }
    return DeviceReading(time.time(), life, {name: by_label.get(label, 0.0) for name, label in labels.items()})


class Watch(Periodic):
    """Samples the backend's memory every MEMORY_SAMPLE_S and the tenants' device seconds every `window_s`, whichever
    life of the backend is running, until stopped."""

    def __init__(self, backend: Backend, labels: dict[str, str], window_s: float) -> None:
        super().__init__(interval_s=MEMORY_SAMPLE_S)
        self.backend, self.labels, self.window_s = backend, labels, window_s
        self.memory: list[tuple[float, int]] = []
        self.device: list[DeviceReading] = []
        self._next_reading = time.time()

    def tick(self) -> bool:
        pid = self.backend.pid()
        if pid is not None:
            self.memory.append((time.time(), tree_rss_bytes(pid)))
        if time.time() >= self._next_reading:
            self.read_device()
            self._next_reading += self.window_s
        return True

    def read_device(self) -> None:
        reading = read_device_seconds(self.backend, self.labels)
        if reading is not None:
            self.device.append(reading)


@dataclass(frozen=True)
class Kill:
    at: float  # when SIGKILL was sent
    healthy_at: float  # when the restarted backend answered /healthz
    steps_at_kill: dict[str, int]  # each RL tenant's step then


@dataclass
class SoakReport:
    settings: SoakSettings
    tenants: list[TenantLog]
    started: float  # the soak's start (after the phase alone)
    until: float  # when the tenants stopped sending
    kill: Kill
    alone_tokens_per_s: float
    quota_bytes: int
    memory: list[tuple[float, int]]
    device: list[DeviceReading]
    server_5xx: int  # 5xx answers in the server's access log, every life
    goals: dict[str, bool] = field(default_factory=dict)

    def requests(self, *outcomes: Outcome) -> list[Request]:
        """Every tenant's requests, or those that ended in one of `outcomes`."""
        return [r for t in self.tenants for r in t.requests if not outcomes or r.outcome in outcomes]

    @property
    def lost(self) -> int:
        return len(self.requests(Outcome.LOST))

    @property
    def answered_5xx(self) -> int:
        return max(len(self.requests(Outcome.SERVER_ERROR)), self.server_5xx)

    def device_seconds(self) -> dict[str, float]:
        """Each tenant's device seconds over the soak: the last reading of each life of the backend, summed."""
        last_of_life = {reading.life: reading for reading in self.device}
        names = [t.name for t in self.tenants]
        return {name: sum(reading.seconds.get(name, 0.0) for reading in last_of_life.values()) for name in names}

    def eval_share_ratios(self) -> list[tuple[float, float]]:
        """In each window between two readings of one life (before the tenants stopped), the smallest evaluating
        tenant's device seconds against the largest's, with the window's end. Left out: windows in which none ran,
        and the short one that the reading just before the kill cuts off (a window of a few decode steps says
        nothing of shares)."""
        names = [t.name for t in self.tenants if t.role.startswith("eval-")]
        shortest = shape_for(self.settings.model).share_window_s / 2
        ratios = []
        for before, after in zip(self.device, self.device[1:], strict=False):
            if before.life != after.life or after.at > self.until or after.at - before.at < shortest:
                continue
            used = [after.seconds[name] - before.seconds[name] for name in names]
            if len(names) > 1 and max(used) > 0:
                ratios.append((after.at, min(used) / max(used)))
        return ratios

    @property
    def serving_s(self) -> float:
        """The soak's length without the backend's outage."""
        return (self.until - self.started) - (self.kill.healthy_at - self.kill.at)

    def eval_tokens_per_s(self) -> dict[str, float]:
        return {
            t.name: sum(r.tokens for r in t.requests if r.outcome is Outcome.ANSWERED and r.ended <= self.until)
            / self.serving_s
            for t in self.tenants
            if t.role.startswith("eval-")
        }

    def memory_at(self, start: float, end: float) -> float:
        values = [rss for at, rss in self.memory if start <= at <= end]
        return statistics.median(values) if values else float("nan")

    @property
    def memory_start_end(self) -> tuple[float, float]:
        window = max(1.0, MEMORY_WINDOW_SHARE * (self.until - self.started))
        start = self.memory_at(self.started + window, self.started + 2 * window)
        return start, self.memory_at(self.until - window, self.until)

    @property
    def first_answer_after_kill_s(self) -> float:
        # Sent after the kill, or ended once the new backend was healthy: an answer of the killed backend recorded a
        # moment after the kill's time was taken is neither.
        ended = [
            r.ended for r in self.requests(Outcome.ANSWERED) if r.sent > self.kill.at or r.ended > self.kill.healthy_at
        ]
        return min(ended) - self.kill.at if ended else float("nan")

    def resumed_from_checkpoint(self, tenant: TenantLog) -> bool:
        """An RL tenant resumed after the kill from the last state it saved before, and stepped on past the kill."""
        after = [resume for resume in tenant.resumes if resume.at > self.kill.at]
        saved_before = [step for at, step in tenant.saved_steps if at < self.kill.at]
        if not after or not saved_before:
            return False
        return after[0].from_step == saved_before[-1] and tenant.step > self.kill.steps_at_kill[tenant.name]

    def answered_after_restart(self, tenant: TenantLog) -> bool:
        return any(r.outcome is Outcome.ANSWERED and r.sent >= self.kill.healthy_at for r in tenant.requests)

    def evaluate_goals(self) -> None:
        tokens = self.eval_tokens_per_s()
        ratios = self.eval_share_ratios()
        start, end = self.memory_start_end
        peak = max((rss for _, rss in self.memory), default=0)
        rl = [t for t in self.tenants if t.role == "rl"]
        self.goals = {"requests lost: 0": self.lost == 0, "answered 5xx: 0": self.answered_5xx == 0}
        if tokens:
            self.goals[f"evaluating tenants' throughput together >= {EVAL_THROUGHPUT_GOAL} of one alone"] = (
                sum(tokens.values()) >= EVAL_THROUGHPUT_GOAL * self.alone_tokens_per_s
            )
        if len(tokens) > 1:
            self.goals[f"evaluating tenants' device shares >= {EVAL_SHARE_GOAL} of each other in every window"] = (
                bool(ratios) and min(ratio for _, ratio in ratios) >= EVAL_SHARE_GOAL
            )
        self.goals |= {
            f"backend peak memory <= {PEAK_MEMORY_GOAL_GIB:g} GiB": peak <= PEAK_MEMORY_GOAL_GIB * 2**30,
            f"backend memory at the end within {MEMORY_DRIFT_GOAL:.0%} of the start": abs(end - start)
            <= MEMORY_DRIFT_GOAL * start,
            "every RL tenant resumed from its last checkpoint and stepped on": all(
                map(self.resumed_from_checkpoint, rl)
            ),
            "every tenant answered after the restart": all(map(self.answered_after_restart, self.tenants)),
        }


def server_5xx(log_path: Path) -> int:
    """5xx answers in the server's access log (uvicorn's `"POST /path HTTP/1.1" 500 …` lines)."""
    if not log_path.exists():
        return 0
    return len(re.findall(r'HTTP/[\d.]+" 5\d\d\b', log_path.read_text(errors="replace")))


def checkpoint_bytes(url: str, base_model: str) -> int:
    """The bytes of one training state (adapter and optimizer) of the soak's LoRA rank, as the server counts them."""
    log = TenantLog("calibration", "calibration", "tml-soak-calibration")
    with tinker.ServiceClient(base_url=url, api_key=log.key) as service:
        training = log.result("create", service.create_lora_training_client(base_model=base_model, rank=LORA_RANK))
        train_once(log, training)
        log.result("save_state", training.save_state("measured"))
    status = httpx.get(f"{url}/api/v1/status", headers={"X-API-Key": log.key}, timeout=30).json()
    return int(status["usage"]["storage_bytes"])


def run_tenants(targets: Sequence[tuple[TenantLog, Callable[[], None]]]) -> list[threading.Thread]:
    """Each tenant on a thread of its own; an error that ends one early is kept in its log."""

    def run(tenant: TenantLog, target: Callable[[], None]) -> None:
        try:
            target()
        except Exception as error:
            tenant.crashed = f"{type(error).__name__}: {error}"

    threads = [threading.Thread(target=run, args=pair, daemon=True) for pair in targets]
    for thread in threads:
        thread.start()
    return threads


def run_soak(settings: SoakSettings, status: Callable[[str], None] = lambda _: None) -> SoakReport:
    """The soak of `settings`, from the server's first start to its stop; `status` is told each phase."""
    quiet_sdk_logs()
    # The SDK logs each request the restart failed as an error; the report counts them.
    logging.getLogger("tinker.lib.retry_handler").setLevel(logging.CRITICAL)
    shape = shape_for(settings.model)
    base_model = settings.model
    if not base_model.startswith("tiny-"):
        base_model = str(resolve_base_model(settings.model, default_cache_root()).folder)
    scratch = None
    if settings.log_dir is None:
        scratch = tempfile.mkdtemp(prefix="soak-")
        storage = Path(scratch) / "backend"
    else:
        storage = settings.log_dir / "backend"
    duration = settings.minutes * 60
    backend = Backend(base_model, storage)
    tenants = [TenantLog(f"rl-{i + 1}", "rl", f"tml-soak-rl-{i + 1}") for i in range(settings.rl_tenants)]
    tenants += [
        TenantLog(f"eval-{i + 1}", "eval-adapter" if i % 2 else "eval-base", f"tml-soak-eval-{i + 1}")
        for i in range(settings.eval_tenants)
    ]
    tenants += [
        TenantLog(f"checkpoints-{i + 1}", "checkpoints", f"tml-soak-checkpoints-{i + 1}")
        for i in range(settings.checkpoint_tenants)
    ]
    labels = {t.name: tenant_label(owner_of_key(t.key)) for t in tenants}
    eval_shape = EvalShape(settings.in_flight, shape.eval_max_tokens)
    try:
        with Watch(backend, labels, shape.share_window_s) as watch:
            status("starting the backend")
            backend.start()
            status("measuring a training state's bytes")
            quota = int(QUOTA_STATES * checkpoint_bytes(backend.url, base_model))
            alone_s = max(ALONE_MIN_S, ALONE_SHARE * duration)
            status(f"one evaluating tenant alone for {alone_s:.0f} s")
            alone = TenantLog("eval-alone", "eval-alone", "tml-soak-eval-alone")
            alone_began = time.time()
            evaluating_tenant(alone, backend.url, base_model, eval_shape, Deadline(alone_began + alone_s))
            alone_tokens = sum(r.tokens for r in alone.requests if r.outcome is Outcome.ANSWERED)
            alone_tokens_per_s = alone_tokens / (time.time() - alone_began)

            status("restarting the backend with the storage quota")
            backend.stop()
            backend.options = ["--max-storage-bytes-per-key", str(quota)]
            backend.start()
            models = {t.name: base_model for t in tenants if t.role == "eval-base"}
            models |= {t.name: saved_adapter(t, backend.url, base_model) for t in tenants if t.role == "eval-adapter"}

            started = time.time()
            until = Deadline(started + duration)
            targets: list[tuple[TenantLog, Callable[[], None]]] = []
            for seed, tenant in enumerate(tenants):
                if tenant.role == "rl":
                    work = partial(rl_tenant, tenant, backend.url, base_model, shape.rl, seed, until)
                elif tenant.role == "checkpoints":
                    work = partial(checkpoint_tenant, tenant, backend.url, base_model, shape.checkpoint_period_s, until)
                else:
                    work = partial(evaluating_tenant, tenant, backend.url, models[tenant.name], eval_shape, until)
                targets.append((tenant, work))
            threads = run_tenants(targets)
            status(f"{len(tenants)} tenants for {duration:.0f} s; the backend is killed after {settings.kill_at:.0%}")
            time.sleep(max(0.0, started + settings.kill_at * duration - time.time()))
            steps_at_kill = {t.name: t.step for t in tenants if t.role == "rl"}
            watch.read_device()  # the killed life's last reading
            # The soak serves `duration` seconds however long the restart takes.
            until.pause()
            killed_at = time.time()
            backend.kill()
            status("the backend was killed; restarting it")
            try:
                backend.start()
            finally:  # a restart that fails must not leave the tenants running on
                until.resume()
            kill = Kill(killed_at, time.time(), steps_at_kill)
            status("tenants carrying on after the restart")
            for thread in threads:
                thread.join()
            watch.read_device()
        report = SoakReport(
            settings=settings,
            tenants=tenants,
            started=started,
            until=until.at,
            kill=kill,
            alone_tokens_per_s=alone_tokens_per_s,
            quota_bytes=quota,
            memory=watch.memory,
            device=sorted(watch.device, key=lambda reading: reading.at),
            server_5xx=server_5xx(storage / "server.log"),
        )
        report.evaluate_goals()
        return report
    finally:
        backend.stop()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def percentile(values: Sequence[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def print_report(report: SoakReport, console) -> None:
    from rich.table import Table

    settings = report.settings
    device = report.device_seconds()
    total_device = sum(device.values()) or 1.0
    table = Table(
        title=f"soak: {len(report.tenants)} tenants on {settings.model}, {settings.minutes:g} min, backend killed at "
        f"{settings.kill_at:.0%}"
    )
    columns = ("tenant", "sent", "answered", "refused", "cut off", "conn. errors", "5xx", "lost", "device share")
    for column in (*columns, "p50 s", "p99 s", "steps"):
        table.add_column(column, justify="left" if column == "tenant" else "right")
    for tenant in report.tenants:
        counts = {outcome: sum(1 for r in tenant.requests if r.outcome is outcome) for outcome in Outcome}
        latencies = [r.seconds for r in tenant.requests if r.outcome is Outcome.ANSWERED]
        steps = ""
        if tenant.role == "rl":
            resumed = ", ".join(f"{r.from_step}" for r in tenant.resumes) or "none"
            steps = f"{tenant.step} (killed at {report.kill.steps_at_kill[tenant.name]}, resumed from {resumed})"
        elif tenant.role == "checkpoints":
            steps = f"quota refused {tenant.quota_refusals} saves"
        table.add_row(
            f"{tenant.name} ({tenant.role})",
            str(len(tenant.requests)),
            str(counts[Outcome.ANSWERED]),
            str(counts[Outcome.REFUSED]),
            str(counts[Outcome.CUT_OFF]),
            f"{counts[Outcome.CONNECTION_ERROR] + tenant.connection_retries}",
            str(counts[Outcome.SERVER_ERROR]),
            str(counts[Outcome.LOST]),
            f"{device[tenant.name] / total_device:.1%}",
            f"{percentile(latencies, 0.5):.2f}",
            f"{percentile(latencies, 0.99):.2f}",
            steps,
        )
    console.print(table)

    tokens = report.eval_tokens_per_s()
    ratios = report.eval_share_ratios()
    start, end = report.memory_start_end
    peak = max((rss for _, rss in report.memory), default=0)
    together = sum(tokens.values())
    lowest_at, lowest = min(ratios, key=lambda window: window[1], default=(float("nan"), float("nan")))
    lowest_at -= report.started
    lines = [
        f"requests sent {len(report.requests())}, lost {report.lost}, answered 5xx {report.answered_5xx} "
        f"(the server's access log: {report.server_5xx})",
        f"evaluating tenants: {', '.join(f'{name} {rate:.1f}' for name, rate in tokens.items())} tokens/s "
        f"(together {together:.1f}) against {report.alone_tokens_per_s:.1f} alone: "
        f"{together / report.alone_tokens_per_s if report.alone_tokens_per_s else float('nan'):.2f}",
        f"their device shares against each other: lowest {lowest:.2f} (the window ending {lowest_at:.0f} s into the "
        f"soak) over {len(ratios)} windows of {shape_for(settings.model).share_window_s:g} s",
        f"backend memory (process tree): peak {peak / 2**30:.2f} GiB; start {start / 2**30:.2f} GiB, end "
        f"{end / 2**30:.2f} GiB ({(end - start) / start:+.1%})",
        f"kill -> restarted backend healthy {report.kill.healthy_at - report.kill.at:.1f} s; kill -> first answered "
        f"request {report.first_answer_after_kill_s:.1f} s",
        f"storage quota per key {report.quota_bytes:,} bytes ({QUOTA_STATES:g} training states)",
    ]
    for line in lines:
        console.print(line)
    for goal, met in report.goals.items():
        console.print(f"{goal}: {'met' if met else '[red]not met[/red]'}")
    errors = [f"{t.name} {r.kind}: {r.error}" for t in report.tenants for r in t.requests if r.outcome is Outcome.LOST]
    for error in errors[:5]:
        console.print(f"[red]lost: {error}[/red]")
    for tenant in report.tenants:
        if tenant.crashed:
            console.print(f"[red]{tenant.name} stopped early: {tenant.crashed}[/red]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=QWEN_2_5_CODER_0_5B_INSTRUCT, help="base model (tiny-gemma3 for a check)")
    parser.add_argument("--minutes", type=float, default=30.0, help="the soak's length, without the phase alone")
    parser.add_argument(
        "--tenants",
        type=int,
        nargs=3,
        default=(3, 2, 1),
        metavar=("RL", "EVAL", "CHECKPOINTS"),
        help="tenants running RL steps, evaluating through /v1, saving checkpoints",
    )
    parser.add_argument(
        "--kill-at", type=float, default=0.5, help="share of the soak after which the backend is killed"
    )
    parser.add_argument("--in-flight", type=int, default=16, help="requests each evaluating tenant keeps in flight")
    parser.add_argument("--log-dir", type=Path, default=None, help="keep the backend's storage and log here")
    args = parser.parse_args()
    if not 0 < args.kill_at < 1:
        parser.error(f"--kill-at must be between 0 and 1 (a share of the soak), not {args.kill_at}")
    rl, evaluating, checkpoints = args.tenants
    settings = SoakSettings(
        model=args.model,
        minutes=args.minutes,
        rl_tenants=rl,
        eval_tenants=evaluating,
        checkpoint_tenants=checkpoints,
        kill_at=args.kill_at,
        in_flight=args.in_flight,
        log_dir=args.log_dir,
    )

    from rich.console import Console

    console = Console(width=160)
    with console.status("soak") as shown:
        report = run_soak(settings, lambda phase: shown.update(f"soak: {phase}"))
    print_report(report, console)
    console.print(command_line("benchmarks.soak"))


if __name__ == "__main__":
    main()
