"""One reading of what the server is doing: its device queue and busy time, its unfinished futures, where its
training adapters are, the tokens it processed, its sampler, its sampler-weight checks and each tenant's use.

The status route (`status_view.py`) shows a caller its part of a reading and /metrics (`api/metrics.py`) shows all
of it; both take it from `TrainingService.state()`, so neither reaches into the scheduler, the engine or the
accounting on its own, and the two never disagree over where a figure comes from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from trainer_backend.engine.weights_proof import WeightCheckCounts
from trainer_backend.ledger import FutureRecord, FutureState
from trainer_backend.scheduler import SchedulerStats
from trainer_backend.tenant_usage import OnDevice, TenantTotals
from trainer_backend.wire.status import SamplerStatus

# The windows, in seconds, over which the device's busy fraction is read.
BUSY_WINDOWS_S = (10.0, 60.0)


@dataclass(frozen=True)
class AdapterCounts:
    """Training adapters in the device's memory and spilled to disk (`--max-loaded-adapters`)."""

    loaded: int
    spilled: int


@dataclass(frozen=True)
class ServerState:
    """The server at one moment, read once from its parts."""

    base_model: str
    # When it was read: monotonic seconds (the device's clock) and wall-clock seconds (the futures' clock).
    read_at: float
    read_at_wall: float
    device: SchedulerStats
    # The share of the last `window` seconds the device was busy, by window (`BUSY_WINDOWS_S`), the running call
    # counted up to `read_at`.
    busy_fraction: Mapping[float, float]
    # Queued and running futures of every owner, oldest first.
    in_flight: tuple[FutureRecord, ...]
    futures_by_state: Mapping[FutureState, int]
    adapters: AdapterCounts
    # Tokens processed since start by phase (`tenant_usage.TOKEN_PHASES`).
    tokens_by_phase: Mapping[str, int]
    # The vLLM sampler's own figures; None with the built-in sampler (part of the device).
    sampler: SamplerStatus | None
    weight_checks: WeightCheckCounts
    # The operations on the device, with the device seconds each has accrued and not yet counted in `tenants`'
    # figures, which include them.
    on_device: tuple[OnDevice, ...]
    # Every owner's use since start.
    tenants: Mapping[str, TenantTotals]

    def oldest_future_age_s(self) -> float:
        """Seconds since the oldest unfinished future was accepted; 0 when there is none."""
        return max((self.read_at_wall - record.created_at for record in self.in_flight), default=0.0)

    def tenant(self, owner: str) -> TenantTotals:
        """`owner`'s use; zeros for an owner that has used nothing."""
        return self.tenants.get(owner, TenantTotals())
