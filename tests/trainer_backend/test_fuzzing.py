"""Fuzzing the request decoders and the HTTP routes: whatever the bytes, a 4xx with the server's JSON error shape
or a valid request, never a 5xx, a hang or another exception, and the server still serves afterwards.

Hypothesis generates the inputs: raw bytes and structured protobuf messages for the forward_backward codec, JSON of
every shape for the routes' bodies. Sized to run in well under a minute.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.backends import tiny_server_config
from tinker.proto import tinker_public_pb2 as pb

from trainer_backend.server import RunningServer, running_server
from trainer_backend.wire.proto import PROTOBUF_CONTENT_TYPE, WireFormatError, decode_forward_backward_request

KEY = "tml-fuzzing-tests"
ROUTES = (
    "create_session",
    "session_heartbeat",
    "create_model",
    "get_info",
    "optim_step",
    "save_weights",
    "save_weights_for_sampler",
    "load_weights",
    "create_sampling_session",
    "asample",
    "retrieve_future",
    "weights_info",
    "client/config",
)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)
# Bodies shaped like the SDK's, with fields of any type and value: most get past the JSON parser to the models.
request_like = st.fixed_dictionaries(
    {},
    optional={
        name: json_values | st.integers(min_value=-(2**80), max_value=2**80)
        for name in (
            "session_id",
            "model_id",
            "model_seq_id",
            "seq_id",
            "base_model",
            "lora_config",
            "adam_params",
            "path",
            "ttl_seconds",
            "num_samples",
            "prompt",
            "sampling_params",
            "request_id",
            "tinker_path",
            "optimizer",
            "sampling_session_seq_id",
            "model_path",
            "sdk_version",
            "kind",
        )
    },
)


@st.composite
def tensors(draw: st.DrawFn) -> pb.Tensor:
    tensor = pb.Tensor(dtype=draw(st.integers(min_value=-1, max_value=8)))
    tensor.shape.extend(draw(st.lists(st.integers(min_value=-3, max_value=2**41), max_size=3)))
    if draw(st.booleans()):
        tensor.dense = draw(st.binary(max_size=64))
    else:
        tensor.sparse_csr.values = draw(st.binary(max_size=32))
        tensor.sparse_csr.crow_indices = draw(st.binary(max_size=40))
        tensor.sparse_csr.col_indices = draw(st.binary(max_size=40))
    return tensor


@st.composite
def forward_backward_messages(draw: st.DrawFn) -> bytes:
    message = pb.ForwardBackwardRequest(
        model_id=draw(st.text(max_size=12)), seq_id=draw(st.integers(min_value=-(2**31), max_value=2**31 - 1))
    )
    message.loss_fn = draw(st.sampled_from(["", "cross_entropy", "importance_sampling", "nonsense"]))
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        datum = message.data.add()
        chunk = datum.model_input.add()
        chunk.encoded_text.tokens = draw(st.binary(max_size=24))
        for name in draw(st.lists(st.sampled_from(["target_tokens", "weights", "advantages", "x"]), max_size=3)):
            datum.loss_fn_inputs[name].CopyFrom(draw(tensors()))
    return message.SerializeToString()


@given(body=st.binary(max_size=256) | forward_backward_messages(), zstd=st.booleans())
@settings(max_examples=400, deadline=None)
def test_the_forward_backward_decoder_refuses_by_name_or_decodes(body: bytes, zstd: bool) -> None:
    try:
        batch = decode_forward_backward_request(body, "zstd" if zstd else None, max_tensor_elements=2**16)
    except WireFormatError as error:
        assert str(error)
        return
    assert batch.datums and batch.model_id and batch.loss_fn
    for datum in batch.datums:
        assert all(tensor.numel() <= 2**16 for tensor in datum.loss_fn_inputs.values())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tiny_server_config(tmp_path_factory.mktemp("fuzz"), api_keys=[KEY])) as running:
        yield running


@pytest.fixture(scope="module")
def http(server: RunningServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"{server.url}/api/v1", headers={"X-API-Key": KEY}, timeout=30) as client:
        yield client


def assert_refused_or_served(reply: httpx.Response) -> None:
    assert reply.status_code < 500, reply.text
    if reply.status_code >= 400:
        body = reply.json()
        assert body["error"] and body["category"] == "user"


@given(route=st.sampled_from(ROUTES), body=request_like | json_values)
@FUZZ
def test_json_routes_never_answer_5xx(http: httpx.Client, route: str, body: object) -> None:
    assert_refused_or_served(http.post(f"/{route}", content=json.dumps(body)))


@given(route=st.sampled_from(ROUTES), body=st.binary(max_size=128))
@FUZZ
def test_bytes_that_are_not_json_never_answer_5xx(http: httpx.Client, route: str, body: bytes) -> None:
    assert_refused_or_served(http.post(f"/{route}", content=body))


@given(body=forward_backward_messages() | st.binary(max_size=128))
@FUZZ
def test_forward_backward_bodies_never_answer_5xx(http: httpx.Client, body: bytes) -> None:
    assert_refused_or_served(
        http.post("/forward_backward", content=body, headers={"Content-Type": PROTOBUF_CONTENT_TYPE})
    )


@given(limit=st.integers(min_value=-(2**70), max_value=2**70), offset=st.integers(min_value=-(2**70), max_value=2**70))
@FUZZ
def test_listing_parameters_never_answer_5xx(http: httpx.Client, limit: int, offset: int) -> None:
    assert_refused_or_served(http.get("/training_runs", params={"limit": limit, "offset": offset}))


def test_the_server_still_serves_after_the_fuzzing(server: RunningServer, http: httpx.Client) -> None:
    assert httpx.get(f"{server.url}/healthz").json() == {"status": "ok"}
    session = http.post("/create_session", json={"sdk_version": "0.38.0", "tags": []})
    assert session.status_code == 200 and session.json()["session_id"]
