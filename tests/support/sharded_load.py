"""One process of a group loading a base model over its shards (`trainer_backend/sharding/weights.py`), with what
the tests check saved: its peak resident memory while it loads (above what it held before), the bytes of the decoder
layers it holds, whether its embeddings are tied, its stop tokens, and the logits of a fixed input.

Run: RANK=… WORLD_SIZE=… MASTER_ADDR=… MASTER_PORT=… python tests/support/sharded_load.py MODEL_FOLDER OUT_FILE
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import torch

from trainer_backend.models.registry import ResolvedModel
from trainer_backend.sharding.group import ShardGroup, ShardPlace
from trainer_backend.sharding.shard_model import decoder_layers, resident_weight_bytes
from trainer_backend.sharding.weights import load_sharded_model

TOKENS = (5, 9, 14, 3, 22, 7, 30, 11)


def _status_kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1))


def main(folder: Path, out: Path) -> None:
    place = ShardPlace.from_environment()
    assert place is not None, "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are needed"
    cpu = torch.device("cpu")
    group = ShardGroup(place, cpu)
    before = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from what is resident now
    loaded = load_sharded_model(ResolvedModel(folder.name, folder), cpu, torch.float32, place, group.mesh)
    peak = _status_kib("VmHWM")
    model = loaded.model
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([TOKENS])).logits
    torch.save(
        {
            "load_growth_bytes": (peak - before) * 1024,
            "layer_bytes": resident_weight_bytes(decoder_layers(model)),
            "tied": model.get_output_embeddings().weight is model.get_input_embeddings().weight,
            "eos_token_ids": loaded.eos_token_ids,
            "logits": logits,
        },
        out,
    )
    group.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
