"""The base model's weights on every process of a group, read from disk once: the leader loads the model, each
follower builds it on the meta device from its config (no weights), and after the decoder layers are sharded every
weight reaches each follower from the leader, one tensor at a time (`set_model_state_dict` with
`broadcast_from_rank0`, PyTorch's way for FSDP2). A follower holds its shard of each decoder layer and at most one
whole tensor more while it loads: host memory need not hold N copies of the model, even for a moment.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig, PreTrainedModel

from trainer_backend.engine.host_memory import release_freed_memory
from trainer_backend.models.loading import LoadedModel, with_tokenizer
from trainer_backend.models.registry import ResolvedModel
from trainer_backend.sharding.group import ShardPlace
from trainer_backend.sharding.shard_model import gather_once, shard_decoder_layers

# Every weight from rank 0's whole copy into each process's shard (or whole tensor, outside the decoder layers).
_FROM_LEADER = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)


def load_sharded_model(
    resolved: ResolvedModel, device: torch.device, dtype: torch.dtype, place: ShardPlace, mesh: DeviceMesh
) -> LoadedModel:
    """This process's model over its shard of the decoder layers, every weight and buffer the leader's, frozen in
    eval mode. Every process of the group calls it at once (the weights come by collectives)."""
    if place.leads:
        # Loaded on the host: on a GPU node the leader's device holds its shard, like the others', never the whole.
        model = AutoModelForCausalLM.from_pretrained(resolved.folder, dtype=dtype, local_files_only=True)
        whole = model.state_dict()
    else:
        model = _built_on_meta(resolved, dtype)
        whole = {}
    model.eval().requires_grad_(False)
    shard_decoder_layers(model, mesh)
    if place.leads:
        model.to(device)
    else:
        model.to_empty(device=device)
        # `to_empty` gives the input and output embeddings a tensor each: one again, as the leader's are.
        model.tie_weights()
    set_model_state_dict(model, whole, options=_FROM_LEADER)
    del whole  # the leader's whole decoder layers, now that each process holds its shard
    release_freed_memory()
    _broadcast_buffers(model)
    gather_once(model)
    return with_tokenizer(resolved, model, device)


def _built_on_meta(resolved: ResolvedModel, dtype: torch.dtype) -> PreTrainedModel:
    """The model's modules from its config, on the meta device: shapes without storage, nothing read but the config
    and the generation config (its stop tokens, which `from_pretrained` would read too)."""
    config = AutoConfig.from_pretrained(resolved.folder, local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with contextlib.suppress(OSError):  # a folder without one keeps the defaults from the config, as from_pretrained
        model.generation_config = GenerationConfig.from_pretrained(resolved.folder, local_files_only=True)
    return model


def _broadcast_buffers(model: PreTrainedModel) -> None:
    """Every buffer the leader's: those left out of the state dict (rotary frequencies, Gemma's embedding scale) are
    uninitialised memory on a follower after `to_empty`."""
    for buffer in model.buffers():
        dist.broadcast(buffer, src=0)
