"""Helpers for tests that drive the training server: datum builders, raw HTTP calls, the status view, the SQL the
tests train on, and the rounding that separates two computations of one log-prob."""

from __future__ import annotations

import math
import time
import uuid

import httpx
import tinker
import torch
from pydantic import BaseModel
from tinker import types
from tinker._compat import model_dump
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.proto.response_conv import deserialize_proto_response

from trainer_backend.engine.types import SamplingResult
from trainer_backend.server import RunningServer
from trainer_backend.wire.proto import PROTOBUF_CONTENT_TYPE

# Two computations of one log-prob that sum in different orders (a batched pass against a row alone, the engine's
# chunked unembedding against transformers' F.linear) agree only to float rounding. A log-prob z_t - logsumexp(z)
# moves by at most twice the largest logit error, and a logit's fp32 error grows with its magnitude and the depth
# of sums behind it: measured up to 1.1e-5 over 240 mixed-batch requests here, and once 1.47e-4 on a fresh clone
# (issue 13), which failed the 1e-4 these comparisons used. 1e-3 leaves that case 7x headroom, while a row sent
# through the wrong adapter, a wrong position or a wrong temperature moves log-probs by 1e-2 and more.
LOGPROB_ROUNDING = 1e-3


# A completion the tests train on and score: text-to-SQL, as the backend's real users send.
SQL = "SELECT name FROM employees WHERE salary > 50000;"


def assert_answered_alike(one: object, other: object) -> None:
    """Two engine answers to the same sampling request: the same tokens and stop reasons, log-probs up to rounding."""
    assert isinstance(one, SamplingResult) and isinstance(other, SamplingResult)
    assert [s.tokens for s in one.sequences] == [s.tokens for s in other.sequences]
    assert [s.stop_reason for s in one.sequences] == [s.stop_reason for s in other.sequences]
    for sequence, other_sequence in zip(one.sequences, other.sequences, strict=True):
        torch.testing.assert_close(sequence.logprobs, other_sequence.logprobs, atol=LOGPROB_ROUNDING, rtol=0)


def status_of(server: RunningServer, key: str) -> dict:
    """GET /api/v1/status as `key` sees it."""
    reply = httpx.get(f"{server.url}/api/v1/status", headers={"X-API-Key": key}, timeout=10)
    assert reply.status_code == 200, reply.text
    return reply.json()


def datum_for(tokenizer, text: str) -> types.Datum:
    """Next-token prediction on `text`, every position weighted 1."""
    ids = tokenizer.encode(text)
    return types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
    )


def next_token_datum(ids: list[int], **loss_fn_inputs: object) -> types.Datum:
    """Next-token prediction on `ids`, with any further loss inputs."""
    return types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:], **loss_fn_inputs},
    )


def assert_still_serves(training: tinker.TrainingClient, ids: list[int]) -> None:
    """The same training client's next request runs at once: a refusal neither broke the server nor held up its
    seq_ids (a missing one would hold it for the server's 60 s gap timeout)."""
    started = time.monotonic()
    output = training.forward([next_token_datum(ids)], "cross_entropy").result(timeout=20)
    logprobs = output.loss_fn_outputs[0]["logprobs"].tolist()
    assert len(logprobs) == len(ids) - 1
    assert all(math.isfinite(lp) and lp <= 0 for lp in logprobs)
    assert time.monotonic() - started < 15


class RawApi:
    """The server's routes over plain httpx, for what the SDK would refuse to send or sends only its own way.

    Bodies are built with the SDK's own types and serialisation where they can be, so only the part a test bends
    differs from what the SDK sends. Every POST carries a fresh idempotency key, as the SDK's outer retries do.
    """

    def __init__(self, url: str, api_key: str | None) -> None:
        headers = {"X-API-Key": api_key} if api_key else {}
        self.http = httpx.Client(base_url=f"{url}/api/v1", headers=headers, timeout=30)

    def post(
        self, route: str, body: BaseModel | dict | bytes, content_type: str = "application/json"
    ) -> httpx.Response:
        headers = {"X-Idempotency-Key": f"stainless-python-retry-{uuid.uuid4()}"}
        if isinstance(body, BaseModel):
            body = model_dump(body, exclude_unset=False, exclude_none=True, mode="json")
        if isinstance(body, dict):
            return self.http.post(route, json=body, headers=headers)
        return self.http.post(route, content=body, headers={**headers, "Content-Type": content_type})

    def forward_backward(
        self,
        model_id: str,
        seq_id: int,
        datums: list[types.Datum],
        loss_fn: types.LossFnType = "cross_entropy",
        forward_only: bool = False,
    ) -> httpx.Response:
        """POST /forward_backward with the body the SDK's `training.forward_backward` would build."""
        request = types.ForwardBackwardRequest(
            forward_backward_input=types.ForwardBackwardInput(data=datums, loss_fn=loss_fn),
            model_id=model_id,
            seq_id=seq_id,
        )
        message = forward_backward_request_to_proto(request)
        message.forward_only = forward_only
        return self.post("/forward_backward", message.SerializeToString(), PROTOBUF_CONTENT_TYPE)

    def optim_step(self, model_id: str, seq_id: int, learning_rate: float) -> httpx.Response:
        params = types.AdamParams(learning_rate=learning_rate)
        return self.post("/optim_step", types.OptimStepRequest(adam_params=params, model_id=model_id, seq_id=seq_id))

    def result(self, submitted: httpx.Response | str, timeout: float = 20.0) -> httpx.Response:
        """Poll a future (a submission's response, or a request id) until it is no longer `try_again`."""
        request_id = submitted if isinstance(submitted, str) else request_id_of(submitted)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            reply = self.post("/retrieve_future", {"request_id": request_id, "allow_metadata_only": False})
            if reply.headers["content-type"].startswith("application/json") and reply.json().get("type") == "try_again":
                continue
            return reply
        raise AssertionError(f"future {request_id} did not finish within {timeout} s")

    def forward_output(self, submitted: httpx.Response) -> types.ForwardBackwardOutput:
        """The finished result of a forward/forward_backward, parsed by the SDK's own protobuf reader."""
        reply = self.result(submitted)
        assert reply.headers["content-type"] == PROTOBUF_CONTENT_TYPE, reply.text
        return deserialize_proto_response(reply.content, types.ForwardBackwardOutput)


def request_id_of(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return response.json()["request_id"]


def error_of(response: httpx.Response, status: int) -> str:
    """The `error` of a refusal, after checking its status and that the body is the server's JSON error."""
    assert response.status_code == status, response.text
    return response.json()["error"]
