"""Two tenants together never take longer than one after the other: another tenant's RL step shares a long
generation's decode steps instead of adding its own.

A real server of a tiny model on loopback and the real SDK. Tenant A samples one long generation (an evaluation's
batch); tenant B runs an RL step (4 prompts x 4 completions, then forward_backward and optim_step) on its adapter,
first each alone, then B's step while A's generation runs. The device's work is counted, not timed: every decode step
is one forward of the model over its running rows, so the steps and their rows say what the device did, whatever else
loads the machine. Together the rows are the same and the steps fewer (B's rows rode A's steps), so the device did
less; and B's samples came back while A's generation still ran: B did not wait for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import tinker
from support.backends import tiny_server_config
from support.trainer import status_of
from tinker import types

from trainer_backend.auth import owner_of_key
from trainer_backend.server import RunningServer, running_server

# No sliding window, so a generation of any length can take other rows in (Gemma's keeps only what fits its window).
MODEL = "tiny-qwen2"
LONG = types.SamplingParams(max_tokens=200, temperature=1.0, stop=[])
SHORT = types.SamplingParams(max_tokens=16, temperature=1.0, stop=[])
A_PROMPT = types.ModelInput.from_ints([5, 9, 14])
B_PROMPTS = [types.ModelInput.from_ints([7 + i, 3, 11, 2 + i]) for i in range(4)]


@dataclass
class DecodeSteps:
    """The device's decode steps (forwards of one new token per running row) and the rows they ran."""

    steps: int = 0
    rows: int = 0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tiny_server_config(tmp_path_factory.mktemp("sharing"), base_model=MODEL)) as running:
        yield running


@pytest.fixture
def decode_steps(server: RunningServer) -> Iterator[DecodeSteps]:
    counted = DecodeSteps()

    def count(_module: object, _args: tuple, kwargs: dict) -> None:
        tokens = kwargs.get("input_ids")
        if tokens is not None and tokens.shape[1] == 1:
            counted.steps += 1
            counted.rows += tokens.shape[0]

    handle = server.service.loaded.model.model.register_forward_pre_hook(count, with_kwargs=True)
    yield counted
    handle.remove()


def rl_step(training: tinker.TrainingClient, sampler: tinker.SamplingClient) -> None:
    """B's step: sample a group per prompt, then train on what came back."""
    futures = [sampler.sample(prompt, 4, SHORT) for prompt in B_PROMPTS]
    datums = [
        types.Datum(
            model_input=types.ModelInput.from_ints(prompt.to_ints() + list(sequence.tokens[:-1])),
            loss_fn_inputs={
                "target_tokens": prompt.to_ints()[1:] + list(sequence.tokens),
                "weights": [0.0] * (prompt.length - 1) + [1.0] * len(sequence.tokens),
            },
        )
        for prompt, future in zip(B_PROMPTS, futures, strict=True)
        for sequence in future.result().sequences
    ]
    training.forward_backward(datums, "cross_entropy").result()
    training.optim_step(types.AdamParams(learning_rate=1e-3)).result()


@pytest.mark.slow
def test_two_tenants_together_never_take_longer_than_one_after_the_other(
    server: RunningServer, decode_steps: DecodeSteps
) -> None:
    key_a, key_b = "tml-sharing-tenant-a", "tml-sharing-tenant-b"
    with (
        tinker.ServiceClient(base_url=server.url, api_key=key_a) as client_a,
        tinker.ServiceClient(base_url=server.url, api_key=key_b) as client_b,
    ):
        sampler_a = client_a.create_sampling_client(base_model=MODEL).result()
        training = client_b.create_lora_training_client(base_model=MODEL, rank=4, seed=0).result()
        sampler_b = training.save_weights_and_get_sampling_client().result()

        sampler_a.sample(A_PROMPT, 1, LONG).result()
        rl_step(training, sampler_b)
        alone = DecodeSteps(decode_steps.steps, decode_steps.rows)

        decode_steps.steps = decode_steps.rows = 0
        finished: list[str] = []
        server.service.ledger.add_listener(
            lambda record: finished.append(record.owner) if record.kind == "sample" else None
        )
        a_future = sampler_a.sample(A_PROMPT, 1, LONG)
        deadline = time.monotonic() + 30
        while "sample" not in status_of(server, key_a)["device"]["running_kinds"]:
            assert time.monotonic() < deadline, "A's generation never started"
            time.sleep(0.01)
        b_step = threading.Thread(target=rl_step, args=(training, sampler_b))
        b_step.start()
        assert len(a_future.result().sequences[0].tokens) == LONG.max_tokens
        b_step.join(timeout=60)
        together = DecodeSteps(decode_steps.steps, decode_steps.rows)

    # B's samples came back before A's generation ended: each request's result is recorded as soon as it is done.
    assert finished[:5] == [owner_of_key(key_b)] * 4 + [owner_of_key(key_a)]
    # The same work: A's row for 199 steps after its prefill, B's 16 rows for 15.
    assert together.rows == alone.rows == (LONG.max_tokens - 1) + 16 * (SHORT.max_tokens - 1)
    # In fewer device calls: B's rows took A's steps (with nested batches B's steps were added to A's, as alone).
    assert together.steps == alone.steps - (SHORT.max_tokens - 1)
