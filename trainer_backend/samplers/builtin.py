"""The built-in sampler: requests wait in the device queue and run in shared generation batches over `ModelEngine`,
every tenant's and every adapter's together, the batch bounded by rows and tokens and shared fairly among lanes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from trainer_backend.engine.model_engine import MAX_SAMPLING_ROWS, ModelEngine, SampleOutcome
from trainer_backend.engine.prefixes import common_prefix_length
from trainer_backend.engine.types import LoraSettings, SamplingRequest
from trainer_backend.errors import BackendError
from trainer_backend.operations import BatchBudget, BatchCall, BatchKind, Operation, Outcome
from trainer_backend.request_kinds import RequestKind
from trainer_backend.samplers.answers import SampleAnswers, generated_tokens
from trainer_backend.samplers.interface import RecordedSamplingRequest
from trainer_backend.scheduler import Scheduler
from trainer_backend.wire.status import SamplerStatus

# The scheduler's batch kind of sampling requests: those of any weights share a generation batch.
SAMPLING = "sampling"
# A client's concurrent sampling requests (an RL step's prompts) arrive within about 25 ms of each other (measured on
# the Gemma trial's server log); waiting 50 ms for the oldest lets them all into one generation batch instead of the
# first one running alone while the others queue, which cost an RL step of 8 prompts 9 s of its 36 s of sampling.
SAMPLING_BATCH_WINDOW_S = 0.05
# A generation prefills at most this share of its token budget in one pass (its first batch, then each admission):
# chunked prefill. A pass cannot pause, and in a study's two Spider trials an evaluation's first batch, a whole budget
# of 32,768 tokens, was prefilled in one pass of minutes on a 2-core CPU while the other trial's RL step waited (95%
# of the worker in that pass, py-spy; issue 48). An eighth is about four of its 1,000-token prompts, or one RL
# request of four samples; the rest of the requests join one pass per decode step. Its cost, measured (docs/
# performance.md, "Chunked prefill"): an evaluation beside an RL run decodes with fewer rows for longer.
PREFILL_PASS_SHARE = 0.125
# Requests of one lane whose prompts share at least this part of the later one's go into one pass together even
# beside other runs' work (which otherwise join one at a time): the shared prefix is prefilled once. An evaluation's
# questions over one schema share the schema; a KL penalty's reference scores, where a generation takes them in
# (`TAKE_IN_PROMPT_SCORES`), are a prompt's completions one by one. Measured there on Gemma: two trials with a KL
# penalty took 757 s together, 784 s with every request one at a time (docs/performance.md).
SAME_PASS_SHARED_PREFIX = 0.5


class BuiltinSampler:
    """Samples on the device, in the scheduler's generation batches; between its steps a generation takes in other
    tenants' requests and pauses for their training steps."""

    name = "builtin"

    def __init__(
        self, engine: ModelEngine, scheduler: Scheduler, answers: SampleAnswers, max_batch_tokens: int
    ) -> None:
        """`max_batch_tokens`: prompt and planned completion tokens, over every row, one generation batch may hold."""
        self.engine = engine
        self.scheduler = scheduler
        self.answers = answers
        self.max_batch_tokens = max_batch_tokens
        # A tenant's requests join another tenant's running generation between its steps (`_run_batch`) rather than
        # wait for its end; those it cannot take in (prompt scores, past its cache) run nested in one of its pauses.
        self.batch_kind = BatchKind(
            SAMPLING,
            self._run_batch,
            SAMPLING_BATCH_WINDOW_S,
            BatchBudget(self._share, same_pass=prefilled_together),
            nests=True,
            pass_share=PREFILL_PASS_SHARE,
        )
        scheduler.register(self.batch_kind)

    def serves(self, request: SamplingRequest) -> str | None:
        return None

    def submit(self, job: RecordedSamplingRequest) -> None:
        self.scheduler.submit(
            Operation(
                job.request_id,
                RequestKind.SAMPLE,
                job.lane,
                None,
                None,
                batch_kind=self.batch_kind,
                payload=job,
                owner=job.owner,
                run=job.run,
                reads=job.request.weights_folder,
                alone=job.batch_invariant,
            )
        )

    def weights_saved(self, folder: Path, lora: LoraSettings) -> None:
        """Nothing to do: the engine loads sampler weights when a batch first uses them."""

    def status(self) -> SamplerStatus | None:
        return None

    def close(self) -> None:
        """Nothing of its own: the service stops the scheduler."""

    def _share(self, job: RecordedSamplingRequest) -> float:
        """The share of one generation batch a request takes: the larger of its rows and its tokens (prompt and
        planned completion, every row) against the batch's limits."""
        request = job.request
        tokens = request.num_samples * (len(request.prompt_tokens) + request.max_tokens)
        return max(request.num_samples / MAX_SAMPLING_ROWS, tokens / self.max_batch_tokens)

    def _run_batch(self, operations: Sequence[Operation[RecordedSamplingRequest]], call: BatchCall) -> list[Outcome]:
        """The scheduler's batch runner: every queued request, of any weights, in one generation batch, which takes in
        other tenants' requests between its steps and answers each request as soon as its samples are done."""
        running = list(operations)
        outcomes: dict[int, Outcome] = {}

        def admit(accepts: Callable[[SamplingRequest], bool]) -> list[SamplingRequest]:
            joined = call.admit(lambda operation: accepts(operation.payload.request))
            running.extend(joined)
            return [operation.payload.request for operation in joined]

        def finished(index: int, result: SampleOutcome) -> None:
            outcomes[index] = self._outcome(running[index], result)
            call.finish(running[index], outcomes[index])

        # A batch-invariant request runs as it would alone: not even room to take requests in, which would widen its
        # cache and with it the sums of its attention.
        joins = None if call.alone else admit
        self.engine.sample_batch([op.payload.request for op in running], call, joins, finished, call.prefilled)
        return [outcomes[index] for index in range(len(running))]

    def _outcome(self, operation: Operation[RecordedSamplingRequest], result: SampleOutcome) -> Outcome:
        if isinstance(result, BackendError):  # bad input, or weights whose load was refused
            return result
        job = operation.payload
        operation.processed_tokens = len(job.request.prompt_tokens) + generated_tokens(result)
        return self.answers.encode(job, result)


def prefilled_together(before: RecordedSamplingRequest, job: RecordedSamplingRequest) -> bool:
    """Whether `job` costs little prefilled in one pass after `before`: the same weights, both scored or both not (the
    engine serves the two apart), and most of `job`'s prompt shared."""
    first, then = before.request, job.request
    return (
        first.weights_folder == then.weights_folder
        and first.scores_prompt == then.scores_prompt
        and common_prefix_length(first.prompt_tokens, then.prompt_tokens)
        >= SAME_PASS_SHARED_PREFIX * len(then.prompt_tokens)
    )
