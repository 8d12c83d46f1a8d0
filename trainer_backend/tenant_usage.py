"""What each tenant (an API key's owner) and each of its training runs used: device seconds and tokens, in total and
recently.

/metrics shows the tenants under a label that is a hash of the owner, never the key, and only the busiest few by
name: the rest are summed under "other", so the number of series stays bounded however many keys there are. The
status shows a caller its own totals, its label (to find its series) and its recently active runs with their share
of the device.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

# The device's tokens, by what it did with them. Trained: tokens of a training pass (forward_backward or forward).
# Prompt: the prompt tokens of a sampling request. Sampled: the tokens a sampling request generated.
TokenPhase = Literal["trained", "prompt", "sampled"]
TOKEN_PHASES: tuple[TokenPhase, ...] = ("trained", "prompt", "sampled")
OTHER_TENANTS = "other"
# "Recent" device time, which picks the tenants /metrics names: a sum in which each second counts exp(-age / 10 min),
# so a tenant that stopped drops out of the top within tens of minutes while a burst of a few seconds does not push
# out a tenant that has worked steadily.
TENANT_RECENT_S = 600.0
# A run's share of the device, as the status shows it: exponentially weighted over about the last minute, the
# horizon over which a person watching a study sees trials speed up or wait.
RUN_SHARE_S = 60.0
# The status lists the runs that used the device this recently; older ones are forgotten, so that a long-lived server
# does not keep one record for every run it ever served.
RUN_LISTED_S = 3600.0


def tenant_label(owner: str) -> str:
    """The label of an owner's series in /metrics: a short stable hash of the owner id (itself a digest of the key),
    so the label names the same tenant across restarts and reveals neither the key nor the owner id."""
    return "t-" + hashlib.sha256(owner.encode()).hexdigest()[:12]


@dataclass
class _Decaying:
    """A sum of amounts, each weighted exp(-age / time_constant_s): for a steady rate r it tends to r ·
    time_constant_s."""

    time_constant_s: float
    value: float = 0.0
    at: float = 0.0

    def add(self, amount: float, now: float) -> None:
        self.value = self.at_time(now) + amount
        self.at = now

    def at_time(self, now: float) -> float:
        return self.value * math.exp(-max(0.0, now - self.at) / self.time_constant_s)


@dataclass
class _Counts:
    device_seconds: float = 0.0
    tokens_sampled: int = 0
    tokens_trained: int = 0
    # The most device seconds shown so far, running operations' included (`show_device_seconds`).
    shown_device_seconds: float = 0.0

    def show_device_seconds(self, running_s: float) -> float:
        """The device seconds to show with `running_s` of operations still on the device: never less than shown
        before, since an operation's seconds move from running to counted when it ends and a reading may fall in
        between."""
        self.shown_device_seconds = max(self.shown_device_seconds, self.device_seconds + running_s)
        return self.shown_device_seconds

    def add_tokens(self, phase: TokenPhase, tokens: int) -> None:
        # A tenant's prompt tokens are not its own column: what it asked the device to make is what it sampled.
        if phase == "sampled":
            self.tokens_sampled += tokens
        elif phase == "trained":
            self.tokens_trained += tokens


@dataclass
class _TenantCounts(_Counts):
    recent: _Decaying = field(default_factory=lambda: _Decaying(TENANT_RECENT_S))


@dataclass
class _RunCounts(_Counts):
    recent: _Decaying = field(default_factory=lambda: _Decaying(RUN_SHARE_S))
    # When the run's first device call began; None until it has one.
    first_used: float | None = None
    last_used: float = 0.0


@dataclass(frozen=True)
class OnDevice:
    """Device seconds an operation still on the device has accrued so far: its owner's, and its run's if it has one."""

    owner: str
    run: str | None
    seconds: float


@dataclass(frozen=True)
class TenantTotals:
    """One owner's use since the server started, and its recent device seconds (which rank it in /metrics)."""

    device_seconds: float = 0.0
    tokens_sampled: int = 0
    tokens_trained: int = 0
    recent_device_seconds: float = 0.0


@dataclass(frozen=True)
class RunTotals:
    """One training run's use since the server started, and its share of the device over about the last minute."""

    model_id: str
    device_seconds: float
    device_share_1m: float
    tokens_sampled: int
    tokens_trained: int


@dataclass(frozen=True)
class TenantSeries:
    """The values of one tenant label in /metrics: a tenant's own, or the sum of those not named ("other")."""

    tenant: str
    device_seconds: float
    tokens_sampled: int
    tokens_trained: int
    queued: int
    storage_bytes: int


class TenantUsage:
    """Device seconds and tokens by owner and by training run, and the server's tokens by phase; thread-safe (the
    device worker and vLLM's threads add, HTTP handlers read)."""

    def __init__(self) -> None:
        self._tokens_by_phase = dict.fromkeys(TOKEN_PHASES, 0)
        self._tenants: dict[str, _TenantCounts] = {}
        self._runs: dict[str, dict[str, _RunCounts]] = {}
        self._lock = threading.Lock()
        self._forgotten_at = float("-inf")

    def add_device_time(self, owner: str, run: str | None, seconds: float, now: float | None = None) -> None:
        """`owner`'s operation (of training run `run`, if any) used the device for `seconds`, ending `now`."""
        now = time.monotonic() if now is None else now
        with self._lock:
            tenant = self._tenants.setdefault(owner, _TenantCounts())
            tenant.device_seconds += seconds
            tenant.recent.add(seconds, now)
            if run is None:
                return
            counts = self._run(owner, run, now)
            counts.device_seconds += seconds
            counts.recent.add(seconds, now)
            if counts.first_used is None:
                counts.first_used = now - seconds
            self._forget_idle_runs(now)

    def add_tokens(self, owner: str | None, run: str | None, phase: TokenPhase, tokens: int) -> None:
        """`tokens` the device processed in `phase` for `owner` (None: no tenant's, the server's totals only), of
        training run `run` if any."""
        with self._lock:
            self._tokens_by_phase[phase] += tokens
            if owner is None:
                return
            self._tenants.setdefault(owner, _TenantCounts()).add_tokens(phase, tokens)
            if run is not None:
                now = time.monotonic()
                self._run(owner, run, now).add_tokens(phase, tokens)
                self._forget_idle_runs(now)

    def tokens_by_phase(self) -> dict[TokenPhase, int]:
        """Every token the device processed since start, by phase."""
        with self._lock:
            return dict(self._tokens_by_phase)

    def tenants(self, now: float | None = None, running: Iterable[OnDevice] = ()) -> dict[str, TenantTotals]:
        """Every owner's totals, by owner. `running`: the operations still on the device; their seconds so far count
        in their owners' device seconds, so that a tenant in a generation of minutes is not shown idle until it ends.
        A device-seconds total shown is never less than one shown before (`_Counts.show_device_seconds`)."""
        now = time.monotonic() if now is None else now
        on_device = _summed((operation.owner, operation.seconds) for operation in running)
        with self._lock:
            totals = {}
            for owner in self._tenants.keys() | on_device.keys():
                counts = self._tenants.setdefault(owner, _TenantCounts())
                shown = counts.show_device_seconds(on_device.get(owner, 0.0))
                totals[owner] = replace(_totals(counts, now), device_seconds=shown)
            return totals

    def runs_of(self, owner: str, now: float | None = None, running: Iterable[OnDevice] = ()) -> list[RunTotals]:
        """`owner`'s runs that used the device (or, with vLLM sampling, drew tokens) in the last `RUN_LISTED_S`, the
        busiest now first. `running`: the operations still on the device, counted as in `tenants`, so that a run in a
        generation of minutes shows its share as it runs; its device seconds shown never fall either."""
        now = time.monotonic() if now is None else now
        on_device = _summed(
            (operation.run, operation.seconds)
            for operation in running
            if operation.owner == owner and operation.run is not None
        )
        with self._lock:
            for model_id, seconds in on_device.items():
                counts = self._run(owner, model_id, now)
                if counts.first_used is None:
                    counts.first_used = now - seconds
            runs = []
            for model_id, counts in self._runs.get(owner, {}).items():
                if now - counts.last_used > RUN_LISTED_S:
                    continue
                running_s = on_device.get(model_id, 0.0)
                runs.append(
                    RunTotals(
                        model_id=model_id,
                        device_seconds=counts.show_device_seconds(running_s),
                        device_share_1m=_share(counts, now, running_s),
                        tokens_sampled=counts.tokens_sampled,
                        tokens_trained=counts.tokens_trained,
                    )
                )
        return sorted(runs, key=lambda run: (-run.device_share_1m, run.model_id))

    def _run(self, owner: str, run: str, now: float) -> _RunCounts:
        counts = self._runs.setdefault(owner, {}).setdefault(run, _RunCounts())
        counts.last_used = now
        return counts

    def _forget_idle_runs(self, now: float) -> None:
        """Drop runs idle for longer than `RUN_LISTED_S`; a pass over all runs, at most once a minute."""
        if now - self._forgotten_at < 60.0:
            return
        self._forgotten_at = now
        for owner, runs in list(self._runs.items()):
            for model_id in [m for m, counts in runs.items() if now - counts.last_used > RUN_LISTED_S]:
                del runs[model_id]
            if not runs:
                del self._runs[owner]


def _summed(seconds: Iterable[tuple[str, float]]) -> dict[str, float]:
    """Seconds summed by key."""
    sums: dict[str, float] = {}
    for key, amount in seconds:
        sums[key] = sums.get(key, 0.0) + amount
    return sums


def _totals(counts: _TenantCounts, now: float) -> TenantTotals:
    return TenantTotals(counts.device_seconds, counts.tokens_sampled, counts.tokens_trained, counts.recent.at_time(now))


def _share(counts: _RunCounts, now: float, running_s: float = 0.0) -> float:
    """The run's weighted device seconds (with `running_s`, those of its operations on the device now) over the same
    weighting of the wall-clock time since it began, so a run that started 20 s ago and used the device all along
    shows 1, not the 0.28 its warming sum alone would say."""
    if counts.first_used is None:
        return 0.0
    window_s = RUN_SHARE_S * (1.0 - math.exp(-max(0.0, now - counts.first_used) / RUN_SHARE_S))
    return 0.0 if window_s <= 0 else min(1.0, (counts.recent.at_time(now) + running_s) / window_s)


def tenant_series(
    totals: Mapping[str, TenantTotals], queued: Mapping[str, int], storage_bytes: Mapping[str, int], top: int
) -> list[TenantSeries]:
    """One series per owner among the `top` by recent device seconds (then by total device seconds), and one
    "other" that sums every owner left out; owners may appear in any of the three mappings."""
    owners = set(totals) | set(queued) | set(storage_bytes)

    def busiest_first(owner: str) -> tuple[float, float, str]:
        own = totals.get(owner, TenantTotals())
        return (-own.recent_device_seconds, -own.device_seconds, tenant_label(owner))

    ranked = sorted(owners, key=busiest_first)
    series = [_series(tenant_label(owner), [owner], totals, queued, storage_bytes) for owner in ranked[:top]]
    return [*series, _series(OTHER_TENANTS, ranked[top:], totals, queued, storage_bytes)]


def _series(
    label: str,
    owners: list[str],
    totals: Mapping[str, TenantTotals],
    queued: Mapping[str, int],
    storage_bytes: Mapping[str, int],
) -> TenantSeries:
    own = [totals.get(owner, TenantTotals()) for owner in owners]
    return TenantSeries(
        tenant=label,
        device_seconds=sum(t.device_seconds for t in own),
        tokens_sampled=sum(t.tokens_sampled for t in own),
        tokens_trained=sum(t.tokens_trained for t in own),
        queued=sum(queued.get(owner, 0) for owner in owners),
        storage_bytes=sum(storage_bytes.get(owner, 0) for owner in owners),
    )
