"""What the service asks of a sampling engine: the `Sampler` protocol, and the `RecordedSamplingRequest` it is handed.

The service records the request's future, then hands the job to its sampler; the sampler answers it through
`SampleAnswers` (samplers/answers.py), which turns every engine's result into the wire's the same way. An engine
that cannot serve a request exactly says why (`serves`), so a router can send it elsewhere instead of refusing it.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from trainer_backend.engine.types import LoraSettings, SamplingRequest, SamplingResult
from trainer_backend.wire.status import SamplerStatus


@dataclass(frozen=True)
class RecordedSamplingRequest:
    """A sampling request whose future is recorded (`request_id`), with who asked and where it waits, as a sampler
    receives it.

    `lane`: the queue it waits in (its sampling session, or the caller's base-model lane) with a queued engine.
    `run`: the training run whose sampler weights it reads, which its usage counts toward. `batch_invariant`: answered
    as if alone on the server, in a generation batch of its own (`batch_invariance.py`). `result` resolves with the
    engine's own result when the future completes, for callers in this process (the OpenAI layer).
    """

    request_id: str
    owner: str
    lane: str
    run: str | None
    request: SamplingRequest
    prompt_logprobs_last_n: int | None = None
    batch_invariant: bool = False
    result: Future[SamplingResult] = field(default_factory=Future, compare=False)


class Sampler(Protocol):
    """A sampling engine."""

    name: str

    def serves(self, request: SamplingRequest) -> str | None:
        """None when this engine answers `request` exactly as the built-in engine would; else why it cannot."""

    def submit(self, job: RecordedSamplingRequest) -> None:
        """Start answering `job`; its future resolves through `SampleAnswers` once, with the result or the error.

        Raises:
            OverloadedError: the engine's queue is full (the caller retries).
        """

    def weights_saved(self, folder: Path, lora: LoraSettings) -> None:
        """Sampler weights were just saved in `folder` (replacing any there before), before their future resolves:
        an engine that loads adapters ahead of use does it now, so the client's next request finds them."""

    def status(self) -> SamplerStatus | None:
        """The engine's own figures for the status and /metrics; None when it is part of the device's."""

    def close(self) -> None: ...
