"""What survives a restart: checkpoints stay listed and loadable, futures cut off by the stop fail with a reason,
and a model whose live weights died with the old process says how to resume."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import tinker
from support.backends import tiny_server_config
from support.trained_adapters import trained_adapter
from support.trainer import SQL, RawApi, error_of, next_token_datum, request_id_of
from tinker import types

from trainer_backend.ledger import FutureState, Ledger, ResultFormat
from trainer_backend.operations import Operation
from trainer_backend.scheduler import Scheduler
from trainer_backend.server import running_server
from trainer_backend.service import RESTART_REASON

KEY = "tml-restart"
# Far past anything the training client sends: a request with this seq_id waits for the ones before it.
STRANDED_SEQ_ID = 1000


def test_checkpoints_survive_a_restart_and_cut_off_futures_fail_with_a_reason(tmp_path: Path) -> None:
    """The cut-off future is a real request, accepted over HTTP with a seq_id after a gap: it waits for the seq_ids
    before it, so it is still queued, deterministically, when the server stops."""
    greedy = types.SamplingParams(max_tokens=6, temperature=0.0)
    with (
        running_server(tiny_server_config(tmp_path)) as first,
        tinker.ServiceClient(base_url=first.url, api_key=KEY) as client,
    ):
        training = trained_adapter(client, SQL, seed=3, steps=1)
        ids = training.get_tokenizer().encode(SQL)
        datum = next_token_datum(ids)
        state_path = training.save_state("kept").result().path
        sampler_path = training.save_weights_for_sampler("kept-sampler").result().path
        logprobs = training.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
        prompt = types.ModelInput.from_ints(ids[:4])
        sampler = client.create_sampling_client(model_path=sampler_path).result()
        sampled = sampler.sample(prompt=prompt, num_samples=1, sampling_params=greedy).result().sequences[0].tokens
        stranded = request_id_of(
            RawApi(first.url, KEY).forward_backward(training.model_id, STRANDED_SEQ_ID, [datum], forward_only=True)
        )
        assert first.service.ledger.get(stranded).state is FutureState.QUEUED

    with (
        running_server(tiny_server_config(tmp_path)) as second,
        tinker.ServiceClient(base_url=second.url, api_key=KEY) as client,
    ):
        rest = tinker.RestClient(base_url=second.url, api_key=KEY)
        listed = {c.tinker_path for c in rest.list_checkpoints(training.model_id).result().checkpoints}
        assert {state_path, sampler_path} <= listed

        restored = client.create_training_client_from_state(state_path).result()
        after = restored.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
        assert after == pytest.approx(logprobs, abs=1e-6)
        restored.forward_backward([datum], "cross_entropy")
        restored.optim_step(types.AdamParams(learning_rate=1e-2)).result()

        sampler = client.create_sampling_client(model_path=sampler_path).result()
        assert (
            sampler.sample(prompt=prompt, num_samples=1, sampling_params=greedy).result().sequences[0].tokens == sampled
        )

        api = RawApi(second.url, KEY)
        failed = api.result(stranded)
        assert failed.status_code == 200
        assert failed.json() == {"error": RESTART_REASON, "category": "server"}

        error = error_of(api.forward_backward(training.model_id, STRANDED_SEQ_ID + 1, [datum], forward_only=True), 404)
        assert "lost its live weights" in error and "create_training_client_from_state" in error


def test_a_stopping_scheduler_finishes_the_running_operation_and_starts_no_other(tmp_path: Path) -> None:
    """A stop (SIGTERM, a redeploy) must not wait for the whole queue; what it leaves queued fails at the next start."""
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    scheduler = Scheduler(ledger)
    gate = threading.Event()
    ran: list[str] = []

    def operation(name: str) -> Operation:
        record, _ = ledger.submit("owner", name, name)

        def work() -> tuple[bytes, ResultFormat]:
            if name == "running":
                gate.wait(10)
            ran.append(name)
            return b"{}", ResultFormat.JSON

        return Operation(record.request_id, name, name, work)

    running, queued = operation("running"), operation("queued")
    scheduler.submit(running)
    while not scheduler.stats().running:
        time.sleep(0.01)
    scheduler.submit(queued)
    stopping = threading.Thread(target=scheduler.stop)
    stopping.start()
    time.sleep(0.2)
    gate.set()
    stopping.join(10)

    assert ran == ["running"]
    assert ledger.get(running.request_id).state is FutureState.DONE
    assert ledger.get(queued.request_id).state is FutureState.QUEUED
    ledger.close()
    reopened = Ledger(tmp_path / "ledger.sqlite3")
    assert reopened.fail_unfinished(RESTART_REASON) == 1
    assert reopened.get(queued.request_id).error == RESTART_REASON
    reopened.close()
