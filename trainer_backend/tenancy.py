"""What one API key may hold on the server, and for how long: its training runs (created with the checkpoint
retention and metadata they ask for), its checkpoints' bytes within `--max-storage-bytes-per-key`, which of a run's
checkpoints go once it has saved more than it keeps, and what the key holds against these limits as the status shows
it.

The service asks this policy before and after it writes; the stores (`runs.py`, `checkpoints.py`) only keep records.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer_backend.checkpoints import CheckpointPath, CheckpointStore, folder_bytes
from trainer_backend.engine.types import LoraSettings
from trainer_backend.errors import QuotaExceededError, UserInputError
from trainer_backend.runs import RunStore, TrainingRun
from trainer_backend.server_state import ServerState
from trainer_backend.tenant_usage import RunTotals, tenant_label
from trainer_backend.wire.status import KeyUsage, RunUsage

log = logging.getLogger(__name__)

# Ephemeral sampler weights (save_weights_and_get_sampling_client) are deleted after this long.
EPHEMERAL_TTL_S = 24 * 3600
# The training run's user_metadata key that says how many checkpoints of each kind it keeps (the most recent).
KEEP_CHECKPOINTS_KEY = "keep_checkpoints"
# A run's user_metadata is kept (the status shows it beside the run's usage) up to this size as JSON: enough for
# names and tags, not a way to store data on the server.
MAX_USER_METADATA_CHARS = 4096


@dataclass(frozen=True, eq=False)
class TenancyPolicy:
    """Runs, storage quota and retention of every key."""

    runs: RunStore
    checkpoints: CheckpointStore
    # The checkpoint folders queued or running operations read, which retention never removes.
    folders_in_use: Callable[[], set[Path]]
    base_model: str
    max_storage_bytes_per_key: int | None
    keep_checkpoints_per_run: int | None
    # Enforced by the scheduler, which holds the queues; shown here beside the key's other limits.
    max_queued_per_key: int | None

    def create_run(
        self,
        owner: str,
        session_id: str,
        model_seq_id: int,
        lora: LoraSettings,
        user_metadata: Mapping[str, Any] | None,
    ) -> TrainingRun:
        """A new training run with what its user_metadata asks for (how many checkpoints it keeps) and keeps (the
        metadata itself); metadata that cannot be honoured is refused before the run exists."""
        keep = self._checkpoints_to_keep(user_metadata)
        metadata = _kept_metadata(user_metadata)
        run = self.runs.create_training_run(owner, session_id, model_seq_id, self.base_model, lora)
        if keep is not None:
            self.runs.set_retention(run.model_id, keep)
        if metadata:
            self.runs.set_metadata(run.model_id, metadata)
        return run

    def _checkpoints_to_keep(self, metadata: Mapping[str, Any] | None) -> int | None:
        """How many checkpoints of each kind a new run keeps: its user_metadata's `keep_checkpoints`, else the
        server's `--keep-checkpoints-per-run`; None keeps them all."""
        value = (metadata or {}).get(KEEP_CHECKPOINTS_KEY)
        if value is None:
            return self.keep_checkpoints_per_run
        if not re.fullmatch(r"\d+", str(value).strip()) or int(value) < 1:
            raise UserInputError(
                f"user_metadata {KEEP_CHECKPOINTS_KEY} must be a whole number of at least 1, got {value!r}"
            )
        return int(value)

    def check_storage_quota(self, owner: str, path: CheckpointPath, staging: Path) -> None:
        """Refuse a checkpoint (written to `staging`, to land at `path`) that would take the key past
        `--max-storage-bytes-per-key`, counting neither the checkpoint it replaces nor those its run's retention
        removes once it lands."""
        limit = self.max_storage_bytes_per_key
        if limit is None:
            return
        size = folder_bytes(staging)
        used = self.checkpoints.usage_bytes(owner, replacing=path)
        keep = self.runs.retention(path.model_id)
        if keep is not None:
            leaving = self.checkpoints.prunable(path.model_id, path.kind, keep - 1, self.folders_in_use())
            used -= sum(info.size_bytes for info in leaving if info.path != str(path))
        if used + size > limit:
            raise QuotaExceededError(
                f"checkpoint {path} was not saved: it takes {size:,} bytes and this API key's checkpoints already "
                f"take {used:,}, past this server's limit of {limit:,} bytes per key (--max-storage-bytes-per-key); "
                "delete checkpoints the key no longer needs. Its saved checkpoints are intact"
            )

    def apply_retention(self, path: CheckpointPath) -> None:
        """Once `path` has landed, remove its run's older checkpoints of that kind past what the run keeps."""
        keep = self.runs.retention(path.model_id)
        if keep is None:
            return
        removed = self.checkpoints.prune(path.model_id, path.kind, keep, self.folders_in_use())
        if removed:
            log.info("removed %d checkpoints of %s past the %d it keeps", len(removed), path.model_id, keep)

    def key_usage(self, owner: str, state: ServerState) -> KeyUsage:
        """What `owner`'s key holds against the per-key limits (its checkpoints' bytes read now) and has used."""
        used = state.tenant(owner)
        return KeyUsage(
            tenant=tenant_label(owner),
            queued=state.device.queued_by_owner.get(owner, 0),
            max_queued=self.max_queued_per_key,
            storage_bytes=self.checkpoints.usage_bytes(owner),
            max_storage_bytes=self.max_storage_bytes_per_key,
            device_seconds=round(used.device_seconds, 3),
            tokens_sampled=used.tokens_sampled,
            tokens_trained=used.tokens_trained,
        )

    def run_usage(self, owner: str, runs: Iterable[RunTotals], state: ServerState) -> list[RunUsage]:
        """`owner`'s recently active runs, each beside the user_metadata it was created with (to tell them apart) and
        its requests open on the device in `state`."""
        return [
            RunUsage(
                model_id=run.model_id,
                user_metadata=self.runs.metadata(run.model_id),
                device_seconds=round(run.device_seconds, 3),
                device_share_1m=round(run.device_share_1m, 4),
                tokens_sampled=run.tokens_sampled,
                tokens_trained=run.tokens_trained,
                open_requests=state.device.open_by_run.get((owner, run.model_id), 0),
            )
            for run in runs
        ]


def _kept_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A new run's user_metadata as it is kept; raises UserInputError past `MAX_USER_METADATA_CHARS`."""
    if not metadata:
        return None
    size = len(json.dumps(metadata))
    if size > MAX_USER_METADATA_CHARS:
        raise UserInputError(
            f"user_metadata takes {size:,} characters as JSON, more than the {MAX_USER_METADATA_CHARS:,} this "
            "server keeps for a run"
        )
    return dict(metadata)
