"""The server refuses bad input with a 4xx that names the problem and keeps serving; training requests run in seq_id
order and a retry never runs twice; health, metrics and the command line work.

The SDK drives the server wherever it can express the case. Raw httpx (`RawApi`) sends what the SDK would refuse to
send, and controls seq_ids and idempotency keys, with bodies built by the SDK's own serialisation.
"""

from __future__ import annotations

import math
import os
import re
import socket
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import tinker
from prometheus_client.parser import text_string_to_metric_families
from support.backends import TINY, tiny_server_config
from support.commands import run_command
from support.trainer import RawApi, assert_still_serves, error_of, next_token_datum, request_id_of
from tinker import types

from trainer_backend.auth import KeyPolicy
from trainer_backend.config import ServerConfig
from trainer_backend.errors import UserInputError
from trainer_backend.server import RunningServer, reserve_port, running_server
from trainer_backend.wire.proto import PROTOBUF_CONTENT_TYPE

KEY = "tml-robustness"


@pytest.fixture(scope="module")
def api_key() -> str:
    return KEY


# --- bad input: refused by name, synchronously ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "encoding", "problem"),
    [
        (b"\x0a\xff\xff\xff\x0f not protobuf", None, "protobuf|parse|decode"),
        (b"not a zstd frame", "zstd", "zstd"),
    ],
)
def test_a_malformed_protobuf_body_is_refused_by_name(
    api: RawApi, training: tinker.TrainingClient, ids: list[int], body: bytes, encoding: str | None, problem: str
) -> None:
    headers = {"Content-Type": PROTOBUF_CONTENT_TYPE, **({"Content-Encoding": encoding} if encoding else {})}
    reply = api.http.post("/forward_backward", content=body, headers=headers)
    assert re.search(problem, error_of(reply, 400), re.IGNORECASE)
    assert reply.json()["category"] == "user"
    assert_still_serves(training, ids)


def test_malformed_json_is_refused_by_name(api: RawApi, training: tinker.TrainingClient, ids: list[int]) -> None:
    error = error_of(api.post("/optim_step", b'{"model_id": "x", "seq_id": '), 400)
    assert "OptimStepRequest" in error and "JSON" in error
    assert_still_serves(training, ids)


def test_fields_of_the_wrong_type_are_named(api: RawApi, training: tinker.TrainingClient, ids: list[int]) -> None:
    body = {"model_id": training.model_id, "seq_id": "two", "adam_params": {"learning_rate": "fast"}}
    error = error_of(api.post("/optim_step", body), 400)
    assert "seq_id" in error and "adam_params.learning_rate" in error
    assert_still_serves(training, ids)


def test_an_unknown_model_id_is_refused_by_name(api: RawApi, training: tinker.TrainingClient, ids: list[int]) -> None:
    unknown = "ses-00000000000000000000:train:0"
    assert unknown in error_of(api.post("/get_info", {"model_id": unknown}), 404)
    assert unknown in error_of(api.forward_backward(unknown, 1, [next_token_datum(ids)]), 404)
    assert unknown in error_of(api.optim_step(unknown, 1, 1e-3), 404)
    assert_still_serves(training, ids)


def test_an_unknown_session_id_is_refused_by_name(api: RawApi, training: tinker.TrainingClient, ids: list[int]) -> None:
    unknown = "ses-ffffffffffffffffffff"
    create = {"session_id": unknown, "model_seq_id": 0, "base_model": TINY, "lora_config": {"rank": 4}}
    assert unknown in error_of(api.post("/create_model", create), 404)
    assert unknown in error_of(api.post("/session_heartbeat", {"session_id": unknown}), 404)
    sampling = {"session_id": unknown, "sampling_session_seq_id": 0, "base_model": TINY}
    assert unknown in error_of(api.post("/create_sampling_session", sampling), 404)
    assert_still_serves(training, ids)


def test_an_unknown_sampling_session_is_refused_by_name(
    api: RawApi, training: tinker.TrainingClient, ids: list[int]
) -> None:
    unknown = "smp-ffffffffffffffffffff"
    request = types.SampleRequest(
        sampling_session_id=unknown,
        seq_id=0,
        num_samples=1,
        prompt=types.ModelInput.from_ints(ids[:3]),
        sampling_params=types.SamplingParams(max_tokens=2),
    )
    assert unknown in error_of(api.post("/asample", request), 404)
    assert unknown in error_of(api.http.get(f"/samplers/{unknown}"), 404)
    assert_still_serves(training, ids)


def test_an_unknown_request_id_is_refused_by_name(api: RawApi, training: tinker.TrainingClient, ids: list[int]) -> None:
    unknown = "req-000000000000000000000000"
    assert unknown in error_of(api.post("/retrieve_future", {"request_id": unknown}), 404)
    assert_still_serves(training, ids)


def test_a_negative_learning_rate_is_refused_and_the_client_carries_on(
    training: tinker.TrainingClient, ids: list[int]
) -> None:
    with pytest.raises(tinker.BadRequestError, match=r"learning_rate=-0.1 is out of range"):
        training.optim_step(types.AdamParams(learning_rate=-0.1)).result(timeout=20)
    assert_still_serves(training, ids)


@pytest.mark.parametrize("name", ["../../etc", "a/b", ".hidden", "x" * 200])
def test_an_invalid_checkpoint_name_is_refused_and_the_client_carries_on(
    server: RunningServer, training: tinker.TrainingClient, ids: list[int], name: str
) -> None:
    with pytest.raises(tinker.BadRequestError, match="invalid checkpoint name"):
        training.save_state(name).result(timeout=20)
    with pytest.raises(tinker.BadRequestError, match="invalid checkpoint name"):
        training.save_weights_for_sampler(name).result(timeout=20)
    assert not list(server.service.config.storage_root.rglob("etc"))
    assert_still_serves(training, ids)


@pytest.mark.parametrize(
    "path",
    [
        "tinker://only-a-model",
        "tinker://model/weights",
        "tinker://model/weights/a/b",
        "tinker://model/checkpoints/name",
        "tinker://../weights/x",
        "tinker://model/weights/..",
        "file:///etc/passwd",
    ],
)
def test_a_checkpoint_path_of_the_wrong_shape_is_refused_by_name(
    client: tinker.ServiceClient, api: RawApi, path: str
) -> None:
    assert "checkpoint" in error_of(api.post("/weights_info", {"tinker_path": path}), 400)
    session = api.post("/create_session", {"sdk_version": tinker.__version__, "tags": []}).json()["session_id"]
    load = {"session_id": session, "model_seq_id": 0, "path": path, "optimizer": False}
    assert "checkpoint" in error_of(api.post("/load_weights", load), 400)
    if path.startswith("tinker://"):  # the SDK itself refuses other schemes
        with pytest.raises(tinker.BadRequestError, match=r"checkpoint (path|name)"):
            client.create_sampling_client(model_path=path).result(timeout=20)


def test_a_load_state_of_a_missing_checkpoint_is_refused_and_the_client_carries_on(
    training: tinker.TrainingClient, ids: list[int]
) -> None:
    with pytest.raises(tinker.NotFoundError, match="not found"):
        training.load_state(f"tinker://{training.model_id}/weights/never-saved").result(timeout=20)
    assert_still_serves(training, ids)


# --- bad input: found by the device worker, reported through the future -----------------------------------------


@pytest.mark.parametrize(
    ("datum", "problem"),
    [
        (lambda ids: next_token_datum([*ids[:-1], 10_000]), "target_tokens outside the vocabulary"),
        (lambda ids: next_token_datum([10_000, *ids[1:]]), r"datum 0 has token ids outside the vocabulary \[0, 512\)"),
        (lambda ids: next_token_datum((ids * 300)[:2050]), "context length is 2048"),
        (
            lambda ids: types.Datum(
                model_input=types.ModelInput.from_ints(ids[:-1]), loss_fn_inputs={"target_tokens": ids[2:]}
            ),
            r"target_tokens has \d+ positions for \d+ input tokens",
        ),
        (lambda ids: next_token_datum(ids, weights=[1.0] * 3), "'weights' has shape"),
    ],
    ids=["target-token-beyond-vocabulary", "input-token-beyond-vocabulary", "too-long", "targets-short", "weights"],
)
def test_inputs_the_device_rejects_fail_the_future_by_name(
    training: tinker.TrainingClient, ids: list[int], datum: Callable[[list[int]], types.Datum], problem: str
) -> None:
    with pytest.raises(tinker.RequestFailedError, match=problem) as failure:
        training.forward_backward([datum(ids)], "cross_entropy").result(timeout=20)
    assert failure.value.category == "user"
    assert_still_serves(training, ids)


def test_a_negative_token_id_is_refused_and_the_client_carries_on(
    training: tinker.TrainingClient, ids: list[int]
) -> None:
    with pytest.raises(tinker.BadRequestError, match="negative token id"):
        training.forward([next_token_datum([-1, *ids[1:]])], "cross_entropy").result(timeout=20)
    assert_still_serves(training, ids)


def test_nan_advantages_fail_the_future_by_name(training: tinker.TrainingClient, ids: list[int]) -> None:
    n = len(ids) - 1
    datum = next_token_datum(ids, logprobs=[-1.0] * n, advantages=[1.0] * (n - 1) + [math.nan])
    with pytest.raises(tinker.RequestFailedError, match="'advantages' contains NaN") as failure:
        training.forward_backward([datum], "importance_sampling").result(timeout=20)
    assert failure.value.category == "user"
    assert_still_serves(training, ids)


# --- ordering and idempotency over HTTP ----------------------------------------------------------------------------


def logprobs_of(output: types.ForwardBackwardOutput) -> list[float]:
    return output.loss_fn_outputs[0]["logprobs"].tolist()


def test_requests_sent_out_of_order_run_in_seq_id_order(
    api: RawApi, client: tinker.ServiceClient, ids: list[int]
) -> None:
    model_id = client.create_lora_training_client(base_model=TINY, rank=4, seed=0).result().model_id
    untouched = client.create_lora_training_client(base_model=TINY, rank=4, seed=0).result()
    datum = next_token_datum(ids)
    after = api.forward_backward(model_id, 4, [datum], forward_only=True)
    step = api.optim_step(model_id, 3, 5e-2)
    before = api.forward_backward(model_id, 1, [datum], forward_only=True)
    gradient = api.forward_backward(model_id, 2, [datum])

    initial = logprobs_of(untouched.forward([datum], "cross_entropy").result())
    assert logprobs_of(api.forward_output(before)) == pytest.approx(initial, abs=1e-6)
    api.forward_output(gradient)
    assert api.result(step).json() is not None
    trained = logprobs_of(api.forward_output(after))
    # The forward sent first saw the step sent second: it ran after it.
    assert sum(trained) > sum(initial) + 1e-3


def test_a_retried_request_finds_its_future_and_runs_once(
    api: RawApi, client: tinker.ServiceClient, ids: list[int]
) -> None:
    retried, once = (client.create_lora_training_client(base_model=TINY, rank=4, seed=5).result() for _ in range(2))
    datum = next_token_datum(ids)
    for model_id in (retried.model_id, once.model_id):
        api.forward_output(api.forward_backward(model_id, 1, [datum]))
    first = api.optim_step(retried.model_id, 2, 5e-2)
    again = api.optim_step(retried.model_id, 2, 5e-2)  # same body and seq_id, new idempotency key
    assert request_id_of(again) == request_id_of(first)
    api.result(again)
    api.result(api.optim_step(once.model_id, 2, 5e-2))

    def logprobs_at_seq_3(model_id: str) -> list[float]:
        return logprobs_of(api.forward_output(api.forward_backward(model_id, 3, [datum], forward_only=True)))

    # Adam moves the weights again on a second step even with the same gradient: equal log-probs mean one step.
    assert logprobs_at_seq_3(retried.model_id) == pytest.approx(logprobs_at_seq_3(once.model_id), abs=1e-6)


def test_a_seq_id_reused_with_another_body_is_a_400_naming_it(
    api: RawApi, training: tinker.TrainingClient, ids: list[int]
) -> None:
    model_id = training.model_id
    api.result(api.forward_backward(model_id, 1, [next_token_datum(ids)]))
    api.result(api.optim_step(model_id, 2, 1e-2))
    error = error_of(api.optim_step(model_id, 2, 2e-2), 400)
    assert "seq_id 2" in error and "different" in error


def test_a_retried_create_model_does_not_rewind_the_model(api: RawApi, ids: list[int]) -> None:
    """The SDK's HTTP layer resends create_model when a reply is lost; the run must go on from where it is."""
    session = api.post("/create_session", {"sdk_version": tinker.__version__, "tags": []}).json()["session_id"]
    create = {"session_id": session, "model_seq_id": 0, "base_model": TINY, "lora_config": {"rank": 4}}
    first = api.post("/create_model", create)
    model_id = api.result(first).json()["model_id"]
    assert request_id_of(api.post("/create_model", create)) == request_id_of(first)
    output = api.forward_output(api.forward_backward(model_id, 1, [next_token_datum(ids)], forward_only=True))
    assert len(logprobs_of(output)) == len(ids) - 1


def test_a_request_refused_for_a_full_queue_runs_when_retried(
    server: RunningServer, api: RawApi, ids: list[int]
) -> None:
    """A 429 is retried by the SDK with the same seq_id and body; the retry must run, not find a failed future."""
    session = api.post("/create_session", {"sdk_version": tinker.__version__, "tags": []}).json()["session_id"]
    create = {"session_id": session, "model_seq_id": 0, "base_model": TINY, "lora_config": {"rank": 4}}
    model_id = api.result(api.post("/create_model", create)).json()["model_id"]
    scheduler = server.service.scheduler
    capacity, scheduler.max_queued = scheduler.max_queued, 0
    try:
        refused = api.forward_backward(model_id, 1, [next_token_datum(ids)], forward_only=True)
    finally:
        scheduler.max_queued = capacity
    assert "retry" in error_of(refused, 429)
    output = api.forward_output(api.forward_backward(model_id, 1, [next_token_datum(ids)], forward_only=True))
    assert len(logprobs_of(output)) == len(ids) - 1


# --- health, metrics, command line -----------------------------------------------------------------------------


def test_healthz_answers_ok(server: RunningServer) -> None:
    for route in ("/healthz", "/api/v1/healthz"):
        reply = httpx.get(f"{server.url}{route}")
        assert reply.status_code == 200 and reply.json() == {"status": "ok"}


def test_metrics_report_queue_operations_busy_time_and_tokens(
    server: RunningServer, training: tinker.TrainingClient, ids: list[int]
) -> None:
    training.forward_backward([next_token_datum(ids)], "cross_entropy").result()
    sampler = training.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=3, temperature=0.0, stop=[])
    sampler.sample(types.ModelInput.from_ints(ids), num_samples=1, sampling_params=params).result()
    reply = httpx.get(f"{server.url}/metrics")
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    samples = {
        (sample.name, tuple(sorted(sample.labels.values()))): sample.value
        for family in text_string_to_metric_families(reply.text)
        for sample in family.samples
    }
    assert samples[("trainer_queue_depth", ("all",))] >= 0
    assert samples[("trainer_operations_total", ("forward_backward",))] >= 1
    assert samples[("trainer_operations_total", ("create_model",))] >= 1
    assert samples[("trainer_device_busy_seconds_total", ())] > 0
    # One vocabulary of phases: what the device trained on, the prompts it sampled from, and the tokens it sampled.
    assert samples[("trainer_tokens_total", ("trained",))] >= len(ids) - 1
    assert samples[("trainer_tokens_total", ("prompt",))] >= len(ids)
    assert samples[("trainer_tokens_total", ("sampled",))] >= 3


def test_the_command_line_explains_serve() -> None:
    # Wide enough that rich does not cut the longest flag's name.
    wide = {**os.environ, "COLUMNS": "200"}
    result = run_command("trainer_backend", "serve", "--help", timeout_s=60, env=wide)
    assert result.returncode == 0, result.stderr
    # Every config field is a flag (derived from the config, so none is forgotten), its help the field's own.
    help_text = " ".join(result.stdout.replace("│", " ").split())
    for name, field in ServerConfig.model_fields.items():
        flag = "--api-key" if name == "api_keys" else "--" + name.replace("_", "-")
        assert f"{flag} " in help_text, flag
        assert " ".join(field.description.split()[:3]) in help_text, name
    assert "(default: 1024)" in help_text  # max_queued's default


@pytest.mark.parametrize(
    ("key", "problem"), [("x", "does not start with 'tml-'"), ("tml-short", "is too short: at least 8 characters")]
)
def test_the_server_refuses_a_key_the_sdk_cannot_send_or_anyone_could_guess(key: str, problem: str) -> None:
    result = run_command(
        "trainer_backend", "serve", "--api-key", "tml-a-long-enough-key", "--api-key", key, timeout_s=60
    )
    assert result.returncode == 1
    assert f"API key #2 {problem}" in result.stderr and key not in result.stderr.replace(problem, "")


def test_serving_without_keys_is_refused_off_loopback() -> None:
    with pytest.raises(UserInputError, match=r"refusing to serve on 0\.0\.0\.0 without API keys"):
        KeyPolicy().check_bind("0.0.0.0")
    with pytest.raises(UserInputError, match="--api-key"):
        KeyPolicy().check_bind("10.1.2.3")
    for host in ("127.0.0.1", "localhost", "::1"):
        KeyPolicy().check_bind(host)
    KeyPolicy(frozenset({"tml-secret"})).check_bind("0.0.0.0")


def test_a_server_without_keys_will_not_start_off_loopback(tmp_path: Path) -> None:
    with (
        pytest.raises(UserInputError, match="without API keys"),
        running_server(tiny_server_config(tmp_path, host="0.0.0.0")),
    ):
        pytest.fail("the server started")


def test_a_port_in_use_is_refused_at_once_before_the_model_loads(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = run_command(
            "trainer_backend", "serve", "--base-model", "no-such-model", "--port", str(port),
            "--storage-root", str(tmp_path), timeout_s=60,
        )  # fmt: skip
    assert result.returncode == 1
    # The port is named, not the model: the model was never looked up.
    assert f"cannot serve on 127.0.0.1:{port}: Address already in use" in result.stderr
    assert "no-such-model" not in result.stderr


def test_the_listening_socket_says_tcp_so_its_connections_send_without_nagles_delay() -> None:
    # asyncio sets TCP_NODELAY on accepted connections only when the listening socket names IPPROTO_TCP; without it
    # each small reply waited for the client's delayed ACK, 40 ms a request (a fairness test saw a tenant's requests
    # arrive seconds late).
    with reserve_port("127.0.0.1", 0) as listener:
        assert listener.proto == socket.IPPROTO_TCP
