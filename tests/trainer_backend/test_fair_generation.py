"""Generation batches bounded by tokens, shared fairly: a tenant's big evaluation does not hold another tenant's
requests until its queue drains.

A real server of the tiny model whose generation batch holds eight of tenant A's requests (`--max-generation-batch-
tokens`). A sends 64 requests at once, then B sends two: B's are answered before most of A's. And B's request does
not even wait for A's running generation to end: it runs in one of its pauses. Two runs of one key (a study's
trials) share it as two keys do.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import tinker
from support.backends import TINY, tiny_server_config
from support.trainer import RawApi, request_id_of, status_of
from tinker import types

from trainer_backend.server import RunningServer, running_server

PROMPT = types.ModelInput.from_ints([5, 9, 14])
# stop=[]: every row runs its full length, so a batch's time does not depend on when the random model says EOS.
LONG = types.SamplingParams(max_tokens=64, temperature=1.0, stop=[])
ROWS_OF_A_PER_BATCH = 8
# The results of one device call are recorded within about 10 ms of each other; a later call ends far later.
SAME_CALL_S = 0.1


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tokens_per_row = PROMPT.length + LONG.max_tokens
    config = tiny_server_config(
        tmp_path_factory.mktemp("fair"), max_generation_batch_tokens=ROWS_OF_A_PER_BATCH * tokens_per_row
    )
    with running_server(config) as running:
        yield running


def test_a_tenants_requests_are_served_before_another_tenants_deep_queue_drains(server: RunningServer) -> None:
    api_a, api_b = RawApi(server.url, "tml-fair-tenant-a"), RawApi(server.url, "tml-fair-tenant-b")

    def sample(api: RawApi, num_samples: int) -> str:
        request = types.SampleRequest(num_samples=num_samples, prompt=PROMPT, sampling_params=LONG, base_model=TINY)
        return request_id_of(api.post("/asample", request))

    a_requests = [sample(api_a, 1) for _ in range(64)]
    b_requests = [sample(api_b, 4) for _ in range(2)]
    for api, requests in ((api_b, b_requests), (api_a, a_requests)):
        for request_id in requests:
            assert api.result(request_id, timeout=120).status_code == 200

    a_done = [server.service.ledger.get(request_id).updated_at for request_id in a_requests]
    b_done = max(server.service.ledger.get(request_id).updated_at for request_id in b_requests)
    # Without the bound and the turns, B's requests ran in one device call with the rest of A's queue and were
    # recorded within milliseconds of its last; now A's queue drains over batches of eight that run after B's.
    later = sum(done > b_done + SAME_CALL_S for done in a_done)
    assert later >= 2 * ROWS_OF_A_PER_BATCH, f"only {later} of A's 64 requests ran after B's"


def test_a_tenants_request_runs_inside_another_tenants_long_generation(server: RunningServer) -> None:
    key_a, key_b = "tml-nest-tenant-a", "tml-nest-tenant-b"
    with (
        tinker.ServiceClient(base_url=server.url, api_key=key_a) as client_a,
        tinker.ServiceClient(base_url=server.url, api_key=key_b) as client_b,
    ):
        very_long = types.SamplingParams(max_tokens=400, temperature=1.0, stop=[])
        a_future = client_a.create_sampling_client(base_model=TINY).result().sample(PROMPT, 1, very_long)
        deadline = time.monotonic() + 30
        while "sample" not in status_of(server, key_a)["device"]["running_kinds"]:
            assert time.monotonic() < deadline, "A's generation never started"
            time.sleep(0.02)

        short = types.SamplingParams(max_tokens=8, temperature=1.0, stop=[])
        b_result = client_b.create_sampling_client(base_model=TINY).result().sample(PROMPT, 4, short).result()
        assert [len(sequence.tokens) for sequence in b_result.sequences] == [8] * 4
        # B's answer came while A's generation was still running.
        running = [f for f in status_of(server, key_a)["in_flight"] if f["kind"] == "sample"]
        assert running and running[0]["state"] == "running"
        assert len(a_future.result().sequences[0].tokens) == 400


def test_a_runs_request_is_not_held_behind_another_run_of_the_same_key(server: RunningServer) -> None:
    """A study's trials run under one key: each trial's samples of its own weights count to its run, and a run waits
    for another run of its key no longer than for another key's (the bound: a pause of the running generation)."""
    key = "tml-fair-one-key"
    with tinker.ServiceClient(base_url=server.url, api_key=key) as client:
        runs = [client.create_lora_training_client(base_model=TINY, rank=4) for _ in range(2)]
        run_a, run_b = (run.result() for run in runs)
        sampler_a = run_a.save_weights_and_get_sampling_client(name="run-a")
        sampler_b = run_b.save_weights_and_get_sampling_client(name="run-b")
        very_long = types.SamplingParams(max_tokens=400, temperature=1.0, stop=[])
        a_future = sampler_a.sample(PROMPT, 1, very_long)
        deadline = time.monotonic() + 30
        while "sample" not in status_of(server, key)["device"]["running_kinds"]:
            assert time.monotonic() < deadline, "run A's generation never started"
            time.sleep(0.02)

        short = types.SamplingParams(max_tokens=8, temperature=1.0, stop=[])
        b_result = sampler_b.sample(PROMPT, 4, short).result()
        assert [len(sequence.tokens) for sequence in b_result.sequences] == [8] * 4
        # Run B's answer came while run A's generation, of the same key, was still running.
        running = [f for f in status_of(server, key)["in_flight"] if f["kind"] == "sample"]
        assert running and running[0]["state"] == "running"
        assert len(a_future.result().sequences[0].tokens) == 400
