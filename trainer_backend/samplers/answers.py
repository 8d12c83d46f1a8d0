"""A sampler's result as the wire's answer, written once for every engine: only the asked-for prompt positions keep
their scores, the tokens are counted (the server's and the tenant's), the response is encoded, and the job's own
result is handed to in-process readers."""

from __future__ import annotations

import dataclasses
import logging

from trainer_backend.engine.types import SamplingResult
from trainer_backend.errors import BackendError
from trainer_backend.ledger import Ledger, ResultFormat
from trainer_backend.request_kinds import RequestKind
from trainer_backend.samplers.interface import RecordedSamplingRequest
from trainer_backend.tenant_usage import TenantUsage
from trainer_backend.wire.proto import encode_sample_response

log = logging.getLogger(__name__)


class SampleAnswers:
    """Answers sampling jobs: `encode` for an engine whose results the device queue records (the built-in one),
    `started` and `resolve` for an engine that runs outside it (vLLM)."""

    def __init__(self, ledger: Ledger, usage: TenantUsage) -> None:
        self.ledger = ledger
        self.usage = usage

    def encode(self, job: RecordedSamplingRequest, result: SamplingResult) -> tuple[bytes, ResultFormat]:
        """The job's answer on the wire, its tokens counted."""
        if job.prompt_logprobs_last_n is not None:
            result = _keep_last_prompt_logprobs(result, job.prompt_logprobs_last_n)
        generated = generated_tokens(result)
        self.usage.add_tokens(job.owner, job.run, "prompt", len(job.request.prompt_tokens))
        self.usage.add_tokens(job.owner, job.run, "sampled", generated)
        job.result.set_result(result)
        return encode_sample_response(result), ResultFormat.PROTO

    def started(self, job: RecordedSamplingRequest) -> None:
        self.ledger.mark_running(job.request_id)

    def resolve(self, job: RecordedSamplingRequest, outcome: SamplingResult | Exception) -> None:
        """Complete the job's future with its answer, or fail it: a backend error with its own message and category,
        anything else as an internal error (logged with its trace)."""
        if isinstance(outcome, BackendError):
            self.ledger.fail(job.request_id, str(outcome), outcome.category)
        elif isinstance(outcome, Exception):
            log.error("sampling request %s failed", job.request_id, exc_info=outcome)
            self.ledger.fail(
                job.request_id, f"internal error in {RequestKind.SAMPLE}: {type(outcome).__name__}", "server"
            )
        else:
            self.ledger.complete(job.request_id, *self.encode(job, outcome))


def generated_tokens(result: SamplingResult) -> int:
    return sum(len(sequence.tokens) for sequence in result.sequences)


def _keep_last_prompt_logprobs(result: SamplingResult, last_n: int) -> SamplingResult:
    """Only the last n prompt positions keep their scores (`prompt_logprobs_last_n`)."""

    def cut(values: tuple | None) -> tuple | None:
        return None if values is None else (None,) * (len(values) - last_n) + tuple(values[-last_n:])

    return dataclasses.replace(
        result, prompt_logprobs=cut(result.prompt_logprobs), topk_prompt_logprobs=cut(result.topk_prompt_logprobs)
    )
