"""The base model's decoder layers sharded across the group's processes with FSDP2 (`fully_shard`).

Each process keeps 1/N of every decoder layer's weights and gathers a layer's whole weights only while that layer
runs. The embeddings, the final norm and the output head stay whole on every process: the engine reads the output
head's weight outside any forward (its chunked log-probs), and for the models served here they are a small share of
the weights (Qwen2.5-Coder-7B: 0.5 of 7.6 billion parameters). LoRA adapters come after the sharding, so their
weights and optimizer state are whole on every process and every process steps them alike.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from transformers import PreTrainedModel

from trainer_backend.engine.host_memory import release_freed_memory
from trainer_backend.errors import UnknownBaseModelError


def decoder_layers(model: PreTrainedModel) -> nn.ModuleList:
    """The model's list of decoder layers (`model.model.layers`, as Hugging Face's decoder-only models hold them).

    Raises:
        UnknownBaseModelError: the model holds no such list, so it cannot be sharded layer by layer.
    """
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise UnknownBaseModelError(
            f"{type(model).__name__} keeps no list of decoder layers at model.layers; a sharded backend splits the "
            "base model layer by layer and serves only models built that way"
        )
    return layers


def shard_decoder_layers(model: PreTrainedModel, mesh: DeviceMesh) -> int:
    """Shard every decoder layer of `model` over `mesh`, in place; how many layers were sharded.

    A model on the meta device stays there (its shards are made by `model.to_empty`); a real one keeps its shard of
    each weight, moved to the mesh's device.
    """
    layers = decoder_layers(model)
    for layer in layers:
        # Each layer is a root of its own (the embeddings around them are not sharded), and FSDP2 would keep a root's
        # weights whole after its forward unless told otherwise.
        fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    return len(layers)


def gather_once(model: PreTrainedModel) -> None:
    """Gather every sharded layer's whole weights once and free them, with the shards' final values in place.

    FSDP2 makes a layer's whole weights at its first gather and reuses them: made under the inference mode of a
    generation they could never take part in a backward, so they are made here, outside it.
    """
    for layer in decoder_layers(model):
        layer.unshard()
        layer.reshard()
        # glibc kept each layer's freed gather apart from the next one's: without handing them back, a follower of
        # 16 layers peaked at 1.7 times its shard (tests/trainer_backend/test_sharded_loading.py's model).
        release_freed_memory()


def resident_weight_bytes(model: nn.Module) -> int:
    """The bytes of `model`'s parameters this process holds: its shard of a sharded one, the whole of the others."""
    return sum((p.to_local() if isinstance(p, DTensor) else p).nbytes for p in model.parameters())
