"""Prometheus metrics of the server, read from the service at scrape time."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from trainer_backend.scheduler import SchedulerStats
from trainer_backend.service import TrainingService
from trainer_backend.tenant_usage import tenant_series

# Checkpoint bytes by tenant are read from every checkpoint's metadata on disk, which takes a while with thousands of
# checkpoints: one read serves the scrapes of this many seconds (a scrape interval is typically 15 to 60 s), so a
# tenant's storage shows at most this late.
STORAGE_REFRESH_S = 30.0


class ServiceCollector(Collector):
    """Queue depth, operations by type, device busy time and fraction, batching, future age, tokens processed, and
    per tenant (the busiest by name, the rest as "other") device time, tokens, queued operations and storage."""

    def __init__(self, service: TrainingService) -> None:
        self.service = service
        self._storage: dict[str, int] = {}
        self._storage_read_at = float("-inf")
        self._storage_lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        stats = self.service.scheduler.stats()
        queued = GaugeMetricFamily("trainer_queue_depth", "Operations waiting for the device", labels=["lane"])
        queued.add_metric(["all"], stats.queued)
        yield queued
        operations = CounterMetricFamily("trainer_operations", "Device operations finished", labels=["kind"])
        for kind, count in sorted(stats.operations_by_kind.items()):
            operations.add_metric([kind], count)
        yield operations
        yield CounterMetricFamily(
            "trainer_device_busy_seconds", "Seconds the device spent running operations", value=stats.busy_seconds
        )
        busy = GaugeMetricFamily(
            "trainer_device_busy_fraction", "Share of a recent window the device was busy", labels=["window"]
        )
        for window_s in (10, 60):
            busy.add_metric([f"{window_s}s"], self.service.duty_cycle.busy_fraction(window_s, stats.running_since))
        yield busy
        yield CounterMetricFamily(
            "trainer_batched_operations",
            "Operations that ran in a device call with others",
            value=stats.batched_operations,
        )
        in_flight = self.service.ledger.in_flight()
        oldest = max((time.time() - record.created_at for record in in_flight), default=0.0)
        yield GaugeMetricFamily(
            "trainer_oldest_future_age_seconds", "Age of the oldest queued or running future", value=oldest
        )
        adapters = GaugeMetricFamily(
            "trainer_training_adapters", "Training adapters by where they are", labels=["state"]
        )
        adapters.add_metric(["loaded"], self.service.engine.residency.loaded)
        adapters.add_metric(["spilled"], self.service.engine.residency.spilled)
        yield adapters
        tokens = CounterMetricFamily("trainer_tokens", "Tokens processed", labels=["phase"])
        for phase, count in sorted(self.service.tokens_processed.snapshot().items()):
            tokens.add_metric([phase], count)
        yield tokens
        sampler = self.service.sampler.status()
        if sampler is not None:
            yield GaugeMetricFamily("trainer_vllm_in_flight", "Sampling requests in vLLM now", value=sampler.in_flight)
            yield CounterMetricFamily(
                "trainer_vllm_requests", "Sampling requests vLLM answered", value=sampler.requests
            )
            yield CounterMetricFamily(
                "trainer_vllm_busy_seconds", "Summed time requests spent in vLLM", value=sampler.busy_seconds
            )
            yield CounterMetricFamily("trainer_vllm_restarts", "Times vLLM was started again", value=sampler.restarts)
            builtin = CounterMetricFamily(
                "trainer_vllm_builtin_requests",
                "Sampling requests the built-in engine served because vLLM cannot serve them exactly",
                labels=["reason"],
            )
            for reason, count in sorted(sampler.builtin_requests.items()):
                builtin.add_metric([reason], count)
            yield builtin
        yield from self._weight_check_metrics()
        futures = GaugeMetricFamily("trainer_futures", "Futures in the ledger by state", labels=["state"])
        for state, count in sorted(self.service.ledger.counts_by_state().items()):
            futures.add_metric([state.value], count)
        yield futures
        yield from self._tenant_metrics(stats)

    def _weight_check_metrics(self) -> Iterator[Metric]:
        """Loads of sampler weights shown applied, refused (by reason), and the time the checks took, by engine."""
        counts = self.service.engine.weight_checks.snapshot()
        passed = CounterMetricFamily(
            "trainer_sampler_weights_checked",
            "Loads of sampler weights shown to be the saved ones, applied",
            labels=["engine"],
        )
        for engine, count in sorted(counts.passed.items()):
            passed.add_metric([engine], count)
        refused = CounterMetricFamily(
            "trainer_sampler_weights_refused",
            "Loads of sampler weights refused, by reason (Refusal in trainer_backend/engine/weights_proof.py)",
            labels=["engine", "reason"],
        )
        for (engine, reason), count in sorted(counts.refused.items()):
            refused.add_metric([engine, reason], count)
        seconds = CounterMetricFamily(
            "trainer_sampler_weights_check_seconds",
            "Seconds spent checking loads of sampler weights",
            labels=["engine"],
        )
        for engine, total in sorted(counts.seconds.items()):
            seconds.add_metric([engine], total)
        yield from (passed, refused, seconds)

    def _tenant_metrics(self, stats: SchedulerStats) -> Iterator[Metric]:
        """The series of the `--metrics-top-tenants` busiest tenants by recent device time, and "other".

        A tenant that enters or leaves the named ones moves its totals out of or into "other", which Prometheus
        reads as a counter reset of "other"; the tenants' own counters only grow.
        """
        series = tenant_series(
            self.service.usage.tenants(),
            stats.queued_by_owner,
            self._storage_by_owner(),
            self.service.config.metrics_top_tenants,
        )
        device = CounterMetricFamily(
            "trainer_tenant_device_seconds",
            "Device seconds a tenant's operations took (a batch's split by their tokens)",
            labels=["tenant"],
        )
        tokens = CounterMetricFamily(
            "trainer_tenant_tokens",
            "Tokens a tenant sampled (generated) and trained (forward and forward_backward passes)",
            labels=["tenant", "phase"],
        )
        queued = GaugeMetricFamily(
            "trainer_tenant_queued_operations", "A tenant's operations waiting for the device", labels=["tenant"]
        )
        storage = GaugeMetricFamily(
            "trainer_tenant_storage_bytes",
            f"Bytes of a tenant's live checkpoints, read at most {STORAGE_REFRESH_S:.0f} s ago",
            labels=["tenant"],
        )
        for one in series:
            device.add_metric([one.tenant], one.device_seconds)
            tokens.add_metric([one.tenant, "sampled"], one.tokens_sampled)
            tokens.add_metric([one.tenant, "trained"], one.tokens_trained)
            queued.add_metric([one.tenant], one.queued)
            storage.add_metric([one.tenant], one.storage_bytes)
        yield from (device, tokens, queued, storage)

    def _storage_by_owner(self) -> dict[str, int]:
        with self._storage_lock:
            if time.monotonic() - self._storage_read_at >= STORAGE_REFRESH_S:
                self._storage = self.service.checkpoints.usage_by_owner()
                self._storage_read_at = time.monotonic()
            return self._storage
