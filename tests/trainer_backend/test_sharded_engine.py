"""A sharded backend's engine (`trainer_backend/sharding/`): two CPU processes over gloo, each holding half of the
decoder layers' weights and computing its share of each forward_backward's datums, compute what one process computes.

A scripted series of engine calls (`support/sharded_run.py`: adapters made from the global generator, a
forward_backward of two adapters with every loss, a forward-only call and a refused call, one of a prompt's
completions trained on their own tokens alone, optimizer steps, saves, a generation that pauses for another adapter's
training step of a single datum and takes in a request under a JSON constraint, unseeded requests, prompt scoring, a
load) runs once on a plain engine and once led by a process whose follower it starts; both save what they computed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from trainer_backend.errors import UnknownBaseModelError
from trainer_backend.models.tiny import build_tiny_model
from trainer_backend.sharding.shard_model import shard_decoder_layers

SCRIPT = Path(__file__).parents[1] / "support" / "sharded_run.py"
# fp32 on one machine: the gathered weights are the same bits, so only the order of sums may differ.
FP32_TOLERANCE = 1e-5


def run_script(folder: Path, shards: int, out: Path) -> dict:
    out.mkdir()
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(folder), str(shards), str(out)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return torch.load(out / "results.pt", weights_only=False)


@pytest.fixture(scope="module", params=["tiny-qwen2", "tiny-gemma3"])
def both_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    root = tmp_path_factory.mktemp(request.param)
    folder = build_tiny_model(root / "model", architecture=request.param)
    return run_script(folder, 1, root / "one"), run_script(folder, 2, root / "two")


def test_two_processes_compute_what_one_does(both_runs: tuple[dict, dict]) -> None:
    one, two = both_runs
    assert two["refused"] == one["refused"] == "UserInputError"
    for mine, theirs in zip(two["fb_logprobs"], one["fb_logprobs"], strict=True):
        torch.testing.assert_close(mine, theirs, atol=FP32_TOLERANCE, rtol=0)
    # A call's loss is the sum of its shares' sums: rounded in another order, by fp32's relative precision.
    assert two["fb_loss"] == pytest.approx(one["fb_loss"], rel=FP32_TOLERANCE)
    for saved in ("saved_a", "saved_b"):
        assert two[saved].keys() == one[saved].keys()
        for name, weight in one[saved].items():
            torch.testing.assert_close(two[saved][name], weight, atol=FP32_TOLERANCE, rtol=0)
    assert two["taken_in"] == one["taken_in"] == 1
    assert two["sampled"] == one["sampled"]
    # The request taken in was under a JSON constraint, made again on the follower.
    assert all(text.startswith("{") for text in one["constrained_texts"]), one["constrained_texts"]
    for mine, theirs in zip(two["sampled_logprobs"], one["sampled_logprobs"], strict=True):
        for a, b in zip(mine, theirs, strict=True):
            assert a == pytest.approx(b, abs=FP32_TOLERANCE)
    assert two["unseeded_sampled"] and one["unseeded_sampled"]
    for mine, theirs in zip(two["prompt_logprobs"], one["prompt_logprobs"], strict=True):
        assert mine == pytest.approx(theirs, abs=FP32_TOLERANCE)
    torch.testing.assert_close(two["loaded_logprobs"], one["loaded_logprobs"], atol=FP32_TOLERANCE, rtol=0)


def test_each_process_holds_half_of_the_decoder_layers(both_runs: tuple[dict, dict]) -> None:
    one, two = both_runs
    assert 0.45 <= two["layer_bytes"] / one["layer_bytes"] <= 0.55
    assert two["resharded_after"]


def test_a_model_without_a_list_of_decoder_layers_is_refused_with_the_reason() -> None:
    with pytest.raises(UnknownBaseModelError, match="no list of decoder layers"):
        shard_decoder_layers(nn.Linear(4, 4), mesh=None)
