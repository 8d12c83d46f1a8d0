"""The domain layer of the server: what each Tinker API call does, independent of HTTP.

Every mutating call becomes a durable future (ledger) and an operation for the device worker (scheduler); reads
answer at once, the registry's from `views`, the status from `status_view`. What a key may hold (its runs' metadata
and retention, its storage quota) is `tenancy`'s to say. Requests arrive as wire types and are converted to the
engine's at this edge. Every lookup goes through the caller's owner, so one API key never reaches another's runs,
sampling sessions or checkpoints.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from trainer_backend.abandoned_sessions import AbandonedSessions
from trainer_backend.batch_invariance import runs_alone, session_batch_invariance
from trainer_backend.checkpoints import (
    CheckpointInfo,
    CheckpointKind,
    CheckpointPath,
    CheckpointStore,
    validate_name,
)
from trainer_backend.config import ServerConfig
from trainer_backend.duty_cycle import DutyCycle
from trainer_backend.engine.adapters import saved_adapter_settings
from trainer_backend.engine.model_engine import ModelEngine
from trainer_backend.engine.types import ForwardBackwardCall, SamplingRequest, SamplingResult
from trainer_backend.errors import (
    BackendError,
    NotFoundError,
    OverloadedError,
    ServerError,
    UserInputError,
)
from trainer_backend.ledger import FutureRecord, Ledger, ResultFormat
from trainer_backend.operations import BatchKind, Operation, Outcome, PauseCallback
from trainer_backend.request_kinds import RequestKind
from trainer_backend.runs import RunStore, SamplingSession, TrainingRun
from trainer_backend.samplers.answers import SampleAnswers
from trainer_backend.samplers.builtin import BuiltinSampler
from trainer_backend.samplers.interface import RecordedSamplingRequest
from trainer_backend.samplers.routing import build_sampler
from trainer_backend.scheduler import Scheduler
from trainer_backend.server_state import BUSY_WINDOWS_S, AdapterCounts, ServerState
from trainer_backend.sharding.replica import LeaderEngine
from trainer_backend.status_view import server_status
from trainer_backend.tenancy import EPHEMERAL_TTL_S, TenancyPolicy
from trainer_backend.tenant_usage import OnDevice, TenantUsage
from trainer_backend.views import RegistryViews
from trainer_backend.wire import schemas
from trainer_backend.wire.proto import ForwardBackwardBatch, encode_forward_backward_output
from trainer_backend.wire.status import ServerStatus

log = logging.getLogger(__name__)

RESTART_REASON = "the server restarted while this request was queued or running; submit it again"
# The batch kind of forward and forward_backward requests: those of different clients share a pass over the base
# model. (Sampling's is the built-in sampler's.)
TRAINING_PASS = "training_pass"
# Whether a training pass pauses between its micro-batches (for others' saves, optimizer steps and passes) and, nested
# in a generation's pause, gives the device back between them until that generation's next pause (`BatchKind.parks`),
# rather than holding it to its end: in a study's two Qwen trials a pass took 25-68 s, a generation waited for all of
# it, and the trial whose passes fell in a 5-minute window held up to 74% of it (issue 48). Off is the rule before
# 2026-12-07, kept as the variant `passes-whole` (benchmarks/scheduler_variants.py).
TRAINING_PASSES_PAUSE = True
# Operations that may run while a long generation pauses: they touch only their own training adapter and files,
# never the set of loaded adapters a generation relies on.
INTERLEAVING_KINDS = frozenset(
    {
        RequestKind.FORWARD,
        RequestKind.FORWARD_BACKWARD,
        RequestKind.OPTIM_STEP,
        RequestKind.SAVE_WEIGHTS,
        RequestKind.SAVE_WEIGHTS_FOR_SAMPLER,
    }
)


def body_hash(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _json(model: schemas.BaseModel | dict) -> tuple[bytes, ResultFormat]:
    data = model if isinstance(model, dict) else model.model_dump(mode="json", exclude_none=True)
    return json.dumps(data).encode(), ResultFormat.JSON


class SequencedRequest(Protocol):
    """A training client's request: it holds a place in its model's seq_id order."""

    @property
    def model_id(self) -> str | None: ...

    @property
    def seq_id(self) -> int | None: ...


Request = TypeVar("Request", bound=SequencedRequest)
SequencedCall = Callable[["TrainingService", str, Request, bytes, str | None], "Submitted"]


def releases_seq_id_on_refusal(call: SequencedCall[Request]) -> SequencedCall[Request]:
    """Refusing a training request also releases its seq_id.

    The SDK numbers a client's requests before sending them and goes on numbering after a refusal, so a refused
    seq_id would otherwise hold the client's next requests until `gap_timeout_s` fails them.
    """

    @functools.wraps(call)
    def refusing(service: TrainingService, owner: str, request: Request, body: bytes, key: str | None) -> Submitted:
        try:
            return call(service, owner, request, body, key)
        except (UserInputError, NotFoundError):
            service.release_seq_id(owner, request.model_id, request.seq_id)
            raise

    return refusing


@dataclass(frozen=True)
class Submitted:
    """A future the client polls, with the extra fields some calls return alongside it."""

    record: FutureRecord
    model_id: str | None = None
    sample_sequence_ids: list[str] | None = None
    # A sampling request's own result, once its future completes (None for a request answered from the ledger).
    sampled: Future[SamplingResult] | None = None


class TrainingService:
    """One base model served to many owners: sessions, runs, futures, checkpoints, sampling."""

    def __init__(self, config: ServerConfig, engine: ModelEngine | LeaderEngine) -> None:
        """`engine`: the device's engine over the loaded base model, or the leader's of a sharded backend."""
        self.config = config
        self.loaded = loaded = engine.loaded
        config.storage_root.mkdir(parents=True, exist_ok=True)
        self.ledger = Ledger(config.storage_root / "ledger.sqlite3")
        failed = self.ledger.fail_unfinished(RESTART_REASON)
        if failed:
            log.warning("marked %d futures from the previous run as failed", failed)
        self.runs = RunStore(config.storage_root / "runs.sqlite3")
        self.checkpoints = CheckpointStore(config.storage_root / "checkpoints")
        expired = self.checkpoints.delete_expired()
        if expired:
            log.info("deleted %d expired checkpoints", expired)
        self.engine = engine
        self.scheduler = Scheduler(
            self.ledger,
            max_queued=config.max_queued,
            gap_timeout_s=config.gap_timeout_s,
            max_queued_per_owner=config.max_queued_per_key,
        )
        self.training_pass = BatchKind(TRAINING_PASS, self._run_forward_backward, parks=TRAINING_PASSES_PAUSE)
        self.scheduler.register(self.training_pass)
        self.duty_cycle = DutyCycle()
        self.scheduler.on_busy(self.duty_cycle.record)
        self.usage = TenantUsage()
        self.scheduler.on_device_time(self._count_device_time)
        self.tenancy = TenancyPolicy(
            self.runs,
            self.checkpoints,
            self.scheduler.folders_in_use,
            loaded.name,
            config.max_storage_bytes_per_key,
            config.keep_checkpoints_per_run,
            config.max_queued_per_key,
        )
        self.views = RegistryViews(self.runs, self.checkpoints, self.engine.has_adapter, loaded)
        answers = SampleAnswers(self.ledger, self.usage)
        builtin = BuiltinSampler(self.engine, self.scheduler, answers, config.max_generation_batch_tokens)
        self.sampler = build_sampler(config, builtin, loaded, answers)
        self.abandoned = AbandonedSessions(self.runs, self.scheduler, config.abandoned_session_s)

    def close(self) -> None:
        self.abandoned.close()
        self.sampler.close()
        self.scheduler.stop()
        self.engine.close()
        self.ledger.close()
        self.runs.close()

    # --- futures ------------------------------------------------------------------------------------------

    def _submit(
        self,
        owner: str,
        kind: RequestKind,
        model_id: str,
        body: bytes,
        *,
        seq_id: int | None,
        idempotency_key: str | None,
        work: Callable[[], tuple[bytes, ResultFormat]] | None = None,
        training_call: ForwardBackwardCall | None = None,
        reads: Path | None = None,
    ) -> Submitted:
        """Record a future of training run `model_id` and queue its operation on the run's lane, in `seq_id` order:
        `work`, or a forward/backward call for the training pass (which batches it with other clients'). `reads`: the
        checkpoint folder it needs, kept until it has run."""
        record, created = self.ledger.submit(
            owner,
            kind,
            body_hash(body),
            model_id=model_id,
            seq_id=seq_id,
            idempotency_key=idempotency_key,
        )
        if created:
            operation = Operation(
                record.request_id,
                kind,
                model_id,
                work,
                seq_id,
                batch_kind=self.training_pass if training_call is not None else None,
                payload=training_call,
                interleaves=kind in INTERLEAVING_KINDS,
                owner=owner,
                run=model_id,
                reads=reads,
            )
            self._start(record, lambda: self.scheduler.submit(operation))
        return Submitted(record, model_id=model_id)

    def _start(self, record: FutureRecord, start: Callable[[], None]) -> None:
        """Run `start` (queue the recorded future's work); a refusal takes the record back or fails it."""
        try:
            start()
        except OverloadedError:
            # The client retries a 429 with the same body and seq_id: that retry must be queued, not answered with
            # this refusal.
            self.ledger.discard(record.request_id)
            raise
        except Exception as error:
            self.ledger.fail(record.request_id, str(error), "server")
            raise

    def release_seq_id(self, owner: str, model_id: str | None, seq_id: int | None) -> None:
        """Let the owner's model go on past `seq_id`, whose request was refused before it was queued."""
        if model_id is not None and seq_id is not None and self._known_run(owner, model_id):
            self.scheduler.skip(model_id, seq_id)

    def future(self, owner: str, request_id: str) -> FutureRecord:
        record = self.ledger.get(request_id)
        if record is None or record.owner != owner:
            raise NotFoundError(f"unknown request {request_id!r}")
        return record

    def state(self) -> ServerState:
        """One reading of the server's state, which the status route and /metrics show."""
        stats = self.scheduler.stats()
        in_flight = tuple(self.ledger.in_flight())
        on_device = tuple(
            OnDevice(operation.owner, operation.run, seconds)
            for operation, seconds in self.scheduler.running_device_time()
            if operation.owner is not None
        )
        now, wall_now = time.monotonic(), time.time()
        return ServerState(
            base_model=self.loaded.name,
            read_at=now,
            read_at_wall=wall_now,
            device=stats,
            busy_fraction={w: self.duty_cycle.busy_fraction(w, stats.running_since, now) for w in BUSY_WINDOWS_S},
            in_flight=in_flight,
            futures_by_state=self.ledger.counts_by_state(),
            adapters=AdapterCounts(loaded=self.engine.residency.loaded, spilled=self.engine.residency.spilled),
            tokens_by_phase=self.usage.tokens_by_phase(),
            sampler=self.sampler.status(),
            weight_checks=self.engine.weight_checks.snapshot(),
            on_device=on_device,
            tenants=self.usage.tenants(now, on_device),
        )

    def status(self, owner: str) -> ServerStatus:
        """The device's recent busy fraction, the caller's unfinished futures with their ages, what its key holds
        against the per-key limits and has used, and its recently active runs with their share of the device."""
        state = self.state()
        usage = self.tenancy.key_usage(owner, state)
        runs = self.tenancy.run_usage(owner, self.usage.runs_of(owner, state.read_at, state.on_device), state)
        return server_status(owner, state, usage, runs)

    def _count_device_time(self, operation: Operation, seconds: float) -> None:
        if operation.owner is not None:
            self.usage.add_device_time(operation.owner, operation.run, seconds)

    # --- sessions -----------------------------------------------------------------------------------------

    def create_session(self, owner: str, request: schemas.CreateSessionRequest) -> str:
        return self.runs.create_session(owner, request.tags, session_batch_invariance(request.user_metadata))

    def heartbeat(self, owner: str, session_id: str) -> None:
        self.runs.heartbeat(owner, session_id)

    def finish_session(self, owner: str, session_id: str) -> None:
        self.runs.finish_session(owner, session_id)

    # --- training runs ------------------------------------------------------------------------------------

    def _check_base_model(self, base_model: str | None) -> None:
        if base_model is not None and base_model != self.loaded.name:
            raise UserInputError(f"this server serves base model {self.loaded.name!r}, not {base_model!r}")

    def _live_run(self, owner: str, model_id: str) -> TrainingRun:
        run = self.runs.training_run(owner, model_id)
        if not self.engine.has_adapter(model_id) and not self._creating(model_id):
            raise NotFoundError(
                f"model {model_id!r} lost its live weights when the server restarted; resume from a checkpoint with "
                "create_training_client_from_state"
            )
        self.runs.touch(model_id)
        return run

    def _creating(self, model_id: str) -> bool:
        return self.scheduler.queued(model_id) > 0

    def create_model(self, owner: str, request: schemas.CreateModelRequest, body: bytes, key: str | None) -> Submitted:
        self._check_base_model(request.base_model)
        if request.optimizer_config.type != "adamw":
            raise UserInputError(f"optimizer {request.optimizer_config.type!r} is not supported; use adamw")
        lora = (request.lora_config or schemas.LoraConfig(rank=32)).to_engine()
        if not 1 <= lora.rank <= self.config.max_lora_rank:
            raise UserInputError(
                f"lora_config.rank must be between 1 and this server's limit of {self.config.max_lora_rank} "
                f"(--max-lora-rank), got {lora.rank}"
            )
        run = self.tenancy.create_run(owner, request.session_id, request.model_seq_id, lora, request.user_metadata)

        def work() -> tuple[bytes, ResultFormat]:
            if not self.engine.has_adapter(run.model_id):
                self.engine.create_adapter(run.model_id, lora)
            return _json(schemas.CreateModelResponse(model_id=run.model_id))

        self.scheduler.expect_sequence(run.model_id, 0)
        return self._submit(
            owner, RequestKind.CREATE_MODEL, run.model_id, body, seq_id=0, idempotency_key=key, work=work
        )

    def get_info(self, owner: str, model_id: str) -> schemas.GetInfoResponse:
        run = self.runs.training_run(owner, model_id)
        return schemas.GetInfoResponse(
            model_id=model_id,
            model_data=schemas.ModelData(
                arch=getattr(self.loaded.model.config, "model_type", None),
                model_name=self.loaded.name,
                # A local folder path: the SDK builds the tokenizer with AutoTokenizer.from_pretrained(tokenizer_id).
                tokenizer_id=str(self.loaded.folder),
            ),
            is_lora=True,
            lora_rank=run.lora.rank,
            model_name=self.loaded.name,
        )

    @releases_seq_id_on_refusal
    def forward_backward(self, owner: str, batch: ForwardBackwardBatch, body: bytes, key: str | None) -> Submitted:
        self._live_run(owner, batch.model_id)
        kind = RequestKind.FORWARD if batch.forward_only else RequestKind.FORWARD_BACKWARD

        call = ForwardBackwardCall(
            batch.model_id, batch.datums, batch.loss_fn, batch.loss_fn_config, batch.forward_only
        )
        return self._submit(
            owner, kind, batch.model_id, body, seq_id=batch.seq_id, idempotency_key=key, training_call=call
        )

    def _run_forward_backward(
        self, operations: Sequence[Operation[ForwardBackwardCall]], pause: PauseCallback
    ) -> list[Outcome]:
        """The scheduler's batch runner for training passes: the next request of several clients in one pass, which
        pauses between its micro-batches."""
        calls = [op.payload for op in operations if op.payload is not None]
        outcomes: list[Outcome] = []
        results = self.engine.forward_backward_batch(calls, pause if TRAINING_PASSES_PAUSE else lambda: None)
        for operation, call, result in zip(operations, calls, results, strict=True):
            if isinstance(result, BackendError):
                outcomes.append(result)
                continue
            tokens = sum(len(d.model_input_tokens) for d in call.datums)
            operation.processed_tokens = tokens
            self.usage.add_tokens(operation.owner, operation.run, "trained", tokens)
            outcomes.append((encode_forward_backward_output(result), ResultFormat.PROTO))
        return outcomes

    @releases_seq_id_on_refusal
    def optim_step(self, owner: str, request: schemas.OptimStepRequest, body: bytes, key: str | None) -> Submitted:
        self._live_run(owner, request.model_id)
        if request.adam_params is None:
            raise UserInputError("only Adam is supported: send adam_params")
        adam = request.adam_params.to_engine()

        def work() -> tuple[bytes, ResultFormat]:
            metrics = self.engine.optim_step(request.model_id, adam)
            return _json(schemas.OptimStepResponse(metrics=metrics))

        return self._submit(
            owner, RequestKind.OPTIM_STEP, request.model_id, body, seq_id=request.seq_id, idempotency_key=key, work=work
        )

    def _save(
        self, owner: str, model_id: str, kind: CheckpointKind, name: str, ttl_s: float | None, overwrite: bool
    ) -> CheckpointInfo:
        """Runs on the worker: write the adapter (and optimizer) into a checkpoint folder, within the key's storage
        quota; then the run's older checkpoints past what it keeps are removed."""
        path = CheckpointPath(model_id, kind, validate_name(name))
        staging = self.checkpoints.prepare(path, overwrite=overwrite)
        try:
            self.engine.save(model_id, staging, include_optimizer=kind is CheckpointKind.TRAINING)
            self.tenancy.check_storage_quota(owner, path, staging)
            info = self.checkpoints.commit(path, staging, owner, self.loaded.name, ttl_s)
        except BaseException as error:
            # A failed save leaves nothing half-written behind, and the checkpoint it would have replaced stays.
            self.checkpoints.discard(staging)
            if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                raise ServerError(
                    f"checkpoint {path} was not saved: the server's disk is full; earlier checkpoints are intact"
                ) from error
            raise
        self.tenancy.apply_retention(path)
        return info

    @releases_seq_id_on_refusal
    def save_weights(self, owner: str, request: schemas.SaveWeightsRequest, body: bytes, key: str | None) -> Submitted:
        self._live_run(owner, request.model_id)
        name = validate_name(request.path or f"step-{int(time.time())}")

        def work() -> tuple[bytes, ResultFormat]:
            info = self._save(
                owner, request.model_id, CheckpointKind.TRAINING, name, request.ttl_seconds, overwrite=True
            )
            return _json(schemas.SaveWeightsResponse(path=info.path))

        return self._submit(
            owner,
            RequestKind.SAVE_WEIGHTS,
            request.model_id,
            body,
            seq_id=request.seq_id,
            idempotency_key=key,
            work=work,
        )

    @releases_seq_id_on_refusal
    def save_weights_for_sampler(
        self, owner: str, request: schemas.SaveWeightsForSamplerRequest, body: bytes, key: str | None
    ) -> Submitted:
        run = self._live_run(owner, request.model_id)
        ephemeral = request.path is None
        name = validate_name(request.path) if request.path else f"ephemeral-{secrets.token_hex(8)}"
        ttl = EPHEMERAL_TTL_S if ephemeral else request.ttl_seconds

        def work() -> tuple[bytes, ResultFormat]:
            info = self._save(owner, request.model_id, CheckpointKind.SAMPLER, name, ttl, overwrite=True)
            self.sampler.weights_saved(self.checkpoints.folder(CheckpointPath.parse(info.path)), run.lora)
            if not ephemeral:
                return _json(schemas.SaveWeightsForSamplerResponseInternal(path=info.path))
            session = self.runs.create_sampling_session(owner, run.session_id, self.loaded.name, info.path)
            return _json(schemas.SaveWeightsForSamplerResponseInternal(sampling_session_id=session.sampling_session_id))

        return self._submit(
            owner,
            RequestKind.SAVE_WEIGHTS_FOR_SAMPLER,
            request.model_id,
            body,
            seq_id=request.seq_id,
            idempotency_key=key,
            work=work,
        )

    @releases_seq_id_on_refusal
    def load_weights(self, owner: str, request: schemas.LoadWeightsRequest, body: bytes, key: str | None) -> Submitted:
        path = CheckpointPath.parse(request.path)
        info = self.checkpoints.info(owner, path)
        if info.base_model != self.loaded.name:
            raise UserInputError(f"checkpoint {path} was trained on {info.base_model!r}, not {self.loaded.name!r}")
        if request.optimizer and not info.has_optimizer:
            raise UserInputError(f"checkpoint {path} has no optimizer state; load it without the optimizer")
        folder = self.checkpoints.folder(path)
        if request.model_id is not None:
            # TrainingClient.load_state: into an existing run, in its seq_id order.
            self._live_run(owner, request.model_id)
            model_id, seq_id = request.model_id, request.seq_id
        else:
            # create_training_client_from_state: a new run whose first operation is this load.
            self._check_base_model(request.base_model)
            source = self.runs.training_run(owner, path.model_id) if self._known_run(owner, path.model_id) else None
            lora = source.lora if source else saved_adapter_settings(folder)
            run = self.tenancy.create_run(owner, request.session_id, request.model_seq_id, lora, request.user_metadata)
            model_id, seq_id = run.model_id, 0
            self.scheduler.expect_sequence(model_id, 0)

        def work() -> tuple[bytes, ResultFormat]:
            self.engine.load(model_id, folder, with_optimizer=request.optimizer)
            return _json(schemas.LoadWeightsResponse(path=str(path), model_id=model_id))

        return self._submit(
            owner, RequestKind.LOAD_WEIGHTS, model_id, body, seq_id=seq_id, idempotency_key=key, work=work, reads=folder
        )

    def _known_run(self, owner: str, model_id: str) -> bool:
        try:
            self.runs.training_run(owner, model_id)
        except NotFoundError:
            return False
        return True

    # --- sampling -----------------------------------------------------------------------------------------

    def create_sampling_session(self, owner: str, request: schemas.CreateSamplingSessionRequest) -> str:
        if request.model_path is not None:
            self.checkpoints.info(owner, CheckpointPath.parse(request.model_path))
        else:
            self._check_base_model(request.base_model)
        session = self.runs.create_sampling_session(owner, request.session_id, self.loaded.name, request.model_path)
        return session.sampling_session_id

    def get_sampler(self, owner: str, sampling_session_id: str) -> schemas.GetSamplerResponse:
        session = self.runs.sampling_session(owner, sampling_session_id)
        return schemas.GetSamplerResponse(
            sampler_id=session.sampling_session_id, base_model=session.base_model, model_path=session.model_path
        )

    def sample(self, owner: str, request: schemas.SampleRequest, body: bytes, key: str | None) -> Submitted:
        session_id = request.sampling_session_id
        session = None if session_id is None else self.runs.sampling_session(owner, session_id)
        model_path = self._sampling_weights(owner, request, session)
        sampling = request.to_engine(None if model_path is None else self.checkpoints.folder(model_path))
        lane = session_id or f"base:{owner}"
        run = model_path.model_id if model_path is not None else self._run_sampling_the_base_model(session)
        alone = session_id is not None and runs_alone(self.runs.batch_invariance(session_id), sampling)
        return self.submit_sampling(owner, sampling, lane, body, key, request.prompt_logprobs_last_n, run, alone)

    def _run_sampling_the_base_model(self, session: SamplingSession | None) -> str | None:
        """The run a sample of the base model counts toward: the one training run of the client session that made
        its sampling session (an RL loop's reference log-probs for its KL penalty, its evaluation of the base model),
        so that a study's trials, all of one key, share the device by trial; None where that session trains no run
        or several, or the request names no sampling session."""
        return None if session is None else self.runs.sole_run_of_session(session.session_id)

    def submit_sampling(
        self,
        owner: str,
        request: SamplingRequest,
        lane: str,
        body: bytes,
        key: str | None,
        prompt_logprobs_last_n: int | None = None,
        run: str | None = None,
        batch_invariant: bool = False,
    ) -> Submitted:
        """Record one sampling request (Tinker's `sample`, or an OpenAI-compatible completion) and hand it to the
        sampler; its future resolves to the encoded `SampleResponse`, and `Submitted.sampled` to the engine's result.
        `lane`: the queue it waits in. `run`: the training run its usage and device share count toward (whose sampler
        weights it reads, or whose client session samples the base model). `batch_invariant`: answered as if alone on
        the server (`batch_invariance.py`)."""
        samples = request.num_samples
        if samples > self.config.max_num_samples:
            raise UserInputError(
                f"a request may ask for at most {self.config.max_num_samples} samples on this server "
                f"(--max-num-samples), this one asks for {samples}"
            )
        # Refused here, a 400 to the request itself, rather than as a future that fails once the sampler takes it.
        request.check(self.loaded.vocab_size, self.loaded.max_context_length)
        record, created = self.ledger.submit(owner, RequestKind.SAMPLE, body_hash(body), idempotency_key=key)
        ids = [f"{record.request_id}-{i}" for i in range(samples)]
        if not created:
            return Submitted(record, sample_sequence_ids=ids)
        job = RecordedSamplingRequest(
            record.request_id, owner, lane, run, request, prompt_logprobs_last_n, batch_invariant
        )
        self._start(record, lambda: self.sampler.submit(job))
        return Submitted(record, sample_sequence_ids=ids, sampled=job.result)

    def _sampling_weights(
        self, owner: str, request: schemas.SampleRequest, session: SamplingSession | None
    ) -> CheckpointPath | None:
        """The sampler weights `request` reads (those of its sampling `session`, when it names one); None: the base
        model."""
        if session is not None:
            path = session.model_path
        else:
            self._check_base_model(request.base_model)
            path = request.model_path
        return None if path is None else self.owned_checkpoint(owner, path)

    def owned_checkpoint(self, owner: str, path: str) -> CheckpointPath:
        """The parsed tinker:// path of a checkpoint `owner` may use; raises NotFoundError (or UserInputError for a
        malformed path) otherwise."""
        parsed = CheckpointPath.parse(path)
        self.checkpoints.info(owner, parsed)
        return parsed
