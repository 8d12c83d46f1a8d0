"""Everything the device does for the server, behind one façade: forward/backward (`training_pass.py`), optimizer
steps, sampling (`sampling.py`), adapter save/load, and which adapters stay loaded (`residency.py`).

One `ModelEngine` wraps one base model and its adapters. It is called only from the scheduler's worker thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from trainer_backend.engine.adapters import AdapterPool
from trainer_backend.engine.applied_weights import AppliedWeights
from trainer_backend.engine.attention import attend_in_fp32
from trainer_backend.engine.host_memory import release_freed_memory
from trainer_backend.engine.logprobs import full_logits_target_logprobs, target_logprobs
from trainer_backend.engine.microbatches import (
    ACTIVATION_BUDGET_BYTES,
    activation_bytes_per_token,
)
from trainer_backend.engine.onednn_linear import route_linears
from trainer_backend.engine.output_head import linear_output_head
from trainer_backend.engine.residency import AdapterResidency, SamplerAdapters
from trainer_backend.engine.sampling import BoundSamplingRequest, Joining, JoinRoom, sample_batch
from trainer_backend.engine.training_pass import TrainingPass
from trainer_backend.engine.types import (
    AdamSettings,
    DecodedDatum,
    ForwardBackwardCall,
    ForwardBackwardResult,
    LoraSettings,
    SamplingInputError,
    SamplingRequest,
    SamplingResult,
)
from trainer_backend.engine.weights_proof import SamplerWeightsError, WeightChecks, probe_tokens, write_proof
from trainer_backend.errors import BackendError, UnknownBaseModelError, UserInputError
from trainer_backend.models.loading import LoadedModel, dtype_name

# Logits of this many vocabulary entries (summed over positions) exist at once in a forward/backward: 32 Mi
# fp32 values, 128 MiB. For Gemma's 262,144-entry vocabulary that is 128 positions per chunk.
LOGITS_BUDGET = 32 * 1024 * 1024
# Sampler snapshots kept loaded as adapters; older ones are reloaded from disk on use.
SAMPLER_ADAPTERS_KEPT = 8
# Rows (samples) decoded together in one generation batch; more requests wait for the next batch.
MAX_SAMPLING_ROWS = 64
# What a sampling request comes to: its completions, or why it has none.
SampleOutcome = SamplingResult | SamplingInputError | SamplerWeightsError


class ModelEngine:
    """The base model, its adapters, and the operations the Tinker API asks of them."""

    def __init__(
        self,
        loaded: LoadedModel,
        logits_budget: int = LOGITS_BUDGET,
        activation_budget: int = ACTIVATION_BUDGET_BYTES,
        chunked_logprobs: bool = True,
        spill_root: Path | None = None,
        max_loaded_adapters: int | None = None,
        training_pass: Callable[..., TrainingPass] = TrainingPass,
    ) -> None:
        """`max_loaded_adapters` training adapters stay loaded; the least recently used others go to `spill_root`.
        `training_pass` makes what runs forward/backward: `TrainingPass` itself, or on a sharded backend one that
        runs each process's share of a batch (`sharding/data_parallel.py`)."""
        self.loaded = loaded
        # The engine's own paths read the output embedding's weight as it is (`unembedding.py`); a packed copy
        # would only serve the model's own forward.
        route_linears(loaded.model, unpacked=loaded.model.get_output_embeddings())
        attend_in_fp32(loaded.model)
        # The full-logits path exists to measure what chunking saves (benchmarks/backend_gemma.py).
        logprobs = target_logprobs if chunked_logprobs else full_logits_target_logprobs
        self.adapters = AdapterPool(loaded.model)
        self.residency = AdapterResidency(self.adapters, spill_root, max_loaded_adapters)
        # Every load of sampler weights, on this engine or on vLLM's, is checked and counted here (weights_proof.py).
        self.weight_checks = WeightChecks(dtype_name(loaded.model.dtype))
        self.applied_weights = AppliedWeights(
            self.adapters, probe_tokens(loaded.tokenizer), self._decode, loaded.max_context_length, self.weight_checks
        )
        self.sampler_adapters = SamplerAdapters(self.adapters, SAMPLER_ADAPTERS_KEPT, self.applied_weights)
        if linear_output_head(loaded.model) is None:
            raise UnknownBaseModelError(
                f"base model {loaded.name!r}: its logits are not a linear head (without bias) over its decoder's "
                "hidden states, which the engine's training pass computes on its own; no other causal LM is supported"
            )
        # Activations count at fp32's 4 bytes whatever the base dtype: a bf16 model keeps fp32 copies for backward
        # (attention on a CPU, the norms). Counted at 2 bytes, Gemma's RL step peaked at 6.0 GiB against 4.5 in fp32
        # (`python -m benchmarks.rl_step`, 2026-12-04), when LoRA's inputs were fp32 copies too; since the adapters
        # multiply in bf16 (`MasterWeightLinear`), 2 bytes has not been measured again.
        dtype_bytes = max(4, next(loaded.model.parameters()).element_size())
        self.training = training_pass(
            loaded,
            self.adapters,
            logprobs,
            chunk_tokens=max(1, logits_budget // loaded.vocab_size),
            piece_tokens=max(1, activation_budget // activation_bytes_per_token(loaded.model.config, dtype_bytes)),
        )

    # --- training -----------------------------------------------------------------------------------------

    def create_adapter(self, model_id: str, lora: LoraSettings) -> None:
        self.adapters.create(model_id, lora)
        self.residency.added(model_id)

    def forward_backward(
        self,
        model_id: str,
        datums: Sequence[DecodedDatum],
        loss_fn: str,
        loss_fn_config: dict[str, float | str] | None,
        forward_only: bool,
    ) -> ForwardBackwardResult:
        """Per-datum log-probs and the loss; gradients accumulate in the adapter until `optim_step`."""
        (outcome,) = self.forward_backward_batch(
            [ForwardBackwardCall(model_id, datums, loss_fn, loss_fn_config, forward_only)]
        )
        if isinstance(outcome, BackendError):
            raise outcome
        return outcome

    def forward_backward_batch(
        self, calls: Sequence[ForwardBackwardCall], pause: Callable[[], None] = lambda: None
    ) -> list[ForwardBackwardResult | BackendError]:
        """Several clients' forward/backward requests in one pass over the base model, calling `pause` between its
        micro-batches (other tenants' work may run then; the pass's adapters stay loaded).

        Each row goes through its own client's adapter (PEFT's mixed-batch LoRA); each call's loss is computed on
        its own rows, and the backward of their sum leaves in each adapter exactly the gradient its own call
        alone would (the adapters share no parameters). A call with bad input gets its error; the others run.
        Adapters that train the unembedding take their log-probs through their own low-rank head, so each of
        those runs in a pass of its own.
        """
        outcomes: list[ForwardBackwardResult | BackendError | None] = [None] * len(calls)
        # Calls that can share a pass: same target width, and no adapter on the unembedding (its own key).
        groups: dict[tuple, list[int]] = {}
        for index, call in enumerate(calls):
            try:
                if not call.datums:
                    raise UserInputError("forward_backward needs at least one datum")
                self.residency.use([call.model_id])
                self.adapters.require(call.model_id)
                self.training.check_datums(call.datums)
            except BackendError as error:
                outcomes[index] = error
                continue
            width = tuple(call.datums[0].loss_fn_inputs["target_tokens"].shape[1:])
            own_pass = call.model_id if self.training.trains_unembedding(call.model_id) else None
            groups.setdefault((width, own_pass), []).append(index)
        for group in groups.values():
            # The group's adapters all loaded at once (bringing one back may have spilled another of the group).
            names = [calls[i].model_id for i in group]
            self.residency.use(names)
            with self.residency.held(names):
                results = self.training.run([calls[i] for i in group], pause)
            for index, outcome in zip(group, results, strict=True):
                outcomes[index] = outcome
        release_freed_memory()
        return outcomes

    def optim_step(self, model_id: str, adam: AdamSettings) -> dict[str, float]:
        self.residency.use([model_id])
        return self.adapters.step(model_id, adam)

    def save(self, model_id: str, folder: Path, include_optimizer: bool) -> None:
        """The adapter into `folder`, with the proof a sampler's load of it is checked against."""
        self.residency.use([model_id])
        saved = self.adapters.save(model_id, folder, include_optimizer)
        write_proof(folder, self.applied_weights.prove(model_id, saved))

    def load(self, model_id: str, folder: Path, with_optimizer: bool) -> None:
        self.adapters.load(model_id, folder, with_optimizer=with_optimizer, trainable=True)
        self.residency.added(model_id)

    def close(self) -> None:
        """Nothing of its own to close: the model goes with the process (a sharded engine stops its followers)."""

    def has_adapter(self, model_id: str) -> bool:
        """Whether the training adapter exists, loaded or spilled to disk."""
        return model_id in self.residency

    # --- sampling -----------------------------------------------------------------------------------------

    def sample(self, request: SamplingRequest) -> SamplingResult:
        """Sample from the base model (no `weights_folder`) or from saved sampler weights."""
        (outcome,) = self.sample_batch([request])
        if isinstance(outcome, BackendError):
            raise outcome
        return outcome

    def sample_batch(
        self,
        requests: Sequence[SamplingRequest],
        pause: Callable[[], None] = lambda: None,
        admit: Callable[[Callable[[SamplingRequest], bool]], Sequence[SamplingRequest]] | None = None,
        finished: Callable[[int, SampleOutcome], None] | None = None,
        prefilled: Callable[[], None] = lambda: None,
    ) -> list[SampleOutcome]:
        """Serve several sampling requests, of any mix of weights, in as few generation batches as fit.

        A batch holds at most `MAX_SAMPLING_ROWS` rows and `SAMPLER_ADAPTERS_KEPT` distinct sampler weights, so
        loading one batch's adapters never evicts another of the same batch; nor does a batch that runs in its pause
        (they are held while it runs). `pause` is called every few decode steps (see `sample_batch` in sampling.py).
        With `admit`, the last batch takes in more requests between its steps: `admit(accepts)` returns those to take
        in, each of which `accepts` (within the batch's distinct weights and what its cache can hold, `JoinRoom`), and
        their outcomes follow those of `requests`; `prefilled()` is called once those an `admit` returned are
        prefilled. `finished(index, outcome)` gets each outcome as soon as it exists.
        """
        outcomes: list[SampleOutcome] = []
        batches = _sampling_batches(requests)
        for number, batch in enumerate(batches):
            with self.sampler_adapters.batch() as use:
                joins = admit if number == len(batches) - 1 else None
                outcomes += self._sample_one_batch(batch, use, pause, len(outcomes), joins, finished, prefilled)
        release_freed_memory()
        return outcomes

    def _sample_one_batch(
        self,
        batch: Sequence[SamplingRequest],
        use: Callable[[Path], str],
        pause: Callable[[], None],
        first: int,
        admit: Callable[[Callable[[SamplingRequest], bool]], Sequence[SamplingRequest]] | None,
        finished: Callable[[int, SampleOutcome], None] | None,
        prefilled: Callable[[], None],
    ) -> list[SampleOutcome]:
        # Each request's weights are resolved on their own: weights deleted while their request waited, or refused by
        # the check of their load, fail that request alone, never the other tenants' requests of the batch.
        outcomes: dict[int, SampleOutcome] = {}

        def deliver(index: int, outcome: SampleOutcome) -> None:
            outcomes[index] = outcome
            if finished is not None:
                finished(index, outcome)

        # The batch's index of each job handed to the generation, in its order.
        runnable: list[int] = []
        weights = {request.weights_folder for request in batch}

        def jobs_of(requests: Sequence[SamplingRequest], start: int) -> list[BoundSamplingRequest]:
            jobs = []
            for index, request in enumerate(requests, start):
                try:
                    adapter = None if request.weights_folder is None else use(request.weights_folder)
                except (SamplingInputError, SamplerWeightsError) as error:
                    deliver(index, error)
                    continue
                eos = self.loaded.eos_token_ids if request.stop_at_eos else ()
                jobs.append(BoundSamplingRequest(request=request, adapter=adapter, eos_token_ids=eos))
                runnable.append(index)
            return jobs

        admitted: list[SamplingRequest] = []

        def take_in(room: JoinRoom) -> list[BoundSamplingRequest]:
            def accepts(request: SamplingRequest) -> bool:
                # A batch that started on the bare base model takes in no sampler weights: loading them wraps the
                # model in PEFT, and this batch's forwards do not go through the wrapper. They wait for the next one.
                if request.weights_folder is not None and model is self.adapters.base_model:
                    return False
                if len(weights | {request.weights_folder}) > SAMPLER_ADAPTERS_KEPT or not room.accepts(request):
                    return False
                weights.add(request.weights_folder)
                return True

            requests = admit(accepts)
            admitted.extend(requests)
            return jobs_of(requests, first + len(batch) + len(admitted) - len(requests))

        jobs = jobs_of(batch, first)
        if jobs:
            model = self.adapters.peft_model or self.adapters.base_model
            if admit is None:
                results = sample_batch(model, jobs, self._decode, self.loaded.max_context_length, pause)
                for index, result in zip(runnable, results, strict=True):
                    deliver(index, result)
            else:
                joining = Joining(take_in, lambda job, outcome: deliver(runnable[job], outcome), prefilled)
                sample_batch(model, jobs, self._decode, self.loaded.max_context_length, pause, joining)
        return [outcomes[index] for index in sorted(outcomes)]

    def _decode(self, tokens: Sequence[int]) -> str:
        return self.loaded.tokenizer.decode(list(tokens), skip_special_tokens=False)


def _sampling_batches(requests: Sequence[SamplingRequest]) -> list[list[SamplingRequest]]:
    """Consecutive runs of requests within the row and distinct-weights limits of one generation batch."""
    batches: list[list[SamplingRequest]] = []
    rows, weights = 0, set()
    for request in requests:
        grown = weights | {request.weights_folder}
        if batches and rows + request.num_samples <= MAX_SAMPLING_ROWS and len(grown) <= SAMPLER_ADAPTERS_KEPT:
            batches[-1].append(request)
            rows, weights = rows + request.num_samples, grown
        else:
            batches.append([request])
            rows, weights = request.num_samples, {request.weights_folder}
    return batches
