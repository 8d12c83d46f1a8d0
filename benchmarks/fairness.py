"""Which tenant goes next: least recently served (the server's policy) against first come, first served.

Run: python benchmarks/fairness.py [--heavy-queue 40] [--light-requests 20] [--work-ms 20]

The real scheduler and ledger, with device work replaced by a fixed sleep so that only the policy differs. A heavy
tenant keeps a deep queue (it submits `--heavy-queue` operations in order, and one more each time one finishes,
as an RL loop with many requests in flight does); a light tenant sends one operation at a time and waits for it,
as a loop that samples, scores and steps does. Reported: the light tenant's wait from submission to start
(median and 95th percentile) and both tenants' share of the device.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainer_backend.ledger import Ledger, ResultFormat  # noqa: E402
from trainer_backend.scheduler import Operation, Scheduler, SchedulingPolicy  # noqa: E402


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heavy-queue", type=int, default=40)
    parser.add_argument("--light-requests", type=int, default=20)
    parser.add_argument("--work-ms", type=float, default=20.0)
    args = parser.parse_args()

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
    console.print("command: python benchmarks/fairness.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
