"""The built-in sampler: requests wait in the device queue and run in shared generation batches over `ModelEngine`,
every tenant's and every adapter's together, the batch bounded by rows and tokens and shared fairly among lanes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from trainer_backend.engine.model_engine import MAX_SAMPLING_ROWS, ModelEngine
from trainer_backend.engine.types import LoraSettings, SamplerCall, SamplingInputError
from trainer_backend.request_kinds import RequestKind
from trainer_backend.samplers.answers import SampleAnswers, generated_tokens
from trainer_backend.samplers.interface import SampleJob
from trainer_backend.scheduler import BatchBudget, Operation, Outcome, PauseCallback, Scheduler
from trainer_backend.wire.status import SamplerStatus

# The scheduler's batch kind of sampling requests: those of any weights share a generation batch.
SAMPLING = "sampling"
# A client's concurrent sampling requests (an RL step's prompts) arrive within about 25 ms of each other (measured on
# the Gemma trial's server log); waiting 50 ms for the oldest lets them all into one generation batch instead of the
# first one running alone while the others queue, which cost an RL step of 8 prompts 9 s of its 36 s of sampling.
SAMPLING_BATCH_WINDOW_S = 0.05


class BuiltinSampler:
    """Samples on the device, in the scheduler's generation batches; the generation pauses every few tokens for other
    tenants' training steps and generation batches."""

    name = "builtin"

    def __init__(
        self, engine: ModelEngine, scheduler: Scheduler, answers: SampleAnswers, max_batch_tokens: int
    ) -> None:
        """`max_batch_tokens`: prompt and planned completion tokens, over every row, one generation batch may hold."""
        self.engine = engine
        self.scheduler = scheduler
        self.answers = answers
        self.max_batch_tokens = max_batch_tokens
        # Nested: a tenant's requests run in a pause of another tenant's generation rather than after its end.
        scheduler.add_batch_kind(
            SAMPLING, self._run_batch, SAMPLING_BATCH_WINDOW_S, BatchBudget(self._share), nests=True
        )

    def serves(self, call: SamplerCall) -> str | None:
        return None

    def submit(self, job: SampleJob) -> None:
        self.scheduler.submit(
            Operation(
                job.request_id,
                RequestKind.SAMPLE,
                job.lane,
                None,
                None,
                batch_kind=SAMPLING,
                payload=job,
                owner=job.owner,
                run=job.run,
                reads=job.call.weights_folder,
            )
        )

    def weights_saved(self, folder: Path, lora: LoraSettings) -> None:
        """Nothing to do: the engine loads sampler weights when a batch first uses them."""

    def status(self) -> SamplerStatus | None:
        return None

    def close(self) -> None:
        """Nothing of its own: the service stops the scheduler."""

    def _share(self, job: SampleJob) -> float:
        """The share of one generation batch a request takes: the larger of its rows and its tokens (prompt and
        planned completion, every row) against the batch's limits."""
        request = job.call.request
        tokens = request.num_samples * (len(request.prompt_tokens) + request.max_tokens)
        return max(request.num_samples / MAX_SAMPLING_ROWS, tokens / self.max_batch_tokens)

    def _run_batch(self, operations: Sequence[Operation[SampleJob]], pause: PauseCallback) -> list[Outcome]:
        """The scheduler's batch runner: every queued request, of any weights, in one generation batch."""
        jobs = [op.payload for op in operations if op.payload is not None]
        results = self.engine.sample_batch([job.call for job in jobs], pause)
        outcomes: list[Outcome] = []
        for operation, job, result in zip(operations, jobs, results, strict=True):
            if isinstance(result, SamplingInputError):
                outcomes.append(result)
                continue
            operation.processed_tokens = len(job.call.request.prompt_tokens) + generated_tokens(result)
            outcomes.append(self.answers.encode(job, result))
        return outcomes
