"""Which adapters stay loaded. Training adapters: past a limit, the least recently used ones wait on disk. Sampler
weights: a few stay loaded as adapters, the least recently used unloaded (they are read again from their checkpoint).

A training adapter on disk is its PEFT folder with the optimizer state beside it, written exactly as a checkpoint is, so
bringing it back restores the same weights and Adam moments. The number of tenants is then bounded by disk, not by
device memory. An adapter holding gradients (a forward_backward not yet followed by its optim_step) stays loaded:
writing it out would lose them, so the limit is exceeded for a while instead.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path

from safetensors import SafetensorError

from trainer_backend.engine.adapters import AdapterPool
from trainer_backend.engine.applied_weights import AppliedWeights
from trainer_backend.engine.types import SamplingInputError
from trainer_backend.engine.weights_proof import SamplerWeightsError
from trainer_backend.errors import UserInputError

log = logging.getLogger(__name__)


class AdapterResidency:
    """Training adapters loaded in `adapters` (at most `limit`, least recently used out first) or spilled."""

    def __init__(self, adapters: AdapterPool, spill_root: Path | None, limit: int | None) -> None:
        if limit is not None and spill_root is None:
            raise ValueError("a limit on loaded adapters needs a spill folder")
        self.adapters = adapters
        self.spill_root = spill_root
        self.limit = limit
        self._loaded: OrderedDict[str, None] = OrderedDict()
        self._spilled: dict[str, Path] = {}
        # Adapters of training passes under way (a pass pauses between its micro-batches): never spilled.
        self._held: Counter[str] = Counter()
        if spill_root is not None:
            # Adapters spilled by an earlier process are gone with its runs; resume goes through checkpoints.
            shutil.rmtree(spill_root, ignore_errors=True)

    def __contains__(self, name: str) -> bool:
        return name in self._loaded or name in self._spilled

    @property
    def spilled(self) -> int:
        return len(self._spilled)

    @property
    def loaded(self) -> int:
        return len(self._loaded)

    def added(self, name: str) -> None:
        """`name` was just created or loaded into the pool (any spilled copy is stale)."""
        stale = self._spilled.pop(name, None)
        if stale is not None:
            shutil.rmtree(stale, ignore_errors=True)
        self._loaded[name] = None
        self._loaded.move_to_end(name)
        self._spill_over_limit(keep={name})

    def use(self, names: Collection[str]) -> None:
        """Make sure these adapters are loaded (bringing spilled ones back) and count them as just used."""
        for name in names:
            folder = self._spilled.pop(name, None)
            if folder is not None:
                self.adapters.load(name, folder, with_optimizer=True, trainable=True)
                shutil.rmtree(folder, ignore_errors=True)
                self._loaded[name] = None
            if name in self._loaded:
                self._loaded.move_to_end(name)
        self._spill_over_limit(keep=set(names))

    @contextmanager
    def held(self, names: Collection[str]) -> Iterator[None]:
        """Within it, these adapters stay loaded whatever else is used: a training pass pauses between its
        micro-batches, and the work run in its pauses must not spill the adapters it is part way through."""
        self._held.update(names)
        try:
            yield
        finally:
            self._held.subtract(names)
            self._held = +self._held

    def _spill_over_limit(self, keep: set[str]) -> None:
        if self.limit is None:
            return
        for name in list(self._loaded):
            if len(self._loaded) <= self.limit:
                return
            if name in keep or name in self._held or self.adapters.has_gradients(name):
                continue
            folder = self.spill_root / name
            folder.mkdir(parents=True, exist_ok=True)
            self.adapters.save(name, folder, include_optimizer=True)
            self.adapters.delete(name)
            del self._loaded[name]
            self._spilled[name] = folder
        if len(self._loaded) > self.limit:
            log.warning(
                "%d training adapters hold gradients; the limit of %d loaded is exceeded", len(self._loaded), self.limit
            )


class SamplerAdapters:
    """Sampler weights loaded in `adapters` from their checkpoint folders, at most `limit` (least recently used out
    first), each under a name that changes when its folder's weights are saved again.

    Weights a running generation batch uses are held: none is unloaded until its batch ends, even past the limit. A
    batch may run inside another's pause (another tenant's generation), and the paused batch still needs its own.
    """

    def __init__(self, adapters: AdapterPool, limit: int, applied: AppliedWeights) -> None:
        """`applied` checks each load: the weights are the ones saved, and change the model as they did."""
        self.adapters = adapters
        self.limit = limit
        self.applied = applied
        # Loaded sampler weights, least recently used first: name -> the sha256 they were shown applied with.
        self._loaded: OrderedDict[str, str] = OrderedDict()
        self._held: Counter[str] = Counter()

    @contextmanager
    def batch(self) -> Iterator[Callable[[Path], str]]:
        """`use` for one generation batch: every adapter it returns stays loaded until the block ends."""
        held: list[str] = []

        def use(folder: Path) -> str:
            name = self.use(folder)
            self._held[name] += 1
            held.append(name)
            return name

        try:
            yield use
        finally:
            self._held.subtract(held)
            self._held = +self._held

    def use(self, folder: Path) -> str:
        """The loaded adapter of the sampler weights in `folder`, loading them on first use; the least recently used
        weights that no running batch holds are unloaded past the limit.

        Raises:
            SamplingInputError: the weights are gone or unreadable (deleted after the request was queued); the
                message names no server path.
            SamplerWeightsError: the weights loaded could not be shown to be the saved ones, applied.
        """
        try:
            proof = self.applied.read(folder)
            # Named by content: weights saved again under the same path are other weights, never a cached copy.
            # Weights saved before proofs existed are named by their file's path and time instead.
            stamp = proof.weights_sha256 if proof else (folder / "adapter_model.safetensors").stat().st_mtime_ns
        except OSError:
            raise SamplingInputError("the sampler weights were deleted before this request ran") from None
        name = sampler_adapter_name(folder, stamp)
        if name in self._loaded:
            held = self._loaded[name]
            if proof is not None and held != proof.weights_sha256:
                # Only a fault makes a name stale; unloaded (unless a running batch holds it), it loads afresh next.
                if not self._held[name]:
                    del self._loaded[name]
                    self.adapters.delete(name)
                self.applied.stale(folder, held, proof)
            self._loaded.move_to_end(name)
            return name
        try:
            self.adapters.load(name, folder, with_optimizer=False, trainable=False)
            applied = self.applied.check(name, folder, proof)
        except (OSError, ValueError, SafetensorError, UserInputError, SamplerWeightsError) as error:
            # Deleted while loading, not weights of this model, or not shown applied: take back what was added.
            if name in self.adapters:
                self.adapters.delete(name)
            if isinstance(error, SamplerWeightsError):
                raise
            if isinstance(error, UserInputError):
                raise SamplingInputError(str(error)) from None
            raise SamplingInputError("the sampler weights were deleted or damaged before this request ran") from None
        self._loaded[name] = applied
        for evicted in [loaded for loaded in self._loaded if loaded != name and loaded not in self._held]:
            if len(self._loaded) <= self.limit:
                break
            del self._loaded[evicted]
            self.adapters.delete(evicted)
        return name


def sampler_adapter_name(folder: Path, stamp: str | int) -> str:
    """The adapter name of the sampler weights in `folder` whose content (or, saved before proofs, file time) is
    `stamp`: weights saved again under the same path get another name, so a cached adapter never stands in for them."""
    return "sampler-" + hashlib.sha256(f"{folder.resolve()}:{stamp}".encode()).hexdigest()[:16]
