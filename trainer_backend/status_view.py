"""The status view (`GET /api/v1/status`): what the device is doing, from the duty-cycle accounting and the
scheduler, and which of the caller's futures are queued or running."""

from __future__ import annotations

import time
from collections.abc import Iterable

from trainer_backend.duty_cycle import DutyCycle
from trainer_backend.ledger import FutureRecord, FutureState
from trainer_backend.request_kinds import RequestKind
from trainer_backend.scheduler import SchedulerStats
from trainer_backend.wire.status import DeviceStatus, FutureInFlight, KeyUsage, RunUsage, SamplerStatus, ServerStatus


def server_status(
    owner: str,
    base_model: str,
    in_flight: Iterable[FutureRecord],
    stats: SchedulerStats,
    duty_cycle: DutyCycle,
    usage: KeyUsage,
    runs: list[RunUsage],
    sampler: SamplerStatus | None = None,
) -> ServerStatus:
    """The device's recent busy fraction and `owner`'s unfinished futures with their ages; other owners' futures
    are only counted."""
    now, wall_now = time.monotonic(), time.time()
    running_kinds = []
    mine, others = [], 0
    for record in in_flight:
        if record.request_id in stats.running:
            running_kinds.append(record.kind)
        if record.owner != owner:
            others += 1
            continue
        mine.append(
            FutureInFlight(
                request_id=record.request_id,
                kind=record.kind,
                model_id=record.model_id,
                seq_id=record.seq_id,
                state="running" if record.state is FutureState.RUNNING else "queued",
                age_s=round(wall_now - record.created_at, 3),
            )
        )
    queued: dict[str, int] = {}
    for future in mine:
        if future.state == "queued":
            lane = "sampling" if future.kind == RequestKind.SAMPLE else future.model_id or future.kind
            queued[lane] = queued.get(lane, 0) + 1
    return ServerStatus(
        base_model=base_model,
        device=DeviceStatus(
            busy_fraction_1m=round(duty_cycle.busy_fraction(60.0, stats.running_since, now), 4),
            busy_fraction_10s=round(duty_cycle.busy_fraction(10.0, stats.running_since, now), 4),
            running_kinds=sorted(running_kinds),
            running_for_s=None if stats.running_since is None else round(now - stats.running_since, 3),
            queued=stats.queued,
            batched_calls=stats.batches,
            batched_requests=stats.batched_operations,
        ),
        sampler=sampler,
        queued=queued,
        in_flight=mine,
        other_tenants_in_flight=others,
        usage=usage,
        runs=runs,
    )
