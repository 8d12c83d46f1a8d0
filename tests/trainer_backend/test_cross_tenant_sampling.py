"""Sampling requests of several tenants and weights, queued together, run as one generation batch and get the
answers each would get alone."""

from __future__ import annotations

import tinker
from conftest import LOGPROB_ROUNDING, TINY, datum_for
from tinker import types

from trainer_backend.server import RunningServer


def trained_sampler(service_client: tinker.ServiceClient, text: str, seed: int) -> tinker.SamplingClient:
    training = service_client.create_lora_training_client(base_model=TINY, rank=4, seed=seed)
    tokenizer = training.get_tokenizer()
    for _ in range(2):
        training.forward_backward([datum_for(tokenizer, text)], "cross_entropy").result()
        training.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    return training.save_weights_and_get_sampling_client()


def test_queued_samples_of_several_weights_batch_and_match_their_answers_alone(
    server: RunningServer, service_client: tinker.ServiceClient
) -> None:
    samplers = [
        trained_sampler(service_client, "select name from airlines where country = 'Peru'", seed=1),
        trained_sampler(service_client, "how many hotels are there in Austin and Seoul", seed=2),
        service_client.create_sampling_client(base_model=TINY),
    ]
    prompts = [types.ModelInput.from_ints(ids) for ids in ([5, 9, 14], [7, 3, 22, 41, 8, 2], [11])]
    greedy = types.SamplingParams(max_tokens=12, temperature=0.0)
    seeded = types.SamplingParams(max_tokens=10, temperature=0.9, seed=21)
    requests = [(s, p, params) for s in samplers for p in prompts for params in (greedy, seeded)]

    alone = [s.sample(prompt=p, num_samples=2, sampling_params=params).result() for s, p, params in requests]
    batches_before = server.service.scheduler.stats().batched_operations
    # A long request first keeps the device busy while the others queue behind it.
    long_params = types.SamplingParams(max_tokens=400)
    long_one = samplers[2].sample(prompt=prompts[0], num_samples=1, sampling_params=long_params)
    futures = [s.sample(prompt=p, num_samples=2, sampling_params=params) for s, p, params in requests]
    together = [future.result() for future in futures]
    long_one.result()

    assert server.service.scheduler.stats().batched_operations - batches_before >= 2
    for one, other in zip(alone, together, strict=True):
        assert [s.tokens for s in one.sequences] == [s.tokens for s in other.sequences]
        for a, b in zip(one.sequences, other.sequences, strict=True):
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < LOGPROB_ROUNDING
    # The weights differ, so the batch really mixed adapters: greedy answers to one prompt are not all the same.
    assert len({tuple(together[i * 6].sequences[0].tokens) for i in range(3)}) > 1
