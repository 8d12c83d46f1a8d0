"""A process's engine over its shard of the base model: join the group, load the model's shard (the leader reads the
weights, the followers receive theirs), build the engine; the same steps on the leader and on every follower, from
the same settings."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from trainer_backend.engine.model_engine import ModelEngine
from trainer_backend.engine.training_pass import TrainingPass
from trainer_backend.models.loading import LoadedModel, select_dtype
from trainer_backend.models.registry import resolve_base_model
from trainer_backend.sharding.data_parallel import DataParallelPass
from trainer_backend.sharding.group import ShardGroup, ShardPlace, shard_device
from trainer_backend.sharding.weights import load_sharded_model


@dataclass(frozen=True)
class EngineSettings:
    """What every process of the group needs to build the same engine: the base model and the engine's limits."""

    base_model: str
    model_cache: Path
    device: str  # "cpu" or "cuda": each process of a GPU node takes the GPU of its rank
    dtype: str
    activation_budget: int
    spill_root: Path
    max_loaded_adapters: int | None = None

    def engine(
        self,
        loaded: LoadedModel,
        spill_root: Path | None = None,
        training_pass: Callable[..., TrainingPass] = TrainingPass,
    ) -> ModelEngine:
        """The engine over `loaded` with these limits, spilling adapters to `spill_root` (default: `spill_root`),
        its forward/backward run by what `training_pass` makes."""
        return ModelEngine(
            loaded,
            activation_budget=self.activation_budget,
            spill_root=spill_root or self.spill_root,
            max_loaded_adapters=self.max_loaded_adapters,
            training_pass=training_pass,
        )

    def arguments(self) -> list[str]:
        """These settings as a follower's command line (`from_arguments` reads them back)."""
        arguments = ["--base-model", self.base_model, "--model-cache", str(self.model_cache), "--device", self.device]
        arguments += ["--dtype", self.dtype, "--activation-budget", str(self.activation_budget)]
        arguments += ["--spill-root", str(self.spill_root)]
        if self.max_loaded_adapters is not None:
            arguments += ["--max-loaded-adapters", str(self.max_loaded_adapters)]
        return arguments

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--base-model", required=True)
        parser.add_argument("--model-cache", type=Path, required=True)
        parser.add_argument("--device", choices=("cpu", "cuda"), required=True)
        parser.add_argument("--dtype", required=True)
        parser.add_argument("--activation-budget", type=int, required=True)
        parser.add_argument("--spill-root", type=Path, required=True)
        parser.add_argument("--max-loaded-adapters", type=int)

    @classmethod
    def from_arguments(cls, parsed: argparse.Namespace) -> EngineSettings:
        return cls(
            parsed.base_model,
            parsed.model_cache,
            parsed.device,
            parsed.dtype,
            parsed.activation_budget,
            parsed.spill_root,
            parsed.max_loaded_adapters,
        )


def sharded_engine(settings: EngineSettings, place: ShardPlace) -> tuple[ShardGroup, ModelEngine]:
    """This process's group and its engine over its shard of the base model."""
    device = shard_device(place, torch.device(settings.device))
    group = ShardGroup(place, device)
    # Under torchrun every process starts at once: the leader converts the model into the cache, the others wait.
    resolved = resolve_base_model(settings.base_model, settings.model_cache) if place.leads else None
    dist.barrier()
    resolved = resolved or resolve_base_model(settings.base_model, settings.model_cache)
    loaded = load_sharded_model(resolved, device, select_dtype(settings.dtype, device), place, group.mesh)
    spill_root = settings.spill_root if place.leads else settings.spill_root / f"shard-{place.rank}"
    return group, settings.engine(loaded, spill_root, DataParallelPass)
