"""The status view (`GET /api/v1/status`): what the device is doing and which of the caller's futures are queued or
running, from one reading of the server's state (`server_state.py`)."""

from __future__ import annotations

from trainer_backend.ledger import FutureState
from trainer_backend.request_kinds import RequestKind
from trainer_backend.server_state import ServerState
from trainer_backend.wire.status import DeviceStatus, FutureInFlight, KeyUsage, RunUsage, ServerStatus


def server_status(owner: str, state: ServerState, usage: KeyUsage, runs: list[RunUsage]) -> ServerStatus:
    """The device's recent busy fraction and `owner`'s unfinished futures with their ages; other owners' futures
    are only counted. `usage` and `runs`: what the caller's key holds and its recently active runs."""
    stats = state.device
    running_kinds = []
    mine, others = [], 0
    for record in state.in_flight:
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
                age_s=round(state.read_at_wall - record.created_at, 3),
            )
        )
    queued: dict[str, int] = {}
    for future in mine:
        if future.state == "queued":
            lane = "sampling" if future.kind == RequestKind.SAMPLE else future.model_id or future.kind
            queued[lane] = queued.get(lane, 0) + 1
    return ServerStatus(
        base_model=state.base_model,
        device=DeviceStatus(
            busy_fraction_1m=round(state.busy_fraction[60.0], 4),
            busy_fraction_10s=round(state.busy_fraction[10.0], 4),
            running_kinds=sorted(running_kinds),
            running_for_s=None if stats.running_since is None else round(state.read_at - stats.running_since, 3),
            queued=stats.queued,
            batched_calls=stats.batches,
            batched_requests=stats.batched_operations,
        ),
        sampler=state.sampler,
        queued=queued,
        in_flight=mine,
        other_tenants_in_flight=others,
        usage=usage,
        runs=runs,
    )
