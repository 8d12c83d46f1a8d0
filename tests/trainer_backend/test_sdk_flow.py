"""The official tinker SDK, unmodified, drives the whole training and sampling flow against our server."""

from __future__ import annotations

import math

import pytest
import tinker
from support.backends import TINY
from support.trained_adapters import trained_adapter
from support.trainer import LOGPROB_ROUNDING, SQL, datum_for
from tinker import types

from trainer_backend.server import RunningServer


def logprobs_of(client: tinker.TrainingClient, datum: types.Datum) -> list[float]:
    output = client.forward([datum], "cross_entropy").result()
    return output.loss_fn_outputs[0]["logprobs"].tolist()


def test_start_up_and_finish_a_session(server: RunningServer) -> None:
    with tinker.ServiceClient(base_url=server.url, api_key="tml-tests") as client:
        capabilities = client.get_server_capabilities()
        assert capabilities.supported_models[0].model_name == TINY
        assert capabilities.supported_models[0].trainable


def test_a_training_client_reports_its_model_and_tokenizer(service_client: tinker.ServiceClient) -> None:
    training = service_client.create_lora_training_client(base_model=TINY, rank=4, seed=3).result()
    info = training.get_info()
    assert info.model_data.model_name == TINY
    assert info.lora_rank == 4
    tokenizer = training.get_tokenizer()
    assert tokenizer.decode(tokenizer.encode(SQL), skip_special_tokens=True) == SQL


def test_an_unknown_base_model_is_refused_by_name(service_client: tinker.ServiceClient) -> None:
    with pytest.raises(Exception, match="serves base model 'tiny-gemma3'"):
        service_client.create_lora_training_client(base_model="llama-70b", rank=4).result()


def test_training_lowers_the_loss_and_adam_settings_are_honoured(service_client: tinker.ServiceClient) -> None:
    training = service_client.create_lora_training_client(base_model=TINY, rank=8, seed=0).result()
    datum = datum_for(training.get_tokenizer(), SQL)
    before = training.forward([datum], "cross_entropy").result().metrics["loss:sum"]

    training.forward_backward([datum], "cross_entropy").result()
    training.optim_step(types.AdamParams(learning_rate=0.0)).result()
    assert training.forward([datum], "cross_entropy").result().metrics["loss:sum"] == pytest.approx(before, rel=1e-6)

    for _ in range(5):
        training.forward_backward([datum], "cross_entropy")
        training.optim_step(types.AdamParams(learning_rate=2e-2, grad_clip_norm=1.0))
    after = training.forward([datum], "cross_entropy").result().metrics["loss:sum"]
    assert after < 0.8 * before


def test_losses_return_per_datum_logprobs_and_named_metrics(service_client: tinker.ServiceClient) -> None:
    training = service_client.create_lora_training_client(base_model=TINY, rank=4).result()
    tokenizer = training.get_tokenizer()
    ids = tokenizer.encode(SQL)
    n = len(ids) - 1
    sampled = logprobs_of(training, datum_for(tokenizer, SQL))
    for loss, extra in [
        ("importance_sampling", {}),
        ("ppo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
        ("cispo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
        ("dro", {"beta": 0.1}),
    ]:
        datum = types.Datum(
            model_input=types.ModelInput.from_ints(ids[:-1]),
            loss_fn_inputs={"target_tokens": ids[1:], "logprobs": sampled, "advantages": [1.0] * n},
        )
        output = training.forward_backward([datum, datum], loss, loss_fn_config=extra or None).result()
        assert "loss:sum" in output.metrics, loss
        assert len(output.loss_fn_outputs) == 2
        assert output.loss_fn_outputs[0]["logprobs"].tolist() == pytest.approx(sampled, abs=1e-5)
    # Importance sampling at the sampling policy: ratio 1, so the loss is minus the sum of advantages.
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:], "logprobs": sampled, "advantages": [0.5] * n},
    )
    output = training.forward([datum], "importance_sampling").result()
    assert output.metrics["loss:sum"] == pytest.approx(-0.5 * n, rel=1e-4)


def test_an_unknown_loss_names_the_supported_ones(service_client: tinker.ServiceClient) -> None:
    training = service_client.create_lora_training_client(base_model=TINY, rank=4).result()
    datum = datum_for(training.get_tokenizer(), SQL)
    with pytest.raises(Exception, match="cross_entropy") as error:
        training.forward_backward([datum], "hinge").result()
    assert "importance_sampling" in str(error.value)


def test_forward_backward_custom_runs_a_client_side_loss(service_client: tinker.ServiceClient) -> None:
    training = service_client.create_lora_training_client(base_model=TINY, rank=4).result()
    datum = datum_for(training.get_tokenizer(), SQL)

    def negative_mean_logprob(data, logprobs_list):
        loss = -sum(lp.sum() for lp in logprobs_list) / sum(len(lp) for lp in logprobs_list)
        return loss, {"custom_loss:mean": loss.item()}

    output = training.forward_backward_custom([datum], negative_mean_logprob).result()
    assert output.metrics["custom_loss:mean"] > 0


def test_sampling_honours_its_parameters(service_client: tinker.ServiceClient) -> None:
    training = service_client.create_lora_training_client(base_model=TINY, rank=4).result()
    tokenizer = training.get_tokenizer()
    sampler = training.save_weights_and_get_sampling_client().result()
    prompt = types.ModelInput.from_ints(tokenizer.encode("SELECT"))

    def run(**params) -> types.SampleResponse:
        num_samples = params.pop("num_samples", 1)
        return sampler.sample(
            prompt=prompt, num_samples=num_samples, sampling_params=types.SamplingParams(**params)
        ).result()

    first = run(max_tokens=6, temperature=1.0, seed=11, num_samples=3)
    again = run(max_tokens=6, temperature=1.0, seed=11, num_samples=3)
    other = run(max_tokens=6, temperature=1.0, seed=12, num_samples=3)
    assert len(first.sequences) == 3
    assert [s.tokens for s in first.sequences] == [s.tokens for s in again.sequences]
    assert [s.tokens for s in first.sequences] != [s.tokens for s in other.sequences]
    for sequence in first.sequences:
        assert len(sequence.tokens) <= 6
        assert len(sequence.logprobs) == len(sequence.tokens)
        assert all(lp <= 0 for lp in sequence.logprobs)

    greedy = run(max_tokens=6, temperature=0.0)
    assert run(max_tokens=6, temperature=0.7, top_k=1, seed=5).sequences[0].tokens == greedy.sequences[0].tokens
    stop_token = greedy.sequences[0].tokens[2]
    stopped = run(max_tokens=6, temperature=0.0, stop=[stop_token]).sequences[0]
    assert stopped.tokens == greedy.sequences[0].tokens[:3]
    assert stopped.stop_reason == "stop"
    text = tokenizer.decode(greedy.sequences[0].tokens)
    by_string = run(max_tokens=6, temperature=0.0, stop=[text[-2:]]).sequences[0]
    assert by_string.stop_reason == "stop"
    assert tokenizer.decode(by_string.tokens).endswith(text[-2:])


def test_prompt_logprobs_agree_with_the_training_forward(service_client: tinker.ServiceClient) -> None:
    training = service_client.create_lora_training_client(base_model=TINY, rank=4, seed=1).result()
    tokenizer = training.get_tokenizer()
    datum = datum_for(tokenizer, SQL)
    training.forward_backward([datum], "cross_entropy")
    training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    trained = logprobs_of(training, datum)
    sampler = training.save_weights_and_get_sampling_client().result()
    prompt_logprobs = sampler.compute_logprobs(types.ModelInput.from_ints(tokenizer.encode(SQL))).result()
    assert prompt_logprobs[0] is None
    assert prompt_logprobs[1:] == pytest.approx(trained, abs=LOGPROB_ROUNDING)

    tail = sampler.sample(
        types.ModelInput.from_ints(tokenizer.encode(SQL)),
        1,
        types.SamplingParams(max_tokens=1),
        include_prompt_logprobs=True,
        prompt_logprobs_last_n=3,
    ).result()
    assert all(lp is None for lp in tail.prompt_logprobs[:-3])
    assert tail.prompt_logprobs[-3:] == pytest.approx(trained[-3:], abs=LOGPROB_ROUNDING)


def test_two_training_clients_stay_independent(service_client: tinker.ServiceClient) -> None:
    first = service_client.create_lora_training_client(base_model=TINY, rank=4, seed=0).result()
    second = service_client.create_lora_training_client(base_model=TINY, rank=4, seed=0).result()
    datum = datum_for(first.get_tokenizer(), SQL)
    second_before = logprobs_of(second, datum)
    for _ in range(3):
        first.forward_backward([datum], "cross_entropy")
        first.optim_step(types.AdamParams(learning_rate=2e-2))
    first_after = logprobs_of(first, datum)
    assert logprobs_of(second, datum) == second_before
    assert first_after != second_before


def test_state_saves_and_loads_with_and_without_the_optimizer(service_client: tinker.ServiceClient) -> None:
    training = service_client.create_lora_training_client(base_model=TINY, rank=4, seed=2).result()
    datum = datum_for(training.get_tokenizer(), SQL)
    for _ in range(2):
        training.forward_backward([datum], "cross_entropy")
        training.optim_step(types.AdamParams(learning_rate=1e-2))
    path = training.save_state("after-two-steps").result().path
    assert path.endswith("/weights/after-two-steps")
    saved = logprobs_of(training, datum)

    restored = service_client.create_training_client_from_state(path).result()
    assert logprobs_of(restored, datum) == pytest.approx(saved, abs=1e-6)
    with_optimizer = service_client.create_training_client_from_state_with_optimizer(path).result()
    assert logprobs_of(with_optimizer, datum) == pytest.approx(saved, abs=1e-6)

    # The next step from the restored optimizer state equals the next step of the original run.
    for client in (training, with_optimizer):
        client.forward_backward([datum], "cross_entropy")
        client.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    assert logprobs_of(with_optimizer, datum) == pytest.approx(logprobs_of(training, datum), abs=1e-5)

    training.forward_backward([datum], "cross_entropy")
    training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    training.load_state(path).result()
    assert logprobs_of(training, datum) == pytest.approx(saved, abs=1e-6)


def test_named_sampler_weights_serve_a_sampling_client_by_path(service_client: tinker.ServiceClient) -> None:
    training = trained_adapter(service_client, SQL, seed=4, steps=1, weighted=True)
    tokenizer = training.get_tokenizer()
    path = training.save_weights_for_sampler("policy-1").result().path
    assert path.endswith("/sampler_weights/policy-1")
    by_path = service_client.create_sampling_client(model_path=path).result()
    ephemeral = training.save_weights_and_get_sampling_client().result()
    base = service_client.create_sampling_client(base_model=TINY).result()
    prompt = types.ModelInput.from_ints(tokenizer.encode("SELECT name"))
    params = types.SamplingParams(max_tokens=8, temperature=0.0)
    from_path = by_path.sample(prompt=prompt, num_samples=1, sampling_params=params).result()
    from_snapshot = ephemeral.sample(prompt=prompt, num_samples=1, sampling_params=params).result()
    assert from_path.sequences[0].tokens == from_snapshot.sequences[0].tokens
    logprobs_base = base.compute_logprobs(types.ModelInput.from_ints(tokenizer.encode(SQL))).result()
    logprobs_trained = by_path.compute_logprobs(types.ModelInput.from_ints(tokenizer.encode(SQL))).result()
    assert sum(logprobs_trained[1:]) > sum(logprobs_base[1:])


def test_rest_calls_list_runs_and_checkpoints_and_delete_them(server: RunningServer) -> None:
    with tinker.ServiceClient(base_url=server.url, api_key="tml-rest-owner") as client:
        training = client.create_lora_training_client(base_model=TINY, rank=4).result()
        training.save_state("kept").result()
        training.save_state("dropped").result()
        rest = tinker.RestClient(base_url=server.url, api_key="tml-rest-owner")
        runs = rest.list_training_runs().result()
        assert training.model_id in [r.training_run_id for r in runs.training_runs]
        run = rest.get_training_run(training.model_id).result()
        assert run.lora_rank == 4 and run.last_checkpoint is not None
        names = {c.checkpoint_id for c in rest.list_checkpoints(training.model_id).result().checkpoints}
        assert {"weights/kept", "weights/dropped"} <= names
        rest.delete_checkpoint(training.model_id, "weights/dropped").result()
        names = {c.checkpoint_id for c in rest.list_checkpoints(training.model_id).result().checkpoints}
        assert "weights/dropped" not in names and "weights/kept" in names
        info = rest.get_weights_info_by_tinker_path(f"tinker://{training.model_id}/weights/kept").result()
        assert info.lora_rank == 4 and info.base_model == TINY
        assert math.isfinite(run.last_request_time.timestamp())
