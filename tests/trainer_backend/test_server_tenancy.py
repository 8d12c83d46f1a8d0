"""One API key never reaches another's models, checkpoints, sampling sessions or futures, and ids cannot be guessed.

Key A trains a model, saves a training and a sampler checkpoint, opens a sampling session and submits a future; key B
then tries every way in. The session server runs in open mode (any `tml-` key, each its own owner); a second server
started with `api_keys` refuses unknown and missing keys.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import tinker
from support.backends import TINY, tiny_server_config
from support.trained_adapters import trained_adapter
from support.trainer import SQL, RawApi, error_of, next_token_datum, request_id_of
from tinker import types

from trainer_backend.server import RunningServer, running_server

KEY_A = "tml-tenant-a"
KEY_B = "tml-tenant-b"


@dataclass(frozen=True)
class OwnedByA:
    session_id: str
    model_id: str
    training_path: str
    sampler_path: str
    sampling_session_id: str
    request_id: str
    datum: types.Datum
    training: tinker.TrainingClient


@pytest.fixture(scope="module")
def client_a(server: RunningServer) -> Iterator[tinker.ServiceClient]:
    with tinker.ServiceClient(base_url=server.url, api_key=KEY_A) as client:
        yield client


@pytest.fixture(scope="module")
def client_b(server: RunningServer) -> Iterator[tinker.ServiceClient]:
    with tinker.ServiceClient(base_url=server.url, api_key=KEY_B) as client:
        yield client


@pytest.fixture(scope="module")
def api_b(server: RunningServer) -> RawApi:
    return RawApi(server.url, KEY_B)


@pytest.fixture(scope="module")
def a(server: RunningServer, client_a: tinker.ServiceClient) -> OwnedByA:
    training = trained_adapter(client_a, SQL, seed=0, steps=1, learning_rate=1e-2)
    ids = training.get_tokenizer().encode(SQL)
    datum = next_token_datum(ids)
    training_path = training.save_state("private").result().path
    sampler_path = training.save_weights_for_sampler("private-sampler").result().path
    api_a = RawApi(server.url, KEY_A)
    session_id = training.model_id.split(":")[0]
    sampling = {"session_id": session_id, "sampling_session_seq_id": 100, "model_path": sampler_path}
    sampling_session_id = api_a.post("/create_sampling_session", sampling).json()["sampling_session_id"]
    request_id = request_id_of(api_a.post("/asample", sample_request(ids, sampling_session_id=sampling_session_id)))
    assert api_a.result(request_id).status_code == 200
    return OwnedByA(
        session_id, training.model_id, training_path, sampler_path, sampling_session_id, request_id, datum, training
    )


def sample_request(ids: list[int], **target: str) -> types.SampleRequest:
    return types.SampleRequest(
        seq_id=0,
        num_samples=1,
        prompt=types.ModelInput.from_ints(ids[:4]),
        sampling_params=types.SamplingParams(max_tokens=2, temperature=0.0),
        **target,
    )


def test_another_key_cannot_read_or_drive_a_model(a: OwnedByA, api_b: RawApi) -> None:
    assert a.model_id in error_of(api_b.post("/get_info", {"model_id": a.model_id}), 404)
    assert a.model_id in error_of(api_b.forward_backward(a.model_id, 5, [a.datum], forward_only=True), 404)
    assert a.model_id in error_of(api_b.optim_step(a.model_id, 5, 1.0), 404)
    save = {"model_id": a.model_id, "seq_id": 5, "path": "stolen"}
    assert a.model_id in error_of(api_b.post("/save_weights", save), 404)
    create = {"session_id": a.session_id, "model_seq_id": 7, "base_model": TINY}
    assert a.session_id in error_of(api_b.post("/create_model", create), 404)
    assert a.model_id in error_of(api_b.http.get(f"/training_runs/{a.model_id}"), 404)
    assert error_of(api_b.post("/weights_info", {"tinker_path": a.training_path}), 404)
    assert a.session_id in error_of(api_b.post("/session_heartbeat", {"session_id": a.session_id}), 404)
    finish = {"reason": {"type": "success"}}
    assert a.session_id in error_of(api_b.post(f"/sessions/{a.session_id}/finish", finish), 404)


def test_another_keys_refused_requests_do_not_move_a_models_order(a: OwnedByA, api_b: RawApi) -> None:
    """A refusal releases its seq_id so the client goes on; a refusal for someone else's model must release nothing."""
    for seq_id in range(1, 40):
        assert error_of(api_b.forward_backward(a.model_id, seq_id, [a.datum], forward_only=True), 404)
        assert error_of(api_b.optim_step(a.model_id, seq_id, -1.0), 404)
    output = a.training.forward([a.datum], "cross_entropy").result(timeout=20)
    assert len(output.loss_fn_outputs[0]["logprobs"].tolist()) == len(a.datum.model_input.to_ints())


def test_another_key_cannot_sample_a_models_weights(a: OwnedByA, client_b: tinker.ServiceClient, api_b: RawApi) -> None:
    with pytest.raises(tinker.NotFoundError, match="not found"):
        client_b.create_sampling_client(model_path=a.sampler_path).result()
    ids = a.datum.model_input.to_ints()
    by_session = api_b.post("/asample", sample_request(ids, sampling_session_id=a.sampling_session_id))
    assert a.sampling_session_id in error_of(by_session, 404)
    assert a.sampler_path in error_of(api_b.post("/asample", sample_request(ids, model_path=a.sampler_path)), 404)
    assert a.sampling_session_id in error_of(api_b.http.get(f"/samplers/{a.sampling_session_id}"), 404)


def test_another_key_cannot_load_a_checkpoint(a: OwnedByA, client_b: tinker.ServiceClient) -> None:
    with pytest.raises(tinker.NotFoundError, match="not found"):
        client_b.create_training_client_from_state(a.training_path).result()
    with pytest.raises(tinker.NotFoundError, match="not found"):
        client_b.create_training_client_from_state_with_optimizer(a.training_path).result()


def test_another_keys_runs_and_checkpoints_are_not_listed(a: OwnedByA, server: RunningServer) -> None:
    rest_a = tinker.RestClient(base_url=server.url, api_key=KEY_A)
    rest_b = tinker.RestClient(base_url=server.url, api_key=KEY_B)
    assert a.model_id in [r.training_run_id for r in rest_a.list_training_runs().result().training_runs]
    assert a.training_path in [c.tinker_path for c in rest_a.list_user_checkpoints().result().checkpoints]

    assert a.model_id not in [r.training_run_id for r in rest_b.list_training_runs().result().training_runs]
    paths_b = [c.tinker_path for c in rest_b.list_user_checkpoints().result().checkpoints]
    assert a.training_path not in paths_b and a.sampler_path not in paths_b
    with pytest.raises(tinker.NotFoundError):
        rest_b.list_checkpoints(a.model_id).result()


def test_another_key_cannot_delete_a_checkpoint(a: OwnedByA, server: RunningServer) -> None:
    rest_b = tinker.RestClient(base_url=server.url, api_key=KEY_B)
    with pytest.raises(tinker.NotFoundError):
        rest_b.delete_checkpoint(a.model_id, "weights/private").result()
    with pytest.raises(tinker.NotFoundError):
        rest_b.delete_checkpoint_from_tinker_path(a.sampler_path).result()
    rest_a = tinker.RestClient(base_url=server.url, api_key=KEY_A)
    kept = {c.tinker_path for c in rest_a.list_checkpoints(a.model_id).result().checkpoints}
    assert {a.training_path, a.sampler_path} <= kept


def test_another_key_cannot_retrieve_a_future(a: OwnedByA, server: RunningServer, api_b: RawApi) -> None:
    assert a.request_id in error_of(api_b.post("/retrieve_future", {"request_id": a.request_id}), 404)
    assert RawApi(server.url, KEY_A).result(a.request_id).status_code == 200


def test_ids_carry_at_least_64_random_bits(a: OwnedByA) -> None:
    def random_bits(identifier: str) -> int:
        match = re.fullmatch(r"[a-z]+-([0-9a-f]+)", identifier)
        assert match, identifier
        return 4 * len(match.group(1))

    assert re.fullmatch(rf"{re.escape(a.session_id)}:train:\d+", a.model_id)
    for identifier in (a.session_id, a.sampling_session_id, a.request_id):
        assert random_bits(identifier) >= 64
    # Checkpoint paths are reached through the model id, so they are as hard to guess.
    assert a.training_path.startswith(f"tinker://{a.model_id}/")


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root: Path = tmp_path_factory.mktemp("keyed")
    with running_server(tiny_server_config(root, api_keys=[KEY_A, KEY_B])) as running:
        yield running


@pytest.mark.parametrize(("key", "problem"), [("tml-unknown", "unknown API key"), (None, "missing API key")])
def test_a_server_with_keys_refuses_unknown_and_missing_keys(
    keyed_server: RunningServer, key: str | None, problem: str
) -> None:
    api = RawApi(keyed_server.url, key)
    assert problem in error_of(api.post("/create_session", {"sdk_version": tinker.__version__}), 401)
    assert problem in error_of(api.http.get("/training_runs"), 401)
    assert problem in error_of(api.post("/retrieve_future", {"request_id": "req-0"}), 401)
    assert httpx.get(f"{keyed_server.url}/healthz").status_code == 200
    # A known key is served, and its things stay its own.
    with tinker.ServiceClient(base_url=keyed_server.url, api_key=KEY_A) as client:
        model_id = client.create_lora_training_client(base_model=TINY, rank=4).result().model_id
    assert model_id in error_of(RawApi(keyed_server.url, KEY_B).post("/get_info", {"model_id": model_id}), 404)


def test_the_sdk_with_an_unknown_key_is_refused(keyed_server: RunningServer) -> None:
    client = tinker.ServiceClient(base_url=keyed_server.url, api_key="tml-unknown")
    with pytest.raises(tinker.AuthenticationError, match="unknown API key"):
        client.create_lora_training_client(base_model=TINY, rank=4).result(timeout=20)
    with pytest.raises(tinker.AuthenticationError, match="unknown API key"):
        tinker.RestClient(base_url=keyed_server.url, api_key="tml-unknown").list_training_runs().result(timeout=20)
