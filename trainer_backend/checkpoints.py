"""Checkpoint paths and folders: `tinker://<model>/weights/<name>` and `tinker://<model>/sampler_weights/<name>`.

Each checkpoint is a folder under the storage root holding a PEFT adapter (`adapter_model.safetensors`,
`adapter_config.json`, loadable by peft and transformers as is), the optimizer state for training checkpoints,
and `checkpoint.json` with who owns it. Names are validated, so a path can never leave the storage root.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import time
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path

from trainer_backend.errors import ConflictError, NotFoundError, UserInputError

log = logging.getLogger(__name__)

SCHEME = "tinker://"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_MODEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9:._-]{0,127}")
METADATA_FILE = "checkpoint.json"
# Marks a folder a checkpoint is written into before it is moved into place.
_STAGING = ".staging-"
OPTIMIZER_FILE = "optimizer.pt"


class CheckpointKind(StrEnum):
    TRAINING = "weights"  # adapter + optimizer state: resumes training
    SAMPLER = "sampler_weights"  # adapter only: for sampling


@dataclass(frozen=True)
class CheckpointPath:
    model_id: str
    kind: CheckpointKind
    name: str

    def __str__(self) -> str:
        return f"{SCHEME}{self.model_id}/{self.kind.value}/{self.name}"

    @classmethod
    def parse(cls, path: str) -> CheckpointPath:
        """Parse and validate a tinker:// path; raises UserInputError saying what is wrong with it."""
        if not path.startswith(SCHEME):
            raise UserInputError(f"checkpoint path {path!r} must start with {SCHEME}")
        parts = path[len(SCHEME) :].split("/")
        if len(parts) != 3:
            raise UserInputError(f"checkpoint path {path!r} must look like {SCHEME}<model_id>/weights/<name>")
        model_id, kind, name = parts
        if kind not in {k.value for k in CheckpointKind}:
            raise UserInputError(f"checkpoint path {path!r}: kind must be 'weights' or 'sampler_weights'")
        if not _MODEL_ID.fullmatch(model_id):
            raise UserInputError(f"checkpoint path {path!r} has an invalid model id")
        validate_name(name)
        return cls(model_id, CheckpointKind(kind), name)


def checkpoint_label(folder: Path) -> str:
    """The tinker:// path of a checkpoint folder (`CheckpointStore.folder` read backwards), for messages that must
    not show the server's paths."""
    run, kind, name = folder.parts[-3:]
    return f"{SCHEME}{run.replace('__', ':')}/{kind}/{name}"


def folder_bytes(folder: Path) -> int:
    """The bytes of the files in a checkpoint folder (what a checkpoint's `size_bytes` counts)."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def validate_name(name: str) -> str:
    if not _NAME.fullmatch(name) or ".." in name:
        raise UserInputError(
            f"invalid checkpoint name {name!r}: use 1-128 letters, digits, '.', '_' or '-', starting with a letter "
            "or digit"
        )
    return name


@dataclass(frozen=True)
class CheckpointInfo:
    path: str
    owner: str
    model_id: str
    kind: CheckpointKind
    name: str
    base_model: str
    created_at: float
    size_bytes: int
    has_optimizer: bool
    expires_at: float | None = None


class CheckpointStore:
    """Checkpoint folders under one storage root; every lookup checks the owner."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        removed = self._remove_staging()
        if removed:
            log.info("removed %d half-written checkpoint folders left by an earlier run", removed)

    def _remove_staging(self) -> int:
        """Delete staging folders a crash or a failed save left behind (tens of MB each); how many there were.

        Called at start-up, before any save can be under way.
        """
        staging = list(self.root.glob(f"runs/*/*/.*{_STAGING}*"))
        for folder in staging:
            shutil.rmtree(folder, ignore_errors=True)
        return len(staging)

    def discard(self, staging: Path) -> None:
        """Delete the staging folder of a save that failed; the checkpoint it would have replaced stays as it was."""
        shutil.rmtree(staging, ignore_errors=True)

    def folder(self, path: CheckpointPath) -> Path:
        # model ids contain ':', which some file systems dislike; the folder name replaces it.
        return self.root / "runs" / path.model_id.replace(":", "__") / path.kind.value / path.name

    def prepare(self, path: CheckpointPath, overwrite: bool = True) -> Path:
        """An empty staging folder to write the checkpoint into; `commit` moves it into place."""
        target = self.folder(path)
        if target.exists() and not overwrite:
            raise ConflictError(f"checkpoint {path} already exists")
        staging = target.with_name(f".{target.name}{_STAGING}{time.monotonic_ns()}")
        staging.mkdir(parents=True)
        return staging

    def commit(
        self,
        path: CheckpointPath,
        staging: Path,
        owner: str,
        base_model: str,
        ttl_seconds: float | None = None,
    ) -> CheckpointInfo:
        """Write the metadata and swap the staging folder in, so a crash never leaves half a checkpoint."""
        size = folder_bytes(staging)
        now = time.time()
        info = CheckpointInfo(
            path=str(path),
            owner=owner,
            model_id=path.model_id,
            kind=path.kind,
            name=path.name,
            base_model=base_model,
            created_at=now,
            size_bytes=size,
            has_optimizer=(staging / OPTIMIZER_FILE).exists(),
            expires_at=now + ttl_seconds if ttl_seconds else None,
        )
        (staging / METADATA_FILE).write_text(json.dumps(asdict(info)))
        target = self.folder(path)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
        return info

    def info(self, owner: str, path: CheckpointPath) -> CheckpointInfo:
        """The checkpoint's metadata; NotFoundError when it is missing or belongs to another key."""
        metadata = self.folder(path) / METADATA_FILE
        if not metadata.exists():
            raise NotFoundError(f"checkpoint {path} not found")
        info = _read_info(metadata)
        if info.owner != owner:
            raise NotFoundError(f"checkpoint {path} not found")
        if info.expires_at is not None and info.expires_at < time.time():
            raise NotFoundError(f"checkpoint {path} expired")
        return info

    def list(self, owner: str, model_id: str | None = None) -> list[CheckpointInfo]:
        if model_id is not None and not _MODEL_ID.fullmatch(model_id):
            raise UserInputError(f"invalid model id {model_id!r}")
        run_folder = model_id.replace(":", "__") if model_id else "*"
        live = self._live(f"runs/{run_folder}/*/*/{METADATA_FILE}")
        return sorted((i for i in live if i.owner == owner), key=lambda i: i.created_at)

    def _live(self, pattern: str) -> list[CheckpointInfo]:
        """The readable, unexpired checkpoints whose metadata files match `pattern`."""
        infos = [info for p in self.root.glob(pattern) if (info := _readable_info(p)) is not None]
        now = time.time()
        return [i for i in infos if i.expires_at is None or i.expires_at >= now]

    def delete_expired(self) -> int:
        """Remove checkpoints past their TTL (ephemeral sampler weights, saves with ttl_seconds)."""
        now = time.time()
        removed = 0
        for metadata in self.root.glob(f"runs/*/*/*/{METADATA_FILE}"):
            info = _readable_info(metadata)
            if info is not None and info.expires_at is not None and info.expires_at < now:
                shutil.rmtree(metadata.parent, ignore_errors=True)
                removed += 1
        return removed

    def usage_bytes(self, owner: str, replacing: CheckpointPath | None = None) -> int:
        """Bytes of `owner`'s live checkpoints, less the one at `replacing` (a save about to overwrite it)."""
        return sum(info.size_bytes for info in self.list(owner) if replacing is None or info.path != str(replacing))

    def usage_by_owner(self) -> dict[str, int]:
        """Bytes of live checkpoints by owner, in one pass over every checkpoint's metadata."""
        used: dict[str, int] = {}
        for info in self._live(f"runs/*/*/*/{METADATA_FILE}"):
            used[info.owner] = used.get(info.owner, 0) + info.size_bytes
        return used

    def prunable(self, model_id: str, kind: CheckpointKind, keep: int, in_use: set[Path]) -> list[CheckpointInfo]:
        """The run's checkpoints of `kind` older than its `keep` most recent, except folders in `in_use` (a queued
        request still reads them; a later prune takes them)."""
        pattern = f"runs/{model_id.replace(':', '__')}/{kind.value}/*/{METADATA_FILE}"
        infos = [info for p in self.root.glob(pattern) if (info := _readable_info(p)) is not None]
        infos.sort(key=lambda info: info.created_at, reverse=True)
        return [info for info in infos[keep:] if self._folder_of(info) not in in_use]

    def prune(self, model_id: str, kind: CheckpointKind, keep: int, in_use: set[Path]) -> list[str]:
        """Remove what `prunable` names; the paths removed."""
        removed = self.prunable(model_id, kind, keep, in_use)
        for info in removed:
            shutil.rmtree(self._folder_of(info), ignore_errors=True)
        return [info.path for info in removed]

    def _folder_of(self, info: CheckpointInfo) -> Path:
        return self.folder(CheckpointPath(info.model_id, info.kind, info.name))

    def delete(self, owner: str, path: CheckpointPath) -> None:
        self.info(owner, path)
        shutil.rmtree(self.folder(path))


def _readable_info(metadata: Path) -> CheckpointInfo | None:
    """The metadata of one checkpoint found by a listing, or None (logged) when it cannot be read: one damaged file
    must not break every owner's listing."""
    try:
        return _read_info(metadata)
    except (OSError, ValueError, TypeError, KeyError) as error:
        log.warning("skipping unreadable checkpoint metadata %s: %s", metadata, error)
        return None


def _read_info(metadata: Path) -> CheckpointInfo:
    data = json.loads(metadata.read_text())
    data["kind"] = CheckpointKind(data["kind"])
    return CheckpointInfo(**data)
