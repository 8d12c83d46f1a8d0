"""The wire layer speaks the SDK's format: requests built and sent by the SDK's own code decode with our codecs, and
our encoded results decode with the SDK's own parsers (tinker 0.38.0; see trainer_backend/wire/WIRE.md).

Requests go through the SDK's real resource methods (`AsyncTinker.training.forward_backward`, `.sampling.asample`,
...) into an in-process httpx transport, so their bodies, headers and compression are exactly what a server gets.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import zstandard
from pydantic import BaseModel, ValidationError
from tinker import types
from tinker._client import AsyncTinker
from tinker._models import validate_type
from tinker.lib._pydantic_conv import deserialize_json_response
from tinker.lib.chunked_fwdbwd_helpers import combine_fwd_bwd_output_results
from tinker.lib.public_interfaces.sampling_client import _attach_sequence_ids, _load_tokenizer_from_model_info
from tinker.lib.public_interfaces.training_client import TrainingClient
from tinker.proto import tinker_public_pb2 as pb
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.proto.response_conv import deserialize_proto_response
from tinker.types.generic_event import GenericEvent

from trainer_backend.wire import schemas
from trainer_backend.wire.proto import (
    LOSS_FN_OUTPUT_TYPE,
    ForwardBackwardResult,
    WireFormatError,
    decode_forward_backward_request,
    encode_forward_backward_output,
    encode_sample_response,
)

MODEL_ID = "sess-1:train:0"
# One reply that satisfies every response model the SDK casts a POST to, so any request can be captured.
_ANY_REPLY = {
    "request_id": "req-1",
    "session_id": "sess-1",
    "sampling_session_id": "sess-1:sample:0",
    "model_id": MODEL_ID,
    "model_data": {"model_name": "base"},
    "status": "accepted",
}


def send_with_sdk(
    send: Callable[[AsyncTinker], Awaitable[object]], *, compress: bool = False, reply: dict | None = None
) -> tuple[httpx.Request, object]:
    """Run one SDK resource call against an in-process transport; return the request it sent and what it parsed."""
    captured: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        captured.append(request)
        return httpx.Response(200, json=reply if reply is not None else _ANY_REPLY)

    async def run() -> object:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            client = AsyncTinker(
                api_key="tml-wire-test",
                base_url="http://wire.test",
                http_client=http,
                _strict_response_validation=True,
                _client_config=types.ClientConfigResponse(use_pyqwest_transport=False, proto_compress_fwdbwd=compress),
            )
            return await send(client)

    parsed = asyncio.run(run())
    (request,) = captured
    return request, parsed


def fwdbwd_request(
    datums: list[types.Datum], loss_fn: types.LossFnType = "cross_entropy", loss_fn_config: dict | None = None
) -> types.ForwardBackwardRequest:
    return types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=datums, loss_fn=loss_fn, loss_fn_config=loss_fn_config),
        model_id=MODEL_ID,
        seq_id=7,
    )


def send_fwdbwd(
    request: types.ForwardBackwardRequest, *, forward_only: bool = False, compress: bool = False
) -> httpx.Request:
    sent, _ = send_with_sdk(
        lambda client: client.training.forward_backward(request=request, forward_only=forward_only), compress=compress
    )
    return sent


def text_datum(tokens: list[int], **loss_fn_inputs: object) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(tokens), loss_fn_inputs=loss_fn_inputs)


# --- forward/backward requests: SDK encoder -> our decoder ---


def test_sdk_forward_backward_request_decodes_to_tokens_and_tensors() -> None:
    datum = types.Datum(
        model_input=types.ModelInput(
            chunks=[types.EncodedTextChunk(tokens=[11, 12]), types.EncodedTextChunk(tokens=[13])]
        ),
        loss_fn_inputs={
            "target_tokens": [12, 13, 14],
            "logprobs": np.array([-0.5, -1.0, -1.5], dtype=np.float32),
            "advantages": torch.tensor([1.0, 1.0, -2.0]),
        },
    )
    sent = send_fwdbwd(fwdbwd_request([datum, text_datum([5], target_tokens=[6])], "importance_sampling"))

    batch = decode_forward_backward_request(sent.content, sent.headers.get("content-encoding"))

    assert sent.url.path == "/api/v1/forward_backward"
    assert sent.headers["content-type"] == "application/x-protobuf"
    assert (batch.model_id, batch.seq_id, batch.forward_only, batch.loss_fn) == (
        MODEL_ID,
        7,
        False,
        "importance_sampling",
    )
    assert batch.loss_fn_config is None
    assert [d.model_input_tokens for d in batch.datums] == [[11, 12, 13], [5]]
    inputs = batch.datums[0].loss_fn_inputs
    assert inputs["target_tokens"].dtype == torch.int64
    assert inputs["target_tokens"].tolist() == [12, 13, 14]
    assert inputs["logprobs"].dtype == torch.float32
    assert inputs["logprobs"].tolist() == [-0.5, -1.0, -1.5]
    assert inputs["advantages"].tolist() == [1.0, 1.0, -2.0]


def test_zstd_compressed_request_decodes_per_its_content_encoding() -> None:
    request = fwdbwd_request([text_datum([1, 2, 3], target_tokens=[2, 3, 4], weights=[0.0, 1.0, 1.0])])
    sent = send_fwdbwd(request, compress=True)

    batch = decode_forward_backward_request(sent.content, sent.headers["content-encoding"])

    assert sent.headers["content-encoding"] == "zstd"
    assert batch.datums[0].model_input_tokens == [1, 2, 3]
    assert batch.datums[0].loss_fn_inputs["weights"].tolist() == [0.0, 1.0, 1.0]


def test_forward_is_the_same_route_with_forward_only_set() -> None:
    sent = send_fwdbwd(fwdbwd_request([text_datum([1], target_tokens=[2])]), forward_only=True)

    assert sent.url.path == "/api/v1/forward_backward"
    assert decode_forward_backward_request(sent.content).forward_only


def test_sparse_csr_inputs_decode_dense() -> None:
    # The SDK sparsifies 2-D torch target_tokens and weights when CSR is smaller (Datum._maybe_convert_array).
    targets = torch.zeros(4, 6, dtype=torch.int64)
    targets[0, 1], targets[2, 5] = 7, 9
    weights = torch.zeros(4, 6)
    weights[0, 1] = 0.5
    request = fwdbwd_request([text_datum([1, 2, 3, 4], target_tokens=targets, weights=weights)])
    assert forward_backward_request_to_proto(request).data[0].loss_fn_inputs["target_tokens"].HasField("sparse_csr")

    inputs = decode_forward_backward_request(send_fwdbwd(request).content).datums[0].loss_fn_inputs

    assert torch.equal(inputs["target_tokens"], targets)
    assert torch.equal(inputs["weights"], weights)


def test_loss_fn_config_keeps_numbers_and_strings() -> None:
    request = fwdbwd_request([text_datum([1], target_tokens=[2])], "ppo", {"clip_low_threshold": 0.8, "mode": "x"})

    batch = decode_forward_backward_request(send_fwdbwd(request).content)

    assert batch.loss_fn_config == {"clip_low_threshold": 0.8, "mode": "x"}


def test_image_chunk_is_refused_by_name() -> None:
    image = types.ImageChunk(data=b"\x89PNG", format="png", expected_tokens=4)
    datum = types.Datum(model_input=types.ModelInput(chunks=[image]), loss_fn_inputs={"target_tokens": [1, 2, 3, 4]})

    with pytest.raises(WireFormatError, match=r"datum 0 model_input chunk 0 is image"):
        decode_forward_backward_request(send_fwdbwd(fwdbwd_request([datum])).content)


def _corrupt_dtype(message: pb.ForwardBackwardRequest) -> None:
    message.data[0].loss_fn_inputs["weights"].dtype = pb.DTYPE_UNSPECIFIED


def _corrupt_shape(message: pb.ForwardBackwardRequest) -> None:
    message.data[0].loss_fn_inputs["weights"].shape[:] = [5]


def _corrupt_tensor_bytes(message: pb.ForwardBackwardRequest) -> None:
    message.data[0].loss_fn_inputs["weights"].dense += b"\x00"


def _corrupt_token_bytes(message: pb.ForwardBackwardRequest) -> None:
    message.data[0].model_input[0].encoded_text.tokens += b"\x01"


def _negative_token(message: pb.ForwardBackwardRequest) -> None:
    message.data[0].model_input[0].encoded_text.tokens = np.array([-3], dtype="<i4").tobytes()


def _corrupt_csr(message: pb.ForwardBackwardRequest) -> None:
    tensor = message.data[0].loss_fn_inputs["weights"]
    tensor.shape[:] = [3, 1]
    tensor.sparse_csr.values = np.array([1.0], dtype="<f4").tobytes()
    tensor.sparse_csr.crow_indices = np.array([0, 2, 1, 1], dtype="<i8").tobytes()
    tensor.sparse_csr.col_indices = np.array([0], dtype="<i8").tobytes()


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (_corrupt_dtype, r"loss_fn_inputs\['weights'\] has dtype DTYPE_UNSPECIFIED"),
        (_corrupt_shape, r"loss_fn_inputs\['weights'\] has shape \[5\], which needs 5 values, not 3"),
        (_corrupt_tensor_bytes, r"loss_fn_inputs\['weights'\] has 13 bytes, not a whole number of 4-byte values"),
        (_corrupt_token_bytes, r"chunk 0 has 13 token bytes, not a whole number of int32 ids"),
        (_negative_token, r"negative token id -3"),
        (_corrupt_csr, r"crow_indices must be 4 non-decreasing offsets from 0 to 1"),
    ],
    ids=["unknown-dtype", "shape-mismatch", "tensor-bytes", "token-bytes", "negative-token", "bad-csr"],
)
def test_malformed_request_raises_a_message_naming_the_fault(
    corrupt: Callable[[pb.ForwardBackwardRequest], None], message: str
) -> None:
    proto = forward_backward_request_to_proto(
        fwdbwd_request([text_datum([1, 2, 3], target_tokens=[2, 3, 4], weights=[1.0, 1.0, 1.0])])
    )
    corrupt(proto)

    with pytest.raises(WireFormatError, match=message):
        decode_forward_backward_request(proto.SerializeToString())


def test_body_that_is_not_protobuf_is_refused() -> None:
    with pytest.raises(WireFormatError, match="not a ForwardBackwardRequest protobuf"):
        decode_forward_backward_request(b"\xff\xff\xff")


def test_body_marked_zstd_that_is_not_zstd_is_refused() -> None:
    with pytest.raises(WireFormatError, match="not a valid zstd frame"):
        decode_forward_backward_request(b"plain bytes", "zstd")


def test_unknown_content_encoding_is_refused() -> None:
    with pytest.raises(WireFormatError, match="Content-Encoding 'gzip' is not supported"):
        decode_forward_backward_request(b"", "gzip")


def test_zstd_body_inflating_past_the_limit_is_refused() -> None:
    body = zstandard.ZstdCompressor().compress(b"\x00" * 10_000)

    with pytest.raises(WireFormatError, match="inflates past the limit of 1000 bytes"):
        decode_forward_backward_request(body, "zstd", max_decompressed_bytes=1000)


# --- forward/backward results: our encoder -> SDK decoder ---


def decode_with_sdk(result: ForwardBackwardResult) -> types.ForwardBackwardOutput:
    output = deserialize_proto_response(encode_forward_backward_output(result), types.ForwardBackwardOutput)
    assert isinstance(output, types.ForwardBackwardOutput)
    return output


def test_forward_backward_output_decodes_in_the_sdk() -> None:
    result = ForwardBackwardResult(
        loss_fn_outputs=[
            {"logprobs": torch.tensor([-0.25, -1.5, -3.0]), "token_ids": torch.tensor([4, 5, 6])},
            {"logprobs": np.array([-0.5], dtype=np.float64), "token_ids": np.array([7], dtype=np.int32)},
        ],
        metrics={"loss:sum": 5.25, "tokens:sum": 4.0},
    )

    output = decode_with_sdk(result)

    assert output.loss_fn_output_type == LOSS_FN_OUTPUT_TYPE
    assert output.metrics == {"loss:sum": 5.25, "tokens:sum": 4.0}
    assert [out["logprobs"].tolist() for out in output.loss_fn_outputs] == [[-0.25, -1.5, -3.0], [-0.5]]
    assert [out["logprobs"].dtype for out in output.loss_fn_outputs] == ["float32", "float32"]
    assert [out["token_ids"].tolist() for out in output.loss_fn_outputs] == [[4, 5, 6], [7]]
    assert output.loss_fn_outputs[1]["token_ids"].dtype == "int64"


def test_outputs_whose_trailing_shape_changes_keep_their_shapes() -> None:
    first, second = torch.arange(6.0).reshape(3, 2), torch.arange(12.0).reshape(4, 3)
    result = ForwardBackwardResult(loss_fn_outputs=[{"topk": first}, {"topk": second}], metrics={})

    output = decode_with_sdk(result)

    assert output.loss_fn_outputs[0]["topk"].shape == [3, 2]
    assert torch.equal(output.loss_fn_outputs[1]["topk"].to_torch(), second)


def test_chunk_results_combine_in_the_sdk_by_metric_suffix() -> None:
    def chunk(logprobs: list[list[float]], loss: float) -> types.ForwardBackwardOutput:
        outputs = [{"logprobs": torch.tensor(row)} for row in logprobs]
        return decode_with_sdk(ForwardBackwardResult(outputs, {"loss:sum": loss, "entropy:mean": loss / 10}))

    combined = combine_fwd_bwd_output_results([chunk([[-1.0], [-2.0]], 3.0), chunk([[-4.0]], 4.0)])

    assert [out["logprobs"].tolist() for out in combined.loss_fn_outputs] == [[-1.0], [-2.0], [-4.0]]
    assert combined.metrics["loss:sum"] == pytest.approx(7.0)
    assert combined.metrics["entropy:mean"] == pytest.approx((0.3 * 2 + 0.4) / 3)


def test_forward_output_feeds_the_sdk_custom_loss() -> None:
    # forward_backward_custom runs forward, differentiates the caller's loss on the returned logprobs, and sends
    # weights = -dLoss/dlogprobs (TrainingClient._compute_custom_loss).
    data = [text_datum([1, 2], target_tokens=[2, 3])]
    forward = decode_with_sdk(ForwardBackwardResult([{"logprobs": torch.tensor([-1.0, -2.0])}], {"loss:sum": 3.0}))

    custom = TrainingClient._compute_custom_loss(data, lambda _, logprobs: (-2 * logprobs[0].sum(), {}), forward)

    assert custom.loss_sum == pytest.approx(6.0)
    assert custom.data[0].loss_fn_inputs["weights"].tolist() == [2.0, 2.0]


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (ForwardBackwardResult([], {"loss": 1.0}), r"metric key 'loss' must be 'name:reduction'"),
        (ForwardBackwardResult([], {"loss:avg": 1.0}), r"metric key 'loss:avg'"),
        (
            ForwardBackwardResult([{"logprobs": torch.zeros(1)}, {"other": torch.zeros(1)}], {}),
            r"datum 1 has outputs \['other'\], datum 0 has \['logprobs'\]",
        ),
        (ForwardBackwardResult([{"mask": torch.ones(2, dtype=torch.bool)}], {}), r"output 'mask' has dtype torch.bool"),
    ],
    ids=["no-reduction", "unknown-reduction", "different-names", "bool-dtype"],
)
def test_result_the_sdk_cannot_read_is_refused(result: ForwardBackwardResult, message: str) -> None:
    with pytest.raises(WireFormatError, match=message):
        encode_forward_backward_output(result)


# --- sampling results: our encoder -> SDK decoder ---


@dataclass(frozen=True)
class Completion:
    """A completion shaped like the engine's `SampledSequence`."""

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...] | None
    stop_reason: str


@dataclass(frozen=True)
class Sampled:
    """A sampling result shaped like the engine's `SamplingResult`."""

    sequences: tuple[Completion, ...]
    prompt_logprobs: tuple[float | None, ...] | None = None
    topk_prompt_logprobs: tuple[tuple[tuple[int, float], ...] | None, ...] | None = None


def sample_with_sdk(result: Sampled, sequence_ids: list[str]) -> types.SampleResponse:
    response = deserialize_proto_response(encode_sample_response(result), types.SampleResponse)
    assert isinstance(response, types.SampleResponse)
    return _attach_sequence_ids(response, sequence_ids)


def test_sample_response_decodes_in_the_sdk() -> None:
    result = Sampled(
        sequences=(
            Completion(tokens=(5, 6, 1), logprobs=(-0.5, -0.25, -2.0), stop_reason="stop"),
            Completion(tokens=(7, 8), logprobs=(-1.0, -1.5), stop_reason="length"),
        )
    )

    response = sample_with_sdk(result, ["seq-a", "seq-b"])

    assert [s.tokens for s in response.sequences] == [[5, 6, 1], [7, 8]]
    assert [s.logprobs for s in response.sequences] == [[-0.5, -0.25, -2.0], [-1.0, -1.5]]
    assert [s.stop_reason for s in response.sequences] == ["stop", "length"]
    assert [s.sequence_id for s in response.sequences] == ["seq-a", "seq-b"]
    assert response.prompt_logprobs is None
    assert response.topk_prompt_logprobs is None


def test_prompt_logprobs_come_back_with_none_at_position_zero() -> None:
    result = Sampled(
        sequences=(Completion(tokens=(9,), logprobs=(-0.5,), stop_reason="length"),),
        prompt_logprobs=(None, -1.25, -0.5),
    )

    response = sample_with_sdk(result, ["seq-a"])

    assert response.prompt_logprobs == [None, -1.25, -0.5]


def test_topk_prompt_logprobs_round_trip_with_empty_rows() -> None:
    result = Sampled(
        sequences=(Completion(tokens=(9,), logprobs=(-0.5,), stop_reason="length"),),
        prompt_logprobs=(None, -0.125, -0.5),
        topk_prompt_logprobs=(None, ((5, -0.125), (7, -2.0)), ((1, -0.5),)),
    )

    response = sample_with_sdk(result, ["seq-a"])

    assert response.topk_prompt_logprobs == [None, [(5, -0.125), (7, -2.0)], [(1, -0.5)]]


@pytest.mark.parametrize(
    ("sequence", "message"),
    [
        (Completion(tokens=(1,), logprobs=(0.0,), stop_reason="eos"), r"stop_reason 'eos'"),
        (Completion(tokens=(2**31,), logprobs=(0.0,), stop_reason="stop"), r"token ids outside \[0, 2147483647\]"),
        (Completion(tokens=(1, 2), logprobs=(0.0,), stop_reason="stop"), r"1 logprobs for 2 tokens"),
    ],
    ids=["unknown-stop-reason", "token-past-int32", "logprob-count"],
)
def test_sample_the_sdk_cannot_read_is_refused(sequence: Completion, message: str) -> None:
    with pytest.raises(WireFormatError, match=message):
        encode_sample_response(Sampled(sequences=(sequence,)))


# --- JSON requests: SDK resource methods -> our schemas ---


def test_asample_body_parses_with_prompt_tokens_and_params() -> None:
    request = types.SampleRequest(
        sampling_session_id="sess-1:sample:0",
        seq_id=3,
        num_samples=4,
        prompt=types.ModelInput(chunks=[types.EncodedTextChunk(tokens=[1, 2]), types.EncodedTextChunk(tokens=[3])]),
        sampling_params=types.SamplingParams(max_tokens=16, temperature=0.7, stop=["\n\n"], seed=5),
        prompt_logprobs=True,
        topk_prompt_logprobs=2,
    )
    sent, _ = send_with_sdk(
        lambda client: client.sampling.asample(
            request=request, max_retries=0, extra_headers={"X-Tinker-Sampling-Backpressure": "1"}
        )
    )

    parsed = schemas.SampleRequest.model_validate_json(sent.content)

    assert sent.url.path == "/api/v1/asample"
    assert parsed.prompt.tokens() == [1, 2, 3]
    assert (parsed.num_samples, parsed.seq_id, parsed.sampling_session_id) == (4, 3, "sess-1:sample:0")
    assert parsed.sampling_params == types.SamplingParams(max_tokens=16, temperature=0.7, stop=["\n\n"], seed=5)
    assert (parsed.prompt_logprobs, parsed.topk_prompt_logprobs) == (True, 2)


def test_asample_prompt_with_an_image_is_refused_by_name() -> None:
    image = types.ImageChunk(data=b"\x89PNG", format="png", expected_tokens=4)
    request = types.SampleRequest(
        sampling_session_id="s",
        seq_id=0,
        prompt=types.ModelInput(chunks=[types.EncodedTextChunk(tokens=[1]), image]),
        sampling_params=types.SamplingParams(),
    )
    sent, _ = send_with_sdk(lambda client: client.sampling.asample(request=request))

    with pytest.raises(WireFormatError, match="prompt chunk 1 is image"):
        schemas.SampleRequest.model_validate_json(sent.content).prompt.tokens()


_LORA = types.LoraConfig(rank=8, seed=3, train_unembed=False)
_JSON_REQUESTS: list[tuple[str, Callable[[AsyncTinker], Awaitable[object]], type[BaseModel], dict]] = [
    (
        "/api/v1/client/config",
        lambda c: c.service.client_config(request=types.ClientConfigRequest(sdk_version="0.38.0")),
        schemas.ClientConfigRequest,
        {"sdk_version": "0.38.0"},
    ),
    (
        "/api/v1/create_session",
        lambda c: c.service.create_session(
            request=types.CreateSessionRequest(tags=["a"], user_metadata={}, sdk_version="0.38.0", project_id="p")
        ),
        schemas.CreateSessionRequest,
        {"tags": ["a"], "sdk_version": "0.38.0", "project_id": "p"},
    ),
    (
        "/api/v1/session_heartbeat",
        lambda c: c.service.session_heartbeat(session_id="sess-1"),
        schemas.SessionHeartbeatRequest,
        {"session_id": "sess-1"},
    ),
    (
        "/api/v1/create_model",
        lambda c: c.models.create(
            request=types.CreateModelRequest(
                session_id="sess-1", model_seq_id=0, base_model="base", lora_config=_LORA, user_metadata={"k": "v"}
            )
        ),
        schemas.CreateModelRequest,
        {"session_id": "sess-1", "model_seq_id": 0, "base_model": "base", "user_metadata": {"k": "v"}},
    ),
    (
        "/api/v1/get_info",
        lambda c: c.models.get_info(request=types.GetInfoRequest(model_id=MODEL_ID)),
        schemas.GetInfoRequest,
        {"model_id": MODEL_ID},
    ),
    (
        "/api/v1/optim_step",
        lambda c: c.training.optim_step(
            request=types.OptimStepRequest(
                optim_params=types.AdamParams(learning_rate=3e-4, grad_clip_norm=1.0), model_id=MODEL_ID, seq_id=2
            )
        ),
        schemas.OptimStepRequest,
        {"model_id": MODEL_ID, "seq_id": 2, "optimizer_params": None},
    ),
    (
        "/api/v1/save_weights",
        lambda c: c.weights.save(
            request=types.SaveWeightsRequest(model_id=MODEL_ID, path="step-5", seq_id=3, ttl_seconds=3600)
        ),
        schemas.SaveWeightsRequest,
        {"model_id": MODEL_ID, "path": "step-5", "seq_id": 3, "ttl_seconds": 3600, "overwrite": False},
    ),
    (
        "/api/v1/save_weights_for_sampler",
        lambda c: c.weights.save_for_sampler(
            request=types.SaveWeightsForSamplerRequest(model_id=MODEL_ID, path="sampler-5", seq_id=4)
        ),
        schemas.SaveWeightsForSamplerRequest,
        {"path": "sampler-5", "seq_id": 4, "ephemeral": False},
    ),
    (
        "/api/v1/save_weights_for_sampler",
        lambda c: c.weights.save_for_sampler(
            request=types.SaveWeightsForSamplerRequest(
                model_id=MODEL_ID, seq_id=5, sampling_session_seq_id=1, kind="snapshot"
            )
        ),
        schemas.SaveWeightsForSamplerRequest,
        {"path": None, "sampling_session_seq_id": 1, "kind": "snapshot", "ephemeral": True},
    ),
    (
        "/api/v1/load_weights",
        lambda c: c.weights.load(
            request=types.LoadWeightsRequest(model_id=MODEL_ID, path="tinker://run/weights/a", seq_id=1, optimizer=True)
        ),
        schemas.LoadWeightsRequest,
        {"model_id": MODEL_ID, "seq_id": 1, "optimizer": True, "session_id": None},
    ),
    (
        "/api/v1/load_weights",
        lambda c: c.weights.load(
            request=types.LoadWeightsRequest(
                session_id="sess-1", model_seq_id=2, path="tinker://run/weights/a", optimizer=False
            )
        ),
        schemas.LoadWeightsRequest,
        {"session_id": "sess-1", "model_seq_id": 2, "seq_id": None, "optimizer": False, "model_id": None},
    ),
    (
        "/api/v1/create_sampling_session",
        lambda c: c.service.create_sampling_session(
            request=types.CreateSamplingSessionRequest(
                session_id="sess-1", sampling_session_seq_id=0, model_path="tinker://run/sampler_weights/a"
            )
        ),
        schemas.CreateSamplingSessionRequest,
        {"sampling_session_seq_id": 0, "model_path": "tinker://run/sampler_weights/a", "base_model": None},
    ),
    (
        "/api/v1/retrieve_future",
        # As _APIFuture._fetch_via_rest polls (api_future_impl.py:462-470).
        lambda c: c.futures.with_raw_response.retrieve(
            request=types.FutureRetrieveRequest(request_id="req-1", allow_metadata_only=True),
            timeout=45,
            extra_headers={"X-Tinker-Request-Iteration": "0", "Accept": "application/x-protobuf"},
            max_retries=0,
        ),
        schemas.FutureRetrieveRequest,
        {"request_id": "req-1", "allow_metadata_only": True},
    ),
    (
        "/api/v1/telemetry",
        lambda c: c.telemetry.send(
            request=types.TelemetrySendRequest(
                events=[
                    GenericEvent(
                        event="GENERIC_EVENT",
                        event_id="e1",
                        event_name="x",
                        event_session_index=0,
                        severity="INFO",
                        timestamp=datetime(2026, 1, 1, tzinfo=UTC),
                    )
                ],
                platform="linux",
                sdk_version="0.38.0",
                session_id="sess-1",
                process_uuid="p",
            )
        ),
        schemas.TelemetrySendRequest,
        {"platform": "linux", "session_id": "sess-1"},
    ),
]


@pytest.mark.parametrize(
    ("path", "send", "schema", "expected"),
    _JSON_REQUESTS,
    ids=[f"{path.rsplit('/', 1)[-1]}-{i}" for i, (path, *_) in enumerate(_JSON_REQUESTS)],
)
def test_sdk_json_request_parses_with_our_schema(
    path: str, send: Callable[[AsyncTinker], Awaitable[object]], schema: type[BaseModel], expected: dict
) -> None:
    sent, _ = send_with_sdk(send)

    parsed = schema.model_validate_json(sent.content)

    assert sent.url.path == path
    assert sent.headers["x-api-key"] == "tml-wire-test"
    assert sent.headers["x-idempotency-key"]
    assert {name: getattr(parsed, name) for name in expected} == expected


def test_create_model_lora_and_optimizer_match_the_sdk_types() -> None:
    request = types.CreateModelRequest(session_id="s", model_seq_id=0, base_model="b", lora_config=_LORA)
    sent, _ = send_with_sdk(lambda client: client.models.create(request=request))

    parsed = schemas.CreateModelRequest.model_validate_json(sent.content)

    assert parsed.lora_config is not None
    assert parsed.lora_config.model_dump() == _LORA.model_dump()
    assert parsed.optimizer_config.type == "adamw"


def test_adam_params_arrive_under_adam_params() -> None:
    params = types.AdamParams(learning_rate=3e-4, beta2=0.99, weight_decay=0.01)
    request = types.OptimStepRequest(optim_params=params, model_id=MODEL_ID, seq_id=2)
    sent, _ = send_with_sdk(lambda client: client.training.optim_step(request=request))

    parsed = schemas.OptimStepRequest.model_validate_json(sent.content)

    assert json.loads(sent.content)["adam_params"]["beta2"] == 0.99
    assert parsed.adam_params is not None
    assert parsed.adam_params.model_dump() == params.model_dump()


def test_other_optimizer_params_arrive_under_optimizer_params() -> None:
    request = types.OptimStepRequest(optim_params=types.DimuonParams(learning_rate=0.02), model_id=MODEL_ID, seq_id=2)
    sent, _ = send_with_sdk(lambda client: client.training.optim_step(request=request))

    parsed = schemas.OptimStepRequest.model_validate_json(sent.content)

    assert parsed.adam_params is None
    assert parsed.optimizer_params is not None
    assert parsed.optimizer_params.type == "dimuon"


def test_finish_session_body_parses() -> None:
    # ServiceClient.close posts this literal body (service_client.py:828).
    parsed = schemas.FinishSessionRequest.model_validate({"reason": {"type": "errored"}, "detail": None})

    assert (parsed.reason.type, parsed.detail) == ("errored", None)


def test_fields_a_newer_sdk_adds_are_ignored() -> None:
    body = {
        "session_id": "s",
        "model_seq_id": 0,
        "base_model": "b",
        "lora_config": {"rank": 4, "alpha": 16},
        "future_field": True,
        "type": "create_model",
    }

    parsed = schemas.CreateModelRequest.model_validate(body)

    assert parsed.lora_config is not None
    assert parsed.lora_config.rank == 4


@pytest.mark.parametrize(
    ("schema", "body"),
    [
        (schemas.SaveWeightsForSamplerRequest, {"model_id": "m", "path": "a", "sampling_session_seq_id": 1}),
        (schemas.LoadWeightsRequest, {"path": "tinker://r/weights/a", "optimizer": False}),
        (schemas.OptimStepRequest, {"model_id": "m"}),
        (schemas.CreateSamplingSessionRequest, {"session_id": "s", "sampling_session_seq_id": 0}),
    ],
    ids=["sampler-save-both-forms", "load-without-address", "optim-without-params", "sampler-without-model"],
)
def test_ambiguous_request_is_refused(schema: type[BaseModel], body: dict) -> None:
    with pytest.raises(ValidationError):
        schema.model_validate(body)


# --- JSON responses: our models -> the SDK's strict validation ---

_WHEN = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
_CHECKPOINT = schemas.Checkpoint(
    checkpoint_id="weights/step-5", checkpoint_type="training", time=_WHEN, tinker_path="tinker://run-1/weights/step-5"
)
_RESPONSES: list[BaseModel] = [
    schemas.UntypedAPIFuture(request_id="req-1", sample_sequence_ids=["a", "b"]),
    schemas.TryAgainResponse(request_id="req-1", queue_state="active"),
    schemas.RequestFailedResponse(error="bad shape", category=schemas.RequestErrorCategory.User),
    schemas.CreateModelResponse(model_id=MODEL_ID),
    schemas.SaveWeightsForSamplerResponseInternal(path="tinker://run-1/sampler_weights/s"),
    schemas.SaveWeightsForSamplerResponseInternal(sampling_session_id="sess-1:sample:1"),
    schemas.TrainingRunsResponse(
        training_runs=[
            schemas.TrainingRun(
                training_run_id="run-1",
                base_model="base",
                model_owner="me",
                is_lora=True,
                lora_rank=8,
                last_request_time=_WHEN,
                last_checkpoint=_CHECKPOINT,
            )
        ],
        cursor=schemas.Cursor(offset=0, limit=20, total_count=1),
    ),
    schemas.CheckpointsListResponse(checkpoints=[_CHECKPOINT]),
    schemas.WeightsInfoResponse(base_model="base", is_lora=True, lora_rank=8),
]


@pytest.mark.parametrize("response", _RESPONSES, ids=lambda response: type(response).__name__)
def test_response_survives_json_and_the_sdk_strict_validation(response: BaseModel) -> None:
    body = json.loads(json.dumps(response.model_dump(mode="json")))

    assert validate_type(type_=type(response), value=body) == response
    assert deserialize_json_response(body, type(response)) == response


def test_request_failed_category_is_lowercase_on_the_wire() -> None:
    failed = schemas.RequestFailedResponse(error="x", category=schemas.RequestErrorCategory.Server)

    assert failed.model_dump(mode="json") == {"error": "x", "category": "server"}


@pytest.mark.slow
def test_get_info_with_a_local_tokenizer_folder_lets_get_tokenizer_work_offline(tmp_path: Path) -> None:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]").save_pretrained(tmp_path)
    info = schemas.GetInfoResponse(
        model_id=MODEL_ID,
        model_data=schemas.ModelData(model_name="base", tokenizer_id=str(tmp_path)),
        is_lora=True,
        lora_rank=8,
    )
    _, parsed = send_with_sdk(
        lambda client: client.models.get_info(request=types.GetInfoRequest(model_id=MODEL_ID)),
        reply=info.model_dump(mode="json"),
    )
    assert isinstance(parsed, types.GetInfoResponse)

    # What TrainingClient.get_tokenizer does with the info (training_client.py:1313-1315).
    loaded = _load_tokenizer_from_model_info(parsed.model_data.model_name, parsed.model_data.tokenizer_id)

    assert loaded.encode("hello world", add_special_tokens=False) == [1, 2]
