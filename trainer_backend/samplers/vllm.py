"""vLLM as a sampler: each request goes to the vLLM server at once from a thread pool, outside the device queue
(vLLM batches concurrent requests itself), and sampler weights are loaded into it as they are saved.

What vLLM cannot serve as the built-in engine would, it says (`serves`), and the router sends to the built-in engine:
an adapter that trains the unembedding (vLLM cannot load a LoRA on `lm_head`) and structured output other than a
JSON schema.
"""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from trainer_backend.engine.adapters import saved_adapter_settings
from trainer_backend.engine.types import LoraSettings, SamplingRequest, SamplingResult
from trainer_backend.engine.weights_proof import SamplerWeightsError
from trainer_backend.samplers.answers import SampleAnswers
from trainer_backend.samplers.interface import RecordedSamplingRequest
from trainer_backend.samplers.vllm_client import VllmClient
from trainer_backend.structured_output import JsonSchemaConstraint
from trainer_backend.wire.status import SamplerStatus

# Requests in flight to vLLM at once; it queues the rest of a burst itself.
MAX_IN_FLIGHT = 64
TRAINS_UNEMBEDDING = "the adapter trains the unembedding (a LoRA on lm_head, which vLLM cannot load)"
OTHER_CONSTRAINT = "structured output other than a JSON schema"


@dataclass
class _Counts:
    in_flight: int = 0
    requests: int = 0
    busy_seconds: float = 0.0


class VllmSampler:
    """Samples through a `VllmClient`: the base model, or an adapter loaded under its checkpoint folder's path."""

    name = "vllm"

    def __init__(self, client: VllmClient, answers: SampleAnswers) -> None:
        self.client = client
        self.answers = answers
        self.pool = ThreadPoolExecutor(MAX_IN_FLIGHT, thread_name_prefix="vllm")
        self._counts = _Counts()
        self._lock = threading.Lock()

    def serves(self, request: SamplingRequest) -> str | None:
        constraint = request.constraint
        if constraint is not None and not isinstance(constraint, JsonSchemaConstraint):
            return OTHER_CONSTRAINT
        if request.weights_folder is not None and _trains_unembedding(request.weights_folder):
            return TRAINS_UNEMBEDDING
        return None

    def submit(self, job: RecordedSamplingRequest) -> None:
        self.answers.started(job)
        self.pool.submit(self._answer, job)

    def _answer(self, job: RecordedSamplingRequest) -> None:
        started = time.monotonic()
        with self._lock:
            self._counts.in_flight += 1
        outcome: SamplingResult | Exception
        try:
            outcome = self.client.sample(job.request)
        except Exception as error:
            outcome = error
        # Counted before the future resolves, so that a client reading the status after its answer sees it.
        with self._lock:
            self._counts.in_flight -= 1
            self._counts.requests += 1
            self._counts.busy_seconds += time.monotonic() - started
        self.answers.resolve(job, outcome)

    def weights_saved(self, folder: Path, lora: LoraSettings) -> None:
        """Into vLLM, checked, before the save's future resolves, so the client's next sample finds it there; an
        adapter it cannot hold is left to the built-in engine. Weights the check refuses do not fail the save (they
        are saved): each request for them loads them again and is refused with the reason if the check fails again."""
        if not lora.train_unembed:
            with contextlib.suppress(SamplerWeightsError):
                self.client.load_adapter(folder)

    def status(self) -> SamplerStatus:
        with self._lock:
            return SamplerStatus(
                in_flight=self._counts.in_flight,
                requests=self._counts.requests,
                busy_seconds=round(self._counts.busy_seconds, 3),
                restarts=self.client.restarts,
            )

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()


def _trains_unembedding(folder: Path) -> bool:
    try:
        return saved_adapter_settings(folder).train_unembed
    except (OSError, ValueError, KeyError):
        # Deleted or damaged since the request was checked: the built-in engine fails it with the reason.
        return True
