"""A sharded backend reads its base model from disk once (`trainer_backend/sharding/weights.py`): the leader loads
it, a follower builds it on the meta device and receives its shard of every decoder layer, and the parts kept whole,
from the leader. Two CPU processes over gloo (`support/sharded_load.py`); the follower's folder holds no weights at
all, so whatever it computes came from the leader.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import Qwen2ForCausalLM

from trainer_backend.models.loading import load_base_model
from trainer_backend.models.registry import ResolvedModel
from trainer_backend.models.tiny import build_tiny_model, tiny_qwen2_config, train_tiny_chatml_tokenizer
from trainer_backend.sharding.group import ShardPlace, free_port
from trainer_backend.sharding.shard_model import decoder_layers, resident_weight_bytes

SCRIPT = Path(__file__).parents[1] / "support" / "sharded_load.py"
TOKENS = (5, 9, 14, 3, 22, 7, 30, 11)
FP32_TOLERANCE = 1e-5


def without_weights(folder: Path, into: Path) -> Path:
    """A copy of the model folder with its config, generation config and tokenizer, and no weights file."""
    into.mkdir()
    for path in folder.iterdir():
        if path.suffix != ".safetensors":
            shutil.copy(path, into / path.name)
    return into


def load_in_group(leader_folder: Path, follower_folder: Path, out: Path) -> tuple[dict, dict]:
    """What the leader (from `leader_folder`) and its follower (from `follower_folder`) hold after loading."""
    place = ShardPlace(0, 2, port=free_port())
    processes = []
    for rank, folder in enumerate((leader_folder, follower_folder)):
        environment = {**os.environ, **place.environment_of(rank)}
        command = [sys.executable, str(SCRIPT), str(folder), str(out / f"rank{rank}.pt")]
        processes.append(subprocess.Popen(command, env=environment, stderr=subprocess.PIPE, text=True))
    for process in processes:
        _, errors = process.communicate(timeout=600)
        assert process.returncode == 0, errors[-4000:]
    return tuple(torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in range(2))


@pytest.mark.parametrize("architecture", ["tiny-qwen2", "tiny-gemma3"])
def test_a_follower_without_the_weights_computes_what_one_process_does(architecture: str, tmp_path: Path) -> None:
    folder = build_tiny_model(tmp_path / "model", architecture=architecture)
    leader, follower = load_in_group(folder, without_weights(folder, tmp_path / "no-weights"), tmp_path)
    one = load_base_model(ResolvedModel(architecture, folder), torch.device("cpu"), torch.float32)
    with torch.no_grad():
        expected = one.model(input_ids=torch.tensor([TOKENS])).logits
    for shard in (leader, follower):
        torch.testing.assert_close(shard["logits"], expected, atol=FP32_TOLERANCE, rtol=0)
    # Gemma's unembedding is its embedding: one tensor on the follower too.
    tied = one.model.get_output_embeddings().weight is one.model.get_input_embeddings().weight
    assert follower["tied"] == leader["tied"] == tied
    assert follower["eos_token_ids"] == leader["eos_token_ids"] == one.eos_token_ids


def test_a_follower_never_holds_the_whole_decoder(tmp_path: Path) -> None:
    # 16 layers of 20 MiB each: the shard and a layer's gather stand out from the process's own noise.
    tokenizer = train_tiny_chatml_tokenizer()
    config = tiny_qwen2_config(len(tokenizer), width=768, num_hidden_layers=16, pad_token_id=tokenizer.pad_token_id)
    folder = tmp_path / "model"
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    whole = resident_weight_bytes(decoder_layers(Qwen2ForCausalLM(config)))
    _, follower = load_in_group(folder, without_weights(folder, tmp_path / "no-weights"), tmp_path)
    assert follower["layer_bytes"] == pytest.approx(whole / 2, rel=0.01)
    # Its half, a layer's gather (`gather_once`) and a tensor in flight: 0.8 of the whole when measured; a follower
    # that loaded the model and then sharded it grew by 2.5 times the whole.
    assert follower["load_growth_bytes"] < whole
