"""Starting a sharded backend's leader: the checks made before any process starts, then the followers (unless
torchrun started them), then the leader's own engine."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from trainer_backend.config import ServerConfig
from trainer_backend.errors import UserInputError
from trainer_backend.models.registry import ResolvedModel
from trainer_backend.sharding.group import ShardPlace, free_port, start_followers
from trainer_backend.sharding.replica import LeaderEngine
from trainer_backend.sharding.shard_model import decoder_layers
from trainer_backend.sharding.shards import EngineSettings, sharded_engine


def torchrun_place() -> ShardPlace | None:
    """This process's place in a group torchrun started (more than one process); None otherwise."""
    place = ShardPlace.from_environment()
    return place if place is not None and place.world > 1 else None


def shard_place(config: ServerConfig) -> ShardPlace | None:
    """This process's place in a sharded backend: torchrun's, or rank 0 of `--shards` processes; None for one."""
    place = torchrun_place()
    if place is not None:
        if config.shards not in (1, place.world):
            raise UserInputError(f"--shards {config.shards} disagrees with torchrun's WORLD_SIZE {place.world}")
        return place
    return ShardPlace(0, config.shards, port=free_port()) if config.shards > 1 else None


def engine_settings(config: ServerConfig, cache_root: Path, device: torch.device) -> EngineSettings:
    """The engine's settings from the server's config: the one process's, or every process's of a group."""
    return EngineSettings(
        base_model=config.base_model,
        model_cache=cache_root,
        device=device.type,
        dtype=config.dtype,
        activation_budget=config.max_training_activation_bytes,
        spill_root=config.storage_root / "spill",
        max_loaded_adapters=config.max_loaded_adapters,
    )


def check_shards(place: ShardPlace, device: torch.device, resolved: ResolvedModel, sampler: str = "builtin") -> None:
    """Refuse, before any process starts, a group this machine or this model cannot hold.

    Raises:
        UserInputError: a device other than CPUs or CUDA GPUs, a GPU index (each process takes its rank's), more
            processes than GPUs (or than CPU cores), or vLLM as the `sampler` of CPU processes.
        UnknownBaseModelError: the model keeps no list of decoder layers to shard.
    """
    if device.type not in ("cpu", "cuda"):
        raise UserInputError(f"a sharded backend runs on CPUs (gloo) or CUDA GPUs (NCCL), not on {device.type}")
    if sampler == "vllm" and device.type != "cuda":
        raise UserInputError(
            "--sampler vllm with --shards splits vLLM over the processes' GPUs (tensor parallelism), which CPUs "
            "cannot: a sharded backend on CPUs samples with the built-in engine (--sampler builtin)"
        )
    if device.type == "cuda" and device.index is not None:
        raise UserInputError(f"--device {device} with --shards: name no GPU, each process takes the GPU of its rank")
    available = torch.cuda.device_count() if device.type == "cuda" else os.cpu_count() or 1
    unit = "GPUs" if device.type == "cuda" else "CPU cores"
    if place.world > available:
        raise UserInputError(f"--shards {place.world} asks for more processes than the {available} {unit} here")
    # The model's structure from its config alone, on the meta device: nothing is loaded or allocated.
    config = AutoConfig.from_pretrained(resolved.folder, local_files_only=True)
    with torch.device("meta"):
        decoder_layers(AutoModelForCausalLM.from_config(config))


def lead(
    config: ServerConfig, place: ShardPlace, resolved: ResolvedModel, cache_root: Path, device: torch.device
) -> LeaderEngine:
    """The leader's engine over its shard, the followers started first where torchrun did not start them (the model
    is already converted into the cache, so that they find it there)."""
    check_shards(place, device, resolved, config.sampler)
    settings = engine_settings(config, cache_root, device)
    followers = None if torchrun_place() else start_followers(place, settings.arguments())
    try:
        group, engine = sharded_engine(settings, place)
    except BaseException:
        if followers is not None:
            followers.expect_exit()
            followers.wait(timeout_s=0)
        raise
    return LeaderEngine(engine, group, followers)
