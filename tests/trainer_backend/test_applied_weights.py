"""The built-in engine serves sampler weights only once each load is shown to apply the weights saved
(trainer_backend/engine/weights_proof.py): the hash of the adapter in memory against the save's, and a probe that
the adapter moves as it did when saved. A load broken on purpose, at the narrowest point that breaks it, is refused
by name (the SDK's future fails, OpenAI's route answers 500 with the reason), counted in /metrics and logged; once
the fault is gone the same weights are served. The same faults on vLLM: test_vllm_sampler.py.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import tinker
from safetensors.torch import load_file
from support.backends import TINY
from support.trainer import SQL
from support.weight_checks import checked, refused, train_steps
from tinker import types

from trainer_backend.checkpoints import CheckpointPath
from trainer_backend.engine import adapters, residency, sampling
from trainer_backend.engine.weights_proof import ADAPTER_WEIGHTS_FILE, PROOF_FILE
from trainer_backend.server import RunningServer

KEY = "tml-applied-weights"
GREEDY = types.SamplingParams(max_tokens=6, temperature=0.0)
OTHER_SQL = "SELECT COUNT(*) FROM orders WHERE total > 10;"


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[tinker.ServiceClient]:
    with tinker.ServiceClient(base_url=server.url, api_key=KEY) as service_client:
        yield service_client


def trained(client: tinker.ServiceClient, seed: int) -> tinker.TrainingClient:
    training = client.create_lora_training_client(base_model=TINY, rank=4, seed=seed, train_unembed=False).result()
    train_steps(training, SQL, steps=2)
    return training


def sample(client: tinker.ServiceClient, path: str) -> types.SampleResponse:
    tokenizer = client.create_lora_training_client(base_model=TINY, rank=1).result().get_tokenizer()
    prompt = types.ModelInput.from_ints(tokenizer.encode(SQL)[:6])
    return client.create_sampling_client(model_path=path).result().sample(prompt, 1, GREEDY).result(timeout=60)


def folder_of(server: RunningServer, path: str) -> Path:
    return server.service.checkpoints.folder(CheckpointPath.parse(path))


def assert_refused(client: tinker.ServiceClient, path: str, message: str) -> None:
    """A sample of the weights at `path` fails with `message`, never a trace."""
    with pytest.raises(tinker.RequestFailedError, match=message) as refusal:
        sample(client, path)
    assert "Traceback" not in str(refusal.value)


def test_a_normal_load_passes_and_is_counted(server: RunningServer, client: tinker.ServiceClient) -> None:
    before = checked(server, "builtin")
    path = trained(client, seed=1).save_weights_for_sampler("normal").result().path
    proof = (folder_of(server, path) / PROOF_FILE).read_text()
    assert '"zero":false' in proof
    assert sample(client, path).sequences[0].tokens
    assert checked(server, "builtin") == before + 1
    sample(client, path)  # held: no second load, no second check
    assert checked(server, "builtin") == before + 1


def test_a_fresh_adapter_is_exempt_from_the_probe_and_answers_as_the_base_model(
    server: RunningServer, client: tinker.ServiceClient
) -> None:
    fresh = client.create_lora_training_client(base_model=TINY, rank=4, seed=2, train_unembed=False).result()
    path = fresh.save_weights_for_sampler("fresh").result().path
    assert '"zero":true' in (folder_of(server, path) / PROOF_FILE).read_text()
    tokenizer = fresh.get_tokenizer()
    prompt = types.ModelInput.from_ints(tokenizer.encode(SQL)[:6])
    base = client.create_sampling_client(base_model=TINY).result().sample(prompt, 1, GREEDY).result(timeout=60)
    assert sample(client, path).sequences[0].tokens == base.sequences[0].tokens


def test_weights_saved_before_proofs_existed_are_served_and_their_load_still_checked(
    server: RunningServer, client: tinker.ServiceClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint of an earlier server has no proof: its load must still apply exactly the file it read and move
    the probe (nothing saved is lost), and a load that leaves the tensors out is refused all the same."""
    path = trained(client, seed=9).save_weights_for_sampler("before-proofs").result().path
    (folder_of(server, path) / PROOF_FILE).unlink()
    before = checked(server, "builtin")
    assert sample(client, path).sequences[0].tokens
    assert checked(server, "builtin") == before + 1
    other = trained(client, seed=10).save_weights_for_sampler("before-proofs-too").result().path
    (folder_of(server, other) / PROOF_FILE).unlink()
    monkeypatch.setattr(adapters, "set_peft_model_state_dict", lambda *_, **__: SimpleNamespace(unexpected_keys=[]))
    assert_refused(client, other, "are not the ones saved")


def test_weights_trained_too_little_to_show_on_the_probe_are_refused_as_such(
    server: RunningServer, client: tinker.ServiceClient
) -> None:
    """One step at a learning rate of 1e-9 moves the probe by about 1e-6 nats, under what a load must show: no load
    of them could be told from a load that applied nothing, and the refusal says so."""
    training = client.create_lora_training_client(base_model=TINY, rank=4, seed=8, train_unembed=False).result()
    train_steps(training, SQL, steps=1, learning_rate=1e-9)
    path = training.save_weights_for_sampler("too-weak").result().path
    before = refused(server, "builtin", "too_weak")
    assert_refused(client, path, "change the model too little to be shown applied")
    assert refused(server, "builtin", "too_weak") == before + 1


def test_weights_left_out_of_the_load_are_refused_counted_and_logged(
    server: RunningServer,
    client: tinker.ServiceClient,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = trained(client, seed=3).save_weights_for_sampler("left-out").result().path
    before = refused(server, "builtin", "hash_mismatch")
    # The fault: the saved tensors never reach the adapter, which keeps PEFT's fresh initialisation.
    monkeypatch.setattr(adapters, "set_peft_model_state_dict", lambda *_, **__: SimpleNamespace(unexpected_keys=[]))
    with caplog.at_level(logging.ERROR, logger="trainer_backend.engine.weights_proof"):
        assert_refused(client, path, "are not the ones saved")
    assert refused(server, "builtin", "hash_mismatch") == before + 1
    assert any("refused to serve sampler weights (hash_mismatch)" in r.getMessage() for r in caplog.records)
    # OpenAI's route: a server error, 500, that names the problem, never a trace.
    reply = httpx.post(
        f"{server.url}/v1/completions",
        json={"model": path, "prompt": SQL, "max_tokens": 2},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=60,
    )
    assert reply.status_code == 500, reply.text
    assert "are not the ones saved" in reply.json()["error"]["message"] and "Traceback" not in reply.text
    monkeypatch.undo()
    assert sample(client, path).sequences[0].tokens  # refused weights are unloaded: the next request loads them again


def test_an_adapter_left_out_of_the_forward_is_refused(
    server: RunningServer, client: tinker.ServiceClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = trained(client, seed=4).save_weights_for_sampler("not-applied").result().path
    before = refused(server, "builtin", "no_effect")
    # The fault: the weights load exactly, but a generation batch runs every row through the base model.
    monkeypatch.setattr(sampling, "_adapter_scope", lambda model, _: model.disable_adapter())
    assert_refused(client, path, "change nothing")
    assert refused(server, "builtin", "no_effect") == before + 1


def test_the_previous_version_applied_is_refused(
    server: RunningServer, client: tinker.ServiceClient, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    training = trained(client, seed=5)
    path = training.save_weights_for_sampler("versions").result().path
    sample(client, path)
    previous = shutil.copy(folder_of(server, path) / ADAPTER_WEIGHTS_FILE, tmp_path / "previous.safetensors")
    train_steps(training, OTHER_SQL, steps=2)
    assert training.save_weights_for_sampler("versions").result().path == path
    before = refused(server, "builtin", "hash_mismatch")
    # The fault: loading the folder reads the previous version's file (a cache of files by path).
    monkeypatch.setattr(adapters, "load_file", lambda _, device: load_file(previous, device=device))
    assert_refused(client, path, "are not the ones saved")
    assert refused(server, "builtin", "hash_mismatch") == before + 1


def test_an_adapter_cache_that_returns_the_old_weights_is_refused(
    server: RunningServer, client: tinker.ServiceClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Adapters are cached by a name of the weights' content, so weights saved again get a new name; the fault,
    injected at that name, makes it the same for every version, as a cache keyed by path would."""
    monkeypatch.setattr(residency, "sampler_adapter_name", lambda folder, _: f"sampler-{folder.name}")
    training = trained(client, seed=6)
    path = training.save_weights_for_sampler("cached").result().path
    sample(client, path)
    train_steps(training, OTHER_SQL, steps=2)
    training.save_weights_for_sampler("cached").result()
    before = refused(server, "builtin", "stale_cache")
    assert_refused(client, path, "is stale")
    assert refused(server, "builtin", "stale_cache") == before + 1
    assert sample(client, path).sequences[0].tokens  # the stale adapter was unloaded: the new weights load


def test_weights_saved_again_within_one_timestamp_tick_are_not_served_from_the_cache(
    server: RunningServer, client: tinker.ServiceClient
) -> None:
    """A file system with coarse timestamps (a network volume) can give two saves one modification time: the
    weights' content, not their file's time, names their adapter, so the second save is loaded, not the cached
    first."""
    training = trained(client, seed=7)
    path = training.save_weights_for_sampler("tick").result().path
    weights = folder_of(server, path) / ADAPTER_WEIGHTS_FILE
    first_time = weights.stat()
    first = sample(client, path)
    train_steps(training, OTHER_SQL, steps=3)
    training.save_weights_for_sampler("tick").result()
    os.utime(weights, ns=(first_time.st_atime_ns, first_time.st_mtime_ns))
    reference = sample(client, training.save_weights_for_sampler("tick-reference").result().path)
    again = sample(client, path)
    assert again.sequences[0].tokens == reference.sequences[0].tokens != first.sequences[0].tokens
