"""Prometheus metrics of the server, read from the service at scrape time."""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from trainer_backend.service import TrainingService


class ServiceCollector(Collector):
    """Queue depth, operations by type, device busy time and fraction, batching, future age, tokens processed."""

    def __init__(self, service: TrainingService) -> None:
        self.service = service

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
        if self.service.vllm is not None:
            sampler = self.service.vllm.status()
            yield GaugeMetricFamily("trainer_vllm_in_flight", "Sampling requests in vLLM now", value=sampler.in_flight)
            yield CounterMetricFamily(
                "trainer_vllm_requests", "Sampling requests vLLM answered", value=sampler.requests
            )
            yield CounterMetricFamily(
                "trainer_vllm_busy_seconds", "Summed time requests spent in vLLM", value=sampler.busy_seconds
            )
            yield CounterMetricFamily("trainer_vllm_restarts", "Times vLLM was started again", value=sampler.restarts)
        futures = GaugeMetricFamily("trainer_futures", "Futures in the ledger by state", labels=["state"])
        for state, count in sorted(self.service.ledger.counts_by_state().items()):
            futures.add_metric([state.value], count)
        yield futures
