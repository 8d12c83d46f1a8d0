"""What one API key may hold: its checkpoints' bytes (`--max-storage-bytes-per-key`), its queued operations
(`--max-queued-per-key`), and how many checkpoints each run keeps (`keep_checkpoints`, `--keep-checkpoints-per-run`).

Through the SDK against real servers: on one with quotas, A fills its storage quota, B's saves and samples still
succeed, A deletes a checkpoint and saves again; C fills its queue and is told to back off while B is served. On one
without quotas, runs keep what they ask for.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import tinker
from support.backends import TINY, tiny_server_config
from support.commands import run_command
from support.trainer import RawApi, error_of, request_id_of, status_of
from tinker import types

from trainer_backend.ledger import FutureState
from trainer_backend.server import RunningServer, running_server

KEY_A, KEY_B, KEY_C = "tml-quota-tenant-a", "tml-quota-tenant-b", "tml-quota-tenant-c"
# Room for two and a half of the tiny model's rank-4 sampler checkpoints.
CHECKPOINTS_IN_QUOTA = 2.5
MAX_QUEUED_PER_KEY = 2
KEEP_BY_DEFAULT = 3
GREEDY = types.SamplingParams(max_tokens=4, temperature=0.0)
PROMPT = types.ModelInput.from_ints([5, 9, 14])


def sample_request(params: types.SamplingParams = GREEDY, **weights: str) -> types.SampleRequest:
    return types.SampleRequest(num_samples=1, prompt=PROMPT, sampling_params=params, **weights)


@pytest.fixture(scope="module")
def retaining_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    config = tiny_server_config(tmp_path_factory.mktemp("retention"), keep_checkpoints_per_run=KEEP_BY_DEFAULT)
    with running_server(config) as running:
        yield running


@pytest.fixture(scope="module")
def checkpoint_bytes(retaining_server: RunningServer) -> int:
    """The bytes of one rank-4 sampler checkpoint of the tiny model, as the server counts them."""
    key = "tml-quota-measures"
    with tinker.ServiceClient(base_url=retaining_server.url, api_key=key) as client:
        training = client.create_lora_training_client(base_model=TINY, rank=4, seed=0).result()
        training.save_weights_for_sampler("one").result()
    return status_of(retaining_server, key)["usage"]["storage_bytes"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, checkpoint_bytes: int) -> Iterator[RunningServer]:
    config = tiny_server_config(
        tmp_path_factory.mktemp("quotas"),
        api_keys=[KEY_A, KEY_B, KEY_C],
        max_storage_bytes_per_key=int(CHECKPOINTS_IN_QUOTA * checkpoint_bytes),
        max_queued_per_key=MAX_QUEUED_PER_KEY,
    )
    with running_server(config) as running:
        yield running


def test_a_key_past_its_storage_quota_cannot_save_while_others_can(
    server: RunningServer, checkpoint_bytes: int
) -> None:
    limit = int(CHECKPOINTS_IN_QUOTA * checkpoint_bytes)
    with (
        tinker.ServiceClient(base_url=server.url, api_key=KEY_A) as client_a,
        tinker.ServiceClient(base_url=server.url, api_key=KEY_B) as client_b,
    ):
        training_a = client_a.create_lora_training_client(base_model=TINY, rank=4, seed=1).result()
        first = training_a.save_weights_for_sampler("first").result().path
        training_a.save_weights_for_sampler("second").result()
        with pytest.raises(tinker.RequestFailedError) as refused:
            training_a.save_weights_for_sampler("third").result()
        message = str(refused.value)
        assert "--max-storage-bytes-per-key" in message and f"{limit:,}" in message, message
        assert f"{2 * checkpoint_bytes:,}" in message, message  # what the key uses now
        usage = status_of(server, KEY_A)["usage"]
        assert {key: usage[key] for key in ("queued", "max_queued", "storage_bytes", "max_storage_bytes")} == {
            "queued": 0,
            "max_queued": MAX_QUEUED_PER_KEY,
            "storage_bytes": 2 * checkpoint_bytes,
            "max_storage_bytes": limit,
        }

        # Nothing A saved was touched, the refused save left nothing behind, and A's client goes on.
        rest_a = tinker.RestClient(base_url=server.url, api_key=KEY_A)
        names = [c.checkpoint_id for c in rest_a.list_checkpoints(training_a.model_id).result().checkpoints]
        assert sorted(names) == ["sampler_weights/first", "sampler_weights/second"]
        sampled = client_a.create_sampling_client(model_path=first).result().sample(PROMPT, 1, GREEDY).result()
        assert len(sampled.sequences[0].tokens) == 4

        # B is not held back by A's quota.
        training_b = client_b.create_lora_training_client(base_model=TINY, rank=4, seed=2).result()
        path_b = training_b.save_weights_for_sampler("b").result().path
        assert client_b.create_sampling_client(model_path=path_b).result().sample(PROMPT, 1, GREEDY).result().sequences

        # A frees room and saves again.
        rest_a.delete_checkpoint_from_tinker_path(first).result()
        third = training_a.save_weights_for_sampler("third").result().path
        assert client_a.create_sampling_client(model_path=third).result().sample(PROMPT, 1, GREEDY).result().sequences
        assert status_of(server, KEY_A)["usage"]["storage_bytes"] == 2 * checkpoint_bytes


def test_a_key_with_a_full_queue_backs_off_while_others_are_served(server: RunningServer) -> None:
    api_c = RawApi(server.url, KEY_C)
    with tinker.ServiceClient(base_url=server.url, api_key=KEY_C) as client_c:
        training_c = client_c.create_lora_training_client(base_model=TINY, rank=4, seed=3).result()
    # Requests past a seq_id that never comes wait in the queue (until the gap times out).
    datum = types.Datum(model_input=PROMPT, loss_fn_inputs={"target_tokens": [9, 14, 2]})
    for seq_id in range(50, 50 + MAX_QUEUED_PER_KEY):
        request_id_of(api_c.forward_backward(training_c.model_id, seq_id, [datum]))
    refused = error_of(api_c.forward_backward(training_c.model_id, 50 + MAX_QUEUED_PER_KEY, [datum]), 429)
    assert "--max-queued-per-key" in refused and f"{MAX_QUEUED_PER_KEY} operations queued" in refused
    assert status_of(server, KEY_C)["usage"]["queued"] == MAX_QUEUED_PER_KEY

    with tinker.ServiceClient(base_url=server.url, api_key=KEY_B) as client_b:
        sampler = client_b.create_sampling_client(base_model=TINY).result()
        assert len(sampler.sample(PROMPT, 2, GREEDY).result().sequences) == 2
    # C's other requests are refused too, not only that model's.
    refused = error_of(api_c.post("/asample", sample_request(base_model=TINY)), 429)
    assert "--max-queued-per-key" in refused


def test_a_run_keeps_the_checkpoints_it_asks_for(retaining_server: RunningServer) -> None:
    with tinker.ServiceClient(base_url=retaining_server.url, api_key=KEY_B) as client:
        keeps_two = client.create_lora_training_client(
            base_model=TINY, rank=4, seed=4, user_metadata={"keep_checkpoints": "2"}
        ).result()
        by_default = client.create_lora_training_client(base_model=TINY, rank=4, seed=5).result()
        for step in range(5):
            keeps_two.save_state(f"state-{step}").result()
            by_default.save_state(f"state-{step}").result()
        keeps_two.save_weights_for_sampler("sampler-0").result()
        rest = tinker.RestClient(base_url=retaining_server.url, api_key=KEY_B)

        def names(training: tinker.TrainingClient) -> list[str]:
            listed = rest.list_checkpoints(training.model_id).result().checkpoints
            return sorted(c.checkpoint_id for c in listed)

        # Each kind keeps its own most recent ones: the sampler save removed no training state.
        assert names(keeps_two) == ["sampler_weights/sampler-0", "weights/state-3", "weights/state-4"]
        assert names(by_default) == [f"weights/state-{step}" for step in (2, 3, 4)]
        # The latest state loads.
        resumed = client.create_training_client_from_state(f"tinker://{keeps_two.model_id}/weights/state-4").result()
        assert resumed.model_id != keeps_two.model_id


def test_retention_never_removes_weights_a_queued_request_reads(retaining_server: RunningServer) -> None:
    server = retaining_server
    api_b = RawApi(server.url, KEY_B)
    with tinker.ServiceClient(base_url=server.url, api_key=KEY_B) as client:
        training = client.create_lora_training_client(
            base_model=TINY, rank=4, seed=6, user_metadata={"keep_checkpoints": "1"}
        ).result()
        first = training.save_weights_for_sampler("first").result().path
        # A long generation of the run's first weights holds the device; a request of the same run for the next
        # weights queues behind it (a run's requests neither join its running generation nor nest in its pauses).
        long_one = request_id_of(
            api_b.post("/asample", sample_request(types.SamplingParams(max_tokens=2000, stop=[]), model_path=first))
        )
        deadline = time.monotonic() + 10
        while long_one not in server.service.scheduler.stats().running and time.monotonic() < deadline:
            time.sleep(0.005)
        oldest = training.save_weights_for_sampler("oldest").result().path
        queued = request_id_of(api_b.post("/asample", sample_request(model_path=oldest)))
        rest = tinker.RestClient(base_url=server.url, api_key=KEY_B)

        def names() -> list[str]:
            return sorted(c.checkpoint_id for c in rest.list_checkpoints(training.model_id).result().checkpoints)

        # Saves run while the generation pauses; the weights the running and the queued request read stay.
        training.save_weights_for_sampler("newer").result()
        assert server.service.ledger.get(queued).state is FutureState.QUEUED, "the generation ended too soon"
        assert names() == ["sampler_weights/first", "sampler_weights/newer", "sampler_weights/oldest"]
        assert api_b.result(queued, timeout=120).status_code == 200
        assert api_b.result(long_one, timeout=60).status_code == 200
        # Once nothing reads them, the next save removes them.
        training.save_weights_for_sampler("newest").result()
        assert names() == ["sampler_weights/newest"]


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_a_run_asking_to_keep_fewer_than_one_checkpoint_is_refused(retaining_server: RunningServer, value: str) -> None:
    refused = pytest.raises(tinker.BadRequestError, match="keep_checkpoints must be a whole number of at least 1")
    with tinker.ServiceClient(base_url=retaining_server.url, api_key=KEY_B) as client, refused:
        client.create_lora_training_client(base_model=TINY, rank=4, user_metadata={"keep_checkpoints": value}).result()


@pytest.mark.parametrize(
    "flag",
    [
        "--max-queued-per-key",
        "--max-storage-bytes-per-key",
        "--keep-checkpoints-per-run",
        "--max-training-activation-bytes",
    ],
)
def test_a_limit_below_one_is_refused_at_start_up(flag: str, tmp_path: Path) -> None:
    result = run_command(
        "trainer_backend", "serve", "--base-model", TINY, "--storage-root", str(tmp_path), flag, "0", timeout_s=120
    )
    assert result.returncode == 1, result.stderr
    assert f"error: {flag}" in result.stderr and "greater than or equal to 1" in result.stderr, result.stderr
