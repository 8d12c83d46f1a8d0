"""Per-tenant series in /metrics and the caller's usage in its status, through the SDK against real servers.

Two keys train and sample; /metrics shows each under its hashed label with the device time it took and the tokens
it sampled and trained, never a key, and each key's status names its label and its runs. On a server that names two
tenants, four keys' series are the two busiest and "other", which sums the rest.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import tinker
from prometheus_client.parser import text_string_to_metric_families
from support.backends import TINY, tiny_server_config
from support.trainer import status_of
from tinker import types

from trainer_backend.auth import owner_of_key
from trainer_backend.server import RunningServer, running_server
from trainer_backend.tenant_usage import OTHER_TENANTS, tenant_label

KEY_A, KEY_B = "tml-metrics-tenant-a", "tml-metrics-tenant-b"
PROMPT = types.ModelInput.from_ints([5, 9, 14, 3])
TENANT_FAMILIES = (
    "trainer_tenant_device_seconds",
    "trainer_tenant_tokens",
    "trainer_tenant_queued_operations",
    "trainer_tenant_storage_bytes",
)


@dataclass(frozen=True)
class Work:
    """What one key did: the tokens its samples generated and its training passes took, its run and checkpoints."""

    sampled: int
    trained: int
    model_id: str | None = None


def sampled_tokens(response: types.SampleResponse) -> int:
    return sum(len(sequence.tokens) for sequence in response.sequences)


def train_and_sample(client: tinker.ServiceClient, trial: str, steps: int) -> Work:
    """A small RL-like loop on a run tagged with `trial`: forward_backward, optim_step, save, sample its weights, and
    sample the base model through the same client session (as a KL penalty's reference does)."""
    training = client.create_lora_training_client(
        base_model=TINY, rank=4, seed=0, user_metadata={"trial": trial}
    ).result()
    reference = client.create_sampling_client(base_model=TINY).result()
    datum = types.Datum(model_input=PROMPT, loss_fn_inputs={"target_tokens": [9, 14, 3, 2]})
    sampled = 0
    params = types.SamplingParams(max_tokens=12, temperature=1.0, stop=[])
    for _ in range(steps):
        training.forward_backward([datum], "cross_entropy").result()
        training.optim_step(types.AdamParams(learning_rate=1e-3)).result()
        sampler = training.save_weights_and_get_sampling_client().result()
        sampled += sampled_tokens(sampler.sample(PROMPT, 2, params).result())
        sampled += sampled_tokens(reference.sample(PROMPT, 1, params).result())
    return Work(sampled=sampled, trained=steps * PROMPT.length, model_id=training.model_id)


def sample_base(client: tinker.ServiceClient, max_tokens: int, num_samples: int = 1) -> Work:
    sampler = client.create_sampling_client(base_model=TINY).result()
    params = types.SamplingParams(max_tokens=max_tokens, temperature=1.0, stop=[])
    return Work(sampled=sampled_tokens(sampler.sample(PROMPT, num_samples, params).result()), trained=0)


def scrape(server: RunningServer) -> tuple[str, dict[str, dict[tuple[str, ...], float]]]:
    """The /metrics text, and the tenant families' samples by name and labels (tenant first, then phase)."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    samples: dict[str, dict[tuple[str, ...], float]] = defaultdict(dict)
    for family in text_string_to_metric_families(text):
        if family.name in TENANT_FAMILIES:
            for sample in family.samples:
                labels = (sample.labels["tenant"], *([sample.labels["phase"]] if "phase" in sample.labels else []))
                samples[sample.name][labels] = sample.value
    return text, samples


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tiny_server_config(tmp_path_factory.mktemp("tenant-metrics"), api_keys=[KEY_A, KEY_B])) as up:
        yield up


@pytest.fixture(scope="module")
def work(server: RunningServer) -> dict[str, Work]:
    with (
        tinker.ServiceClient(base_url=server.url, api_key=KEY_A) as client_a,
        tinker.ServiceClient(base_url=server.url, api_key=KEY_B) as client_b,
    ):
        return {KEY_A: train_and_sample(client_a, "study-0001", steps=2), KEY_B: sample_base(client_b, max_tokens=8)}


def test_each_key_has_its_series_under_its_hashed_label(server: RunningServer, work: dict[str, Work]) -> None:
    _, samples = scrape(server)
    for key, done in work.items():
        label = tenant_label(owner_of_key(key))
        assert samples["trainer_tenant_device_seconds_total"][(label,)] > 0
        assert samples["trainer_tenant_tokens_total"][(label, "sampled")] == done.sampled
        assert samples["trainer_tenant_tokens_total"][(label, "trained")] == done.trained
        assert samples["trainer_tenant_queued_operations"][(label,)] == 0
    # A's sampler weights are saved checkpoints; B saved none.
    assert samples["trainer_tenant_storage_bytes"][(tenant_label(owner_of_key(KEY_A)),)] > 0
    assert samples["trainer_tenant_storage_bytes"][(tenant_label(owner_of_key(KEY_B)),)] == 0
    assert samples["trainer_tenant_device_seconds_total"][(OTHER_TENANTS,)] == 0


def test_metrics_name_no_key_and_no_owner_id(server: RunningServer, work: dict[str, Work]) -> None:
    text, _ = scrape(server)
    for key in work:
        assert key not in text and key.removeprefix("tml-") not in text
        assert owner_of_key(key) not in text and owner_of_key(key).removeprefix("key-")[:12] not in text


def test_the_status_shows_the_caller_its_label_usage_and_runs(server: RunningServer, work: dict[str, Work]) -> None:
    _, samples = scrape(server)
    usage = status_of(server, KEY_A)["usage"]
    label = tenant_label(owner_of_key(KEY_A))
    assert usage["tenant"] == label
    assert usage["device_seconds"] == pytest.approx(samples["trainer_tenant_device_seconds_total"][(label,)], abs=1e-3)
    assert (usage["tokens_sampled"], usage["tokens_trained"]) == (work[KEY_A].sampled, work[KEY_A].trained)

    [run] = status_of(server, KEY_A)["runs"]
    assert run["model_id"] == work[KEY_A].model_id and run["user_metadata"] == {"trial": "study-0001"}
    # Sampling its own sampler weights counts toward the run, and so does sampling the base model through the client
    # session that trains it (a study's trials, all of one key, share the device by run).
    assert (run["tokens_sampled"], run["tokens_trained"]) == (work[KEY_A].sampled, work[KEY_A].trained)
    assert 0 < run["device_seconds"] <= usage["device_seconds"] and 0 < run["device_share_1m"] <= 1
    # B sampled only the base model, from a session that trains nothing: its own time, no run.
    b = status_of(server, KEY_B)
    assert b["usage"]["device_seconds"] > 0 and b["runs"] == []


def test_a_run_with_metadata_too_large_to_keep_is_refused(server: RunningServer) -> None:
    refused = pytest.raises(tinker.BadRequestError, match=r"user_metadata takes .* more than the 4,096")
    with tinker.ServiceClient(base_url=server.url, api_key=KEY_B) as client, refused:
        client.create_lora_training_client(base_model=TINY, rank=4, user_metadata={"notes": "x" * 5000}).result()


def test_tenants_past_the_top_are_summed_as_other(tmp_path_factory: pytest.TempPathFactory) -> None:
    config = tiny_server_config(tmp_path_factory.mktemp("top-tenants"), metrics_top_tenants=2)
    keys = [f"tml-metrics-top-{n}" for n in range(4)]
    with running_server(config) as server:
        # The first two keys generate far more than the last two, so they are the busiest.
        for key, (max_tokens, num_samples) in zip(keys, [(48, 4), (48, 2), (1, 1), (1, 1)], strict=True):
            with tinker.ServiceClient(base_url=server.url, api_key=key) as client:
                sample_base(client, max_tokens, num_samples)
        _, samples = scrape(server)
        usage = {key: status_of(server, key)["usage"] for key in keys}

    for family in samples.values():
        assert {labels[0] for labels in family} == {usage[keys[0]]["tenant"], usage[keys[1]]["tenant"], OTHER_TENANTS}
    device = samples["trainer_tenant_device_seconds_total"]
    tokens = samples["trainer_tenant_tokens_total"]
    for key in keys[:2]:
        assert device[(usage[key]["tenant"],)] == pytest.approx(usage[key]["device_seconds"], abs=1e-3)
    rest = keys[2:]
    assert device[(OTHER_TENANTS,)] == pytest.approx(sum(usage[k]["device_seconds"] for k in rest), abs=1e-2)
    assert tokens[(OTHER_TENANTS, "sampled")] == sum(usage[k]["tokens_sampled"] for k in rest) == 2
