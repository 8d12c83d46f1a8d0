"""`python -m trainer_backend serve --shards 2`: the tiny model's decoder layers over two CPU processes, through the
real server and the tinker SDK; what it computes is what one process computes, and a follower that dies takes the
server down with the reason. The engine's parity call by call is `test_sharded_engine.py`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import tinker
import torch
from support.backends import TINY, start_backend_process, tiny_server_config
from support.trainer import datum_for
from tinker import types

from autoresearch.trials.backend import free_port
from trainer_backend.errors import UnknownBaseModelError, UserInputError
from trainer_backend.models.loading import load_base_model
from trainer_backend.models.registry import ResolvedModel, resolve_base_model
from trainer_backend.samplers.routing import vllm_settings
from trainer_backend.samplers.vllm_process import VllmProcess, VllmSettings
from trainer_backend.sharding.group import SHARD_LOST_EXIT, ShardPlace
from trainer_backend.sharding.leader import check_shards

SQL = "SELECT name FROM singer WHERE age > 30"


def train_and_sample(url: str) -> tuple[list[float], list[list[int]]]:
    """Three steps of one adapter, then completions of its weights: the losses and the sampled tokens."""
    with tinker.ServiceClient(base_url=url, api_key="tml-tests") as client:
        training = client.create_lora_training_client(base_model=TINY, rank=4, seed=0).result()
        datum = datum_for(training.get_tokenizer(), SQL)
        losses = []
        for _ in range(3):
            losses.append(training.forward_backward([datum], "cross_entropy").result().metrics["loss:sum"])
            training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        sampler = training.save_weights_and_get_sampling_client().result()
        params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=3)
        prompt = types.ModelInput.from_ints(training.get_tokenizer().encode("SELECT"))
        sampled = sampler.sample(prompt, num_samples=2, sampling_params=params).result()
        return losses, [list(sequence.tokens) for sequence in sampled.sequences]


def structured_output(url: str) -> list[str]:
    """Completions in JSON-schema mode of two requests sent at once (so that they share a generation), seeded: their
    texts."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    body = {
        "model": TINY, "prompt": "SELECT", "max_tokens": 12, "seed": 5, "n": 2,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
    }  # fmt: skip
    reply = httpx.post(f"{url}/v1/completions", json=body, headers={"Authorization": "Bearer tml-tests"}, timeout=60)
    reply.raise_for_status()
    return [choice["text"] for choice in reply.json()["choices"]]


def stop(server: subprocess.Popen) -> None:
    server.send_signal(signal.SIGTERM)
    server.wait(timeout=60)


def test_a_server_of_two_shards_trains_and_samples_as_one_process_does(tmp_path: Path) -> None:
    results, structured = [], []
    for name, options in (("one", ()), ("two", ("--shards", "2"))):
        port = free_port()
        server = start_backend_process(tmp_path / name, port, "--dtype", "float32", *options)
        try:
            results.append(train_and_sample(f"http://127.0.0.1:{port}"))
            structured.append(structured_output(f"http://127.0.0.1:{port}"))
        finally:
            stop(server)
        # SIGTERM's orderly stop, the followers stopped with it (a lost follower would end it with SHARD_LOST_EXIT).
        assert server.returncode == 128 + signal.SIGTERM, (tmp_path / name / "server.log").read_text()[-3000:]
    (one_losses, one_tokens), (two_losses, two_tokens) = results
    assert two_losses == pytest.approx(one_losses, abs=1e-5)
    assert one_losses[-1] < one_losses[0]
    assert two_tokens == one_tokens
    # Structured output: each follower makes the leader's constraint again, so the same texts come out.
    assert structured[1] == structured[0] and all(text.startswith('{"n":') for text in structured[0]), structured
    assert "2 processes on cpu, the decoder layers sharded" in (tmp_path / "two" / "server.log").read_text()


def test_a_follower_that_dies_takes_the_server_down_with_the_reason(tmp_path: Path) -> None:
    port = free_port()
    server = start_backend_process(tmp_path, port, "--shards", "2")
    follower = next(
        int(pid)
        for pid in Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()
        if "trainer_backend.sharding.follower" in Path(f"/proc/{pid}/cmdline").read_text()
    )
    os.kill(follower, signal.SIGKILL)
    try:
        assert server.wait(timeout=30) == SHARD_LOST_EXIT
    finally:
        if server.poll() is None:
            server.kill()
    assert "shard process 1" in (tmp_path / "server.log").read_text()


def test_a_group_this_machine_cannot_hold_is_refused_before_anything_starts(tmp_path: Path) -> None:
    model = ResolvedModel(TINY, Path("unused"))
    too_many = ShardPlace(0, (os.cpu_count() or 1) + 1)
    with pytest.raises(UserInputError, match="more processes than the"):
        check_shards(too_many, torch.device("cpu"), model)
    with pytest.raises(UserInputError, match="not on mps"):
        check_shards(ShardPlace(0, 2), torch.device("mps"), model)
    with pytest.raises(UserInputError, match="name no GPU"):
        check_shards(ShardPlace(0, 2), torch.device("cuda", 1), model)
    with pytest.raises(UserInputError, match="tensor parallelism"):
        check_shards(ShardPlace(0, 2), torch.device("cpu"), model, sampler="vllm")


def test_vllm_beside_a_sharded_backend_is_split_over_its_gpus(tmp_path: Path) -> None:
    config = tiny_server_config(tmp_path, shards=2, sampler="vllm", vllm_python=sys.executable)
    loaded = load_base_model(resolve_base_model(TINY, tmp_path / "models"), torch.device("cpu"))
    process = VllmProcess(vllm_settings(config, loaded))
    command = process.command()
    assert command[command.index("--tensor-parallel-size") + 1] == "2"


def test_vllm_started_by_a_leader_under_torchrun_is_no_process_of_its_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in ShardPlace(0, 2).environment_of(0).items():
        monkeypatch.setenv(name, value)
    environment = VllmProcess(VllmSettings(tmp_path, TINY, python=Path(sys.executable))).environment()
    assert not {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"} & environment.keys()
    assert environment["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"


def test_a_model_whose_layers_cannot_be_split_is_refused_with_the_reason(tmp_path: Path) -> None:
    # A causal LM that keeps no list of decoder layers at model.layers (GPT-2 holds them at transformer.h).
    from transformers import GPT2Config

    folder = tmp_path / "gpt2"
    GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=32).save_pretrained(folder)
    with pytest.raises(UnknownBaseModelError, match="no list of decoder layers"):
        check_shards(ShardPlace(0, 2), torch.device("cpu"), ResolvedModel("gpt2", folder))
