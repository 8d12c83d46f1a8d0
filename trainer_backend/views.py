"""The registry's REST views: training runs and checkpoints as the SDK's REST client lists them, weights info,
the server's capabilities, and checkpoint deletion. They read the run and checkpoint stores and never queue work
on the device."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from trainer_backend.checkpoints import CheckpointInfo, CheckpointKind, CheckpointPath, CheckpointStore
from trainer_backend.engine.adapters import saved_adapter_settings
from trainer_backend.models.loading import LoadedModel
from trainer_backend.runs import RunStore, TrainingRun
from trainer_backend.wire import schemas


@dataclass(frozen=True, eq=False)
class RegistryViews:
    """Runs and checkpoints of each owner, as the Tinker REST routes answer them."""

    runs: RunStore
    checkpoints: CheckpointStore
    # A run whose adapter the engine no longer holds is reported as corrupted.
    has_adapter: Callable[[str], bool]
    loaded: LoadedModel

    def _checkpoint_view(self, info: CheckpointInfo) -> schemas.Checkpoint:
        return schemas.Checkpoint(
            checkpoint_id=f"{info.kind.value}/{info.name}",
            checkpoint_type="training" if info.kind is CheckpointKind.TRAINING else "sampler",
            time=_moment(info.created_at),
            tinker_path=info.path,
            size_bytes=info.size_bytes,
            expires_at=_moment(info.expires_at) if info.expires_at else None,
        )

    def _run_view(self, run: TrainingRun) -> schemas.TrainingRun:
        checkpoints = self.checkpoints.list(run.owner, run.model_id)
        training = [c for c in checkpoints if c.kind is CheckpointKind.TRAINING]
        sampler = [c for c in checkpoints if c.kind is CheckpointKind.SAMPLER]
        return schemas.TrainingRun(
            training_run_id=run.model_id,
            base_model=run.base_model,
            model_owner=run.owner,
            is_lora=True,
            corrupted=not self.has_adapter(run.model_id),
            lora_rank=run.lora.rank,
            last_request_time=_moment(run.last_request_at),
            last_checkpoint=self._checkpoint_view(training[-1]) if training else None,
            last_sampler_checkpoint=self._checkpoint_view(sampler[-1]) if sampler else None,
        )

    def list_training_runs(self, owner: str, limit: int, offset: int) -> schemas.TrainingRunsResponse:
        runs, total = self.runs.list_training_runs(owner, limit, offset)
        return schemas.TrainingRunsResponse(
            training_runs=[self._run_view(r) for r in runs],
            cursor=schemas.Cursor(offset=offset, limit=limit, total_count=total),
        )

    def training_run(self, owner: str, model_id: str) -> schemas.TrainingRun:
        return self._run_view(self.runs.training_run(owner, model_id))

    def list_checkpoints(self, owner: str, model_id: str | None) -> schemas.CheckpointsListResponse:
        if model_id is not None:
            self.runs.training_run(owner, model_id)
        infos = self.checkpoints.list(owner, model_id)
        return schemas.CheckpointsListResponse(checkpoints=[self._checkpoint_view(i) for i in infos])

    def delete_checkpoint(self, owner: str, model_id: str, checkpoint_id: str) -> None:
        kind, _, name = checkpoint_id.partition("/")
        self.checkpoints.delete(owner, CheckpointPath.parse(f"tinker://{model_id}/{kind}/{name}"))

    def weights_info(self, owner: str, tinker_path: str) -> schemas.WeightsInfoResponse:
        path = CheckpointPath.parse(tinker_path)
        info = self.checkpoints.info(owner, path)
        lora = saved_adapter_settings(self.checkpoints.folder(path))
        return schemas.WeightsInfoResponse(
            base_model=info.base_model,
            is_lora=True,
            lora_rank=lora.rank,
            train_attn=lora.train_attn,
            train_mlp=lora.train_mlp,
            train_unembed=lora.train_unembed,
        )

    def capabilities(self) -> schemas.GetServerCapabilitiesResponse:
        return schemas.GetServerCapabilitiesResponse(
            supported_models=[
                schemas.SupportedModel(
                    model_name=self.loaded.name,
                    max_context_length=self.loaded.max_context_length,
                    trainable=True,
                    sampleable=True,
                )
            ]
        )


def _moment(timestamp: float) -> datetime:
    """The UTC time of a stored timestamp; one past what a datetime can hold (a store written before TTLs were
    bounded) reads as the latest time there is, so that it never breaks a listing."""
    try:
        return datetime.fromtimestamp(timestamp, UTC)
    except (OverflowError, OSError, ValueError):
        return datetime.max.replace(tzinfo=UTC) if timestamp > 0 else datetime.min.replace(tzinfo=UTC)
