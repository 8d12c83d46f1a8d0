"""Prometheus metrics of the server: one reading of its state (`server_state.py`) at scrape time."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from trainer_backend.server_state import BUSY_WINDOWS_S, ServerState
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
        state = self.service.state()
        stats = state.device
        queued = GaugeMetricFamily("trainer_queue_depth", "Operations waiting for the device", labels=["lane"])
        queued.add_metric(["all"], stats.queued)
        yield queued
        yield _by_label(
            CounterMetricFamily, "trainer_operations", "Device operations finished", "kind", stats.operations_by_kind
        )
        yield CounterMetricFamily(
            "trainer_device_busy_seconds", "Seconds the device spent running operations", value=stats.busy_seconds
        )
        busy = GaugeMetricFamily(
            "trainer_device_busy_fraction", "Share of a recent window the device was busy", labels=["window"]
        )
        for window_s in BUSY_WINDOWS_S:
            busy.add_metric([f"{window_s:.0f}s"], state.busy_fraction[window_s])
        yield busy
        yield CounterMetricFamily(
            "trainer_batched_operations",
            "Operations that ran in a device call with others",
            value=stats.batched_operations,
        )
        yield GaugeMetricFamily(
            "trainer_oldest_future_age_seconds",
            "Age of the oldest queued or running future",
            value=state.oldest_future_age_s(),
        )
        adapters = GaugeMetricFamily(
            "trainer_training_adapters", "Training adapters by where they are", labels=["state"]
        )
        adapters.add_metric(["loaded"], state.adapters.loaded)
        adapters.add_metric(["spilled"], state.adapters.spilled)
        yield adapters
        yield _by_label(CounterMetricFamily, "trainer_tokens", "Tokens processed", "phase", state.tokens_by_phase)
        sampler = state.sampler
        if sampler is not None:
            yield GaugeMetricFamily("trainer_vllm_in_flight", "Sampling requests in vLLM now", value=sampler.in_flight)
            yield CounterMetricFamily(
                "trainer_vllm_requests", "Sampling requests vLLM answered", value=sampler.requests
            )
            yield CounterMetricFamily(
                "trainer_vllm_busy_seconds", "Summed time requests spent in vLLM", value=sampler.busy_seconds
            )
            yield CounterMetricFamily("trainer_vllm_restarts", "Times vLLM was started again", value=sampler.restarts)
            yield _by_label(
                CounterMetricFamily,
                "trainer_vllm_builtin_requests",
                "Sampling requests the built-in engine served because vLLM cannot serve them exactly",
                "reason",
                sampler.builtin_requests,
            )
        yield from _weight_check_metrics(state)
        futures = GaugeMetricFamily("trainer_futures", "Futures in the ledger by state", labels=["state"])
        for future_state, count in sorted(state.futures_by_state.items()):
            futures.add_metric([future_state.value], count)
        yield futures
        yield from self._tenant_metrics(state)

    def _tenant_metrics(self, state: ServerState) -> Iterator[Metric]:
        """The series of the `--metrics-top-tenants` busiest tenants by recent device time, and "other".

        A tenant that enters or leaves the named ones moves its totals out of or into "other", which Prometheus
        reads as a counter reset of "other"; the tenants' own counters only grow.
        """
        series = tenant_series(
            state.tenants,
            state.device.queued_by_owner,
            self._storage_by_owner(),
            self.service.config.metrics_top_tenants,
        )
        device = CounterMetricFamily(
            "trainer_tenant_device_seconds",
            "Device seconds a tenant's operations took (a batch's split by their tokens), running ones as they go",
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


def _weight_check_metrics(state: ServerState) -> Iterator[Metric]:
    """Loads of sampler weights shown applied, refused (by reason), and the time the checks took, by engine."""
    counts = state.weight_checks
    yield _by_label(
        CounterMetricFamily,
        "trainer_sampler_weights_checked",
        "Loads of sampler weights shown to be the saved ones, applied",
        "engine",
        counts.passed,
    )
    refused = CounterMetricFamily(
        "trainer_sampler_weights_refused",
        "Loads of sampler weights refused, by reason (Refusal in trainer_backend/engine/weights_proof.py)",
        labels=["engine", "reason"],
    )
    for (engine, reason), count in sorted(counts.refused.items()):
        refused.add_metric([engine, reason], count)
    yield refused
    yield _by_label(
        CounterMetricFamily,
        "trainer_sampler_weights_check_seconds",
        "Seconds spent checking loads of sampler weights",
        "engine",
        counts.seconds,
    )


def _by_label(
    family: type[CounterMetricFamily | GaugeMetricFamily],
    name: str,
    documentation: str,
    label: str,
    values: Mapping[str, float],
) -> Metric:
    """A metric with one series for each value of its one label, in the label's order."""
    metric = family(name, documentation, labels=[label])
    for label_value, value in sorted(values.items()):
        metric.add_metric([label_value], value)
    return metric
