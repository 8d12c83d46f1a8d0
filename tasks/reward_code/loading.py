"""Reward code as a trial uses it: stored as an Optuna artifact, named by its sha256, loaded and checked by hash.

A reward spec names the code by reference (`CodeReference`): the artifact store's directory, the artifact's id and
the source's sha256. `sandbox_for` reads the artifact, refuses it unless its hash is the one named (a file changed
or swapped after the gate admitted it never runs), checks it statically again, and keeps one sandbox per hash for
the life of the process, so every completion a trial scores goes to the same worker.
"""

from __future__ import annotations

import atexit
import hashlib
import threading

from pydantic import BaseModel, ConfigDict, Field

from tasks.reward_code.errors import RewardCodeError
from tasks.reward_code.sandbox import CodeLimits, CodeSandbox
from tasks.reward_code.static_check import check_source


class CodeReference(BaseModel):
    """Where reward code is stored and the hash it must have."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    artifact_store: str = Field(min_length=1, description="directory of the study's FileSystemArtifactStore")
    artifact_id: str = Field(pattern=r"^[A-Za-z0-9._-]{1,100}$", description="the artifact holding the source")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="the source's sha256 (hex), checked on load")


def sha256_of(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def load_source(reference: CodeReference) -> str:
    """The source the reference names.

    Raises:
        RewardCodeError: the artifact is missing or unreadable, or its hash is not the reference's.
    """
    # Imported here: Optuna is loaded only by a process that runs reward code, not by every user of a reward spec.
    from optuna.artifacts import FileSystemArtifactStore
    from optuna.artifacts.exceptions import ArtifactNotFound

    store = FileSystemArtifactStore(reference.artifact_store)
    try:
        with store.open_reader(reference.artifact_id) as reader:
            data = reader.read()
    except (ArtifactNotFound, OSError) as error:
        raise RewardCodeError(
            f"reward code artifact {reference.artifact_id} is not in {reference.artifact_store}: {error}"
        ) from None
    found = hashlib.sha256(data).hexdigest()
    if found != reference.sha256:
        raise RewardCodeError(
            f"reward code artifact {reference.artifact_id} has sha256 {found}, not the {reference.sha256} the reward "
            "spec names: it changed after it was admitted, and is not run"
        )
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise RewardCodeError(f"reward code artifact {reference.artifact_id} is not UTF-8 text") from None


_sandboxes: dict[str, CodeSandbox] = {}
_sandboxes_lock = threading.Lock()


def sandbox_for(reference: CodeReference, limits: CodeLimits | None = None) -> CodeSandbox:
    """The sandbox that runs the referenced code, made on first use and kept until the process exits.

    Raises:
        RewardCodeError: the code does not load (see `load_source`) or the static check refuses it.
    """
    with _sandboxes_lock:
        sandbox = _sandboxes.get(reference.sha256)
        if sandbox is None:
            source = load_source(reference)
            check_source(source)
            sandbox = _sandboxes[reference.sha256] = CodeSandbox(source, limits)
        return sandbox


@atexit.register
def _close_all() -> None:
    with _sandboxes_lock:
        for sandbox in _sandboxes.values():
            sandbox.close()
        _sandboxes.clear()
