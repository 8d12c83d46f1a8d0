"""No small request costs gigabytes and no input makes a 5xx: every bound is checked before work, answered with a
4xx naming it, and the server (and the client's seq_ids) carry on. Each case is one an attacker's probe found.

The server here has a small body limit, so that a test can pass it without sending megabytes.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import tinker
import zstandard
from support.backends import GEMMA_CHAT_TEMPLATE, TINY, tiny_server_config
from support.trainer import RawApi, assert_still_serves, error_of, next_token_datum
from tinker import types

from trainer_backend.server import RunningServer, running_server
from trainer_backend.wire.proto import PROTOBUF_CONTENT_TYPE

KEY = "tml-limits-one"
OTHER_KEY = "tml-limits-two"
MAX_BODY = 256 * 1024
# The tiny model's max_position_embeddings: prompt plus completion tokens.
CONTEXT = 2048


@pytest.fixture(scope="module")
def api_key() -> str:
    return KEY


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    config = tiny_server_config(
        tmp_path_factory.mktemp("limits"),
        api_keys=[KEY, OTHER_KEY],
        max_request_bytes=MAX_BODY,
        max_tensor_elements=4096,
        max_lora_rank=64,
        max_num_samples=16,
        chat_template=GEMMA_CHAT_TEMPLATE,
    )
    with running_server(config) as running:
        yield running


def test_a_body_over_the_limit_is_refused_with_413_before_it_is_read(api: RawApi) -> None:
    reply = api.http.post("/optim_step", content=b" " * (MAX_BODY + 1), headers={"Content-Type": "application/json"})
    error = error_of(reply, 413)
    assert str(MAX_BODY) in error and "--max-request-bytes" in error
    assert reply.json()["category"] == "user"


def test_a_chunked_body_without_a_length_is_cut_off_at_the_limit(api: RawApi) -> None:
    def pieces() -> Iterator[bytes]:
        for _ in range(8):
            yield b" " * (MAX_BODY // 4)

    reply = api.http.post("/optim_step", content=pieces(), headers={"Content-Type": "application/json"})
    assert "--max-request-bytes" in error_of(reply, 413)


def test_a_small_zstd_body_that_inflates_past_the_limit_is_refused(
    api: RawApi, training: tinker.TrainingClient, ids: list[int]
) -> None:
    bomb = zstandard.ZstdCompressor().compress(b"\0" * (4 * MAX_BODY))
    assert len(bomb) < 1024
    headers = {"Content-Type": PROTOBUF_CONTENT_TYPE, "Content-Encoding": "zstd"}
    error = error_of(api.http.post("/forward_backward", content=bomb, headers=headers), 400)
    assert f"limit of {MAX_BODY} bytes" in error
    assert_still_serves(training, ids)


def test_a_sparse_tensor_declaring_a_huge_shape_is_refused_before_it_is_made_dense(
    training: tinker.TrainingClient, ids: list[int]
) -> None:
    n = len(ids) - 1
    # A few bytes that would densify to 4 × 2^24 floats (256 MB), and to 24 TiB with 2^40 columns.
    for columns in (2**24, 2**40):
        huge = types.TensorData(
            data=[1.0], dtype="float32", shape=[4, columns], sparse_crow_indices=[0, 1, 1, 1, 1], sparse_col_indices=[3]
        )
        with pytest.raises(tinker.BadRequestError, match="--max-tensor-elements"):
            training.forward_backward([next_token_datum(ids, weights=[1.0] * n, extra=huge)], "cross_entropy").result(
                timeout=20
            )
    assert_still_serves(training, ids)


@pytest.mark.parametrize("rank", [65, 10**9])
def test_a_lora_rank_over_the_limit_is_refused_by_name(client: tinker.ServiceClient, rank: int) -> None:
    with pytest.raises(tinker.BadRequestError, match=rf"--max-lora-rank.*got {rank}"):
        client.create_lora_training_client(base_model=TINY, rank=rank).result(timeout=20)


def test_num_samples_over_the_limit_is_refused_by_name(client: tinker.ServiceClient, ids: list[int]) -> None:
    sampler = client.create_sampling_client(base_model=TINY).result()
    params = types.SamplingParams(max_tokens=2)
    with pytest.raises(tinker.BadRequestError, match=r"--max-num-samples.*asks for 17"):
        sampler.sample(types.ModelInput.from_ints(ids), num_samples=17, sampling_params=params).result(timeout=20)
    sample = sampler.sample(types.ModelInput.from_ints(ids), num_samples=16, sampling_params=params).result(timeout=30)
    assert len(sample.sequences) == 16


def recorded_futures(server: RunningServer) -> int:
    """Every future the server has recorded: a request that reached the sampler or the device queue has one."""
    return sum(server.service.ledger.counts_by_state().values())


def test_a_sample_past_the_context_is_a_400_to_the_request_not_a_failed_future(
    server: RunningServer, api: RawApi, client: tinker.ServiceClient, ids: list[int]
) -> None:
    # Two tokens of room: asking for three is refused when it is sent, asking for two is served.
    prompt = types.ModelInput.from_ints((ids * CONTEXT)[: CONTEXT - 2])
    request = types.SampleRequest(prompt=prompt, sampling_params=types.SamplingParams(max_tokens=3), base_model=TINY)
    recorded = recorded_futures(server)
    error = error_of(api.post("/asample", request), 400)
    assert f"prompt length {CONTEXT - 2} + max_tokens 3 = {CONTEXT + 1}" in error, error
    assert f"context length {CONTEXT}: ask for at most 2 tokens" in error, error
    assert recorded_futures(server) == recorded
    sampler = client.create_sampling_client(base_model=TINY).result()
    fits = sampler.sample(prompt, num_samples=1, sampling_params=types.SamplingParams(max_tokens=2)).result(timeout=60)
    assert len(fits.sequences[0].tokens) <= 2


@pytest.mark.parametrize(
    ("params", "prompt_ids", "problem"),
    [
        ({"temperature": -0.5}, None, "temperature must be a finite number >= 0, got -0.5"),
        ({"top_p": 1.5}, None, "top_p must be in (0, 1], got 1.5"),
        ({"top_k": -3}, None, "top_k must be -1 or 0 (no limit) or a positive count, got -3"),
        ({"max_tokens": 0}, None, "max_tokens must be at least 1, got 0"),
        ({}, [1, 10**9], "prompt_tokens[1] = 1000000000 is outside the vocabulary"),
        ({"stop": [10**9]}, None, "stop_token_ids[0] = 1000000000 is outside the vocabulary"),
    ],
    ids=["temperature", "top_p", "top_k", "max_tokens", "prompt id", "stop id"],
)
def test_a_sample_out_of_range_is_a_400_naming_the_field_before_it_is_queued(
    server: RunningServer, api: RawApi, ids: list[int], params: dict, prompt_ids: list[int] | None, problem: str
) -> None:
    prompt = types.ModelInput.from_ints(prompt_ids or ids[:4])
    sampling = types.SamplingParams(**{"max_tokens": 2, **params})
    request = types.SampleRequest(prompt=prompt, sampling_params=sampling, base_model=TINY)
    recorded = recorded_futures(server)
    error = error_of(api.post("/asample", request), 400)
    assert problem in error, error
    assert recorded_futures(server) == recorded


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route", ["completions", "chat"])
def test_an_openai_request_past_the_context_is_a_400_before_any_stream_starts(
    server: RunningServer, ids: list[int], route: str, stream: bool
) -> None:
    # A stream's status line goes out before the first token: refused after queueing, it was a 200 and an error event.
    oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=30)
    recorded = recorded_futures(server)
    with pytest.raises(
        openai.BadRequestError, match=rf"max_tokens {CONTEXT} = \d+ exceeds the model's context length"
    ) as refused:
        if route == "completions":
            oai.completions.create(model=TINY, prompt=ids, max_tokens=CONTEXT, stream=stream)
        else:
            messages = [{"role": "user", "content": "How many employees are there?"}]
            oai.chat.completions.create(model=TINY, messages=messages, max_tokens=CONTEXT, stream=stream)
    assert re.search(
        rf"prompt length \d+ \+ max_tokens {CONTEXT} = \d+ exceeds the model's context length {CONTEXT}\b",
        str(refused.value),
    )
    assert recorded_futures(server) == recorded


@pytest.mark.parametrize(
    ("route", "body", "field"),
    [
        ("/optim_step", {"seq_id": 2**70, "adam_params": {"learning_rate": 1e-3}}, "seq_id"),
        ("/save_weights", {"path": "far", "ttl_seconds": 10**12}, "ttl_seconds"),
        ("/save_weights", {"path": "inf", "ttl_seconds": math.inf}, "ttl_seconds"),
        ("/save_weights_for_sampler", {"path": "zero", "ttl_seconds": 0}, "ttl_seconds"),
    ],
)
def test_an_integer_out_of_range_is_a_400_naming_the_field(
    api: RawApi, training: tinker.TrainingClient, ids: list[int], route: str, body: dict, field: str
) -> None:
    # JSON cannot carry infinity; Python's encoder writes it as the literal the server must refuse.
    raw = json.dumps({"model_id": training.model_id, **body}).encode()
    error = error_of(api.post(route, raw), 400)
    assert field in error
    assert_still_serves(training, ids)


@pytest.mark.parametrize(("query", "field"), [("offset=1180591620717411303424", "offset"), ("limit=-1", "limit")])
def test_listing_parameters_out_of_range_are_a_400_in_the_servers_error_shape(
    api: RawApi, query: str, field: str
) -> None:
    reply = api.http.get(f"/training_runs?{query}")
    assert field in error_of(reply, 400) and reply.json()["category"] == "user"


def test_a_header_too_large_to_parse_is_refused_in_the_same_error_shape(api: RawApi) -> None:
    """uvicorn refuses it before the app sees it; a 1 MB header was a plain-text 400 before."""
    reply = api.http.get("/healthz", headers={"X-Padding": "x" * (1 << 20)})
    assert "16 KiB" in error_of(reply, 400) and reply.json()["category"] == "user"
    assert api.http.get("/healthz").status_code == 200


def test_an_unknown_route_answers_in_the_same_error_shape(api: RawApi) -> None:
    reply = api.http.get("/no_such_route")
    assert error_of(reply, 404) == "Not Found" and reply.json()["category"] == "user"


def test_a_damaged_checkpoint_record_breaks_no_listing(server: RunningServer, training: tinker.TrainingClient) -> None:
    saved = training.save_state("kept").result(timeout=30).path
    with tinker.ServiceClient(base_url=server.url, api_key=OTHER_KEY) as other:
        other_run = other.create_lora_training_client(base_model=TINY, rank=4).result(timeout=20)
        other_saved = other_run.save_state("theirs").result(timeout=30).path
        damage_the_store(Path(server.service.config.storage_root))
        theirs = tinker.RestClient(base_url=server.url, api_key=OTHER_KEY).list_user_checkpoints().result().checkpoints
    assert [c.tinker_path for c in theirs] == [other_saved]
    rest = tinker.RestClient(base_url=server.url, api_key=KEY)
    mine = rest.list_user_checkpoints().result().checkpoints
    assert [c.tinker_path for c in mine] == [saved] and mine[0].expires_at is not None
    runs = rest.list_training_runs().result().training_runs
    assert training.model_id in [run.training_run_id for run in runs]


def damage_the_store(storage_root: Path) -> None:
    """What a store written before TTLs were bounded may hold: an expiry in the year 33715, and a file cut short."""
    (folder,) = storage_root.glob("checkpoints/runs/*/weights/kept")
    metadata = folder / "checkpoint.json"
    metadata.write_text(json.dumps({**json.loads(metadata.read_text()), "expires_at": 1e12}))
    damaged = folder.parent / "cut"
    damaged.mkdir()
    (damaged / "checkpoint.json").write_text('{"path": "tinker://')


def test_plain_httpx_sees_json_for_every_refusal(server: RunningServer) -> None:
    reply = httpx.post(f"{server.url}/api/v1/optim_step", content=b"{}", headers={"X-API-Key": "tml-nobody-knows"})
    assert reply.status_code == 401 and reply.json()["category"] == "user"
