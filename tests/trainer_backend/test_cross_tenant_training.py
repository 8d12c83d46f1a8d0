"""Forward/backward requests of several clients in one pass over the base model give each client the log-probs,
loss and gradients it would get alone."""

from __future__ import annotations

import pytest
import torch

from trainer_backend.engine.model_engine import ModelEngine
from trainer_backend.engine.sampling import PAUSE_EVERY_STEPS
from trainer_backend.engine.types import (
    AdamSettings,
    DecodedDatum,
    ForwardBackwardCall,
    ForwardBackwardResult,
    LoraSettings,
    SamplingRequest,
)
from trainer_backend.errors import NotFoundError, UserInputError
from trainer_backend.models.loading import load_base_model
from trainer_backend.models.registry import resolve_base_model


@pytest.fixture(scope="module", params=["tiny-gemma3", "tiny-qwen2"])
def engine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ModelEngine:
    models = tmp_path_factory.mktemp("models")
    loaded = load_base_model(resolve_base_model(request.param, models), torch.device("cpu"), torch.float32)
    engine = ModelEngine(loaded)
    for name, seed, settings in [
        ("alice", 1, LoraSettings(rank=4, seed=1)),
        ("bob", 2, LoraSettings(rank=2, train_mlp=False, seed=2)),
        ("carol", 3, LoraSettings(rank=8, train_attn=False, seed=3)),
    ]:
        engine.create_adapter(name, settings)
        # One step so that LoRA B is not zero and the adapters really differ from the base and each other.
        engine.forward_backward(name, [sft_datum([seed, 5, 9, 11, 4, 2])], "cross_entropy", None, False)
        engine.optim_step(name, AdamSettings(learning_rate=0.05))
    return engine


def sft_datum(ids: list[int]) -> DecodedDatum:
    return DecodedDatum(
        model_input_tokens=ids[:-1],
        loss_fn_inputs={
            "target_tokens": torch.tensor(ids[1:]),
            "weights": torch.tensor([0.0] + [1.0] * (len(ids) - 2)),
        },
    )


def rl_datum(ids: list[int], advantage: float) -> DecodedDatum:
    n = len(ids) - 1
    return DecodedDatum(
        model_input_tokens=ids[:-1],
        loss_fn_inputs={
            "target_tokens": torch.tensor(ids[1:]),
            "logprobs": torch.full((n,), -2.5),
            "advantages": torch.full((n,), advantage),
        },
    )


def calls() -> list[ForwardBackwardCall]:
    return [
        ForwardBackwardCall(
            "alice", [sft_datum([3, 8, 1, 7, 7, 2, 9, 30]), sft_datum([4, 4, 5])], "cross_entropy", None, False
        ),
        ForwardBackwardCall(
            "bob",
            [rl_datum([6, 2, 9, 12, 40, 3], 1.5), rl_datum([6, 2, 9, 13], -0.5)],
            "ppo",
            {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
            False,
        ),
        ForwardBackwardCall(
            "carol", [sft_datum([10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 3])], "cross_entropy", None, True
        ),
    ]


def gradients(engine: ModelEngine, name: str) -> list[torch.Tensor]:
    return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in engine.adapters.parameters(name)]


def clear_gradients(engine: ModelEngine) -> None:
    for name in ("alice", "bob", "carol"):
        for param in engine.adapters.parameters(name):
            param.grad = None


def test_one_pass_for_several_clients_equals_each_client_alone(engine: ModelEngine) -> None:
    clear_gradients(engine)
    alone, alone_gradients = [], {}
    for call in calls():
        (result,) = engine.forward_backward_batch([call])
        alone.append(result)
        alone_gradients[call.model_id] = gradients(engine, call.model_id)
        clear_gradients(engine)

    together = engine.forward_backward_batch(calls())
    for one, other in zip(alone, together, strict=True):
        assert one.metrics.keys() == other.metrics.keys()
        for key in one.metrics:
            assert other.metrics[key] == pytest.approx(one.metrics[key], rel=1e-5, abs=1e-6)
        for one_outputs, other_outputs in zip(one.loss_fn_outputs, other.loss_fn_outputs, strict=True):
            torch.testing.assert_close(other_outputs["logprobs"], one_outputs["logprobs"], atol=1e-5, rtol=1e-5)
    for name, expected in alone_gradients.items():
        for got, want in zip(gradients(engine, name), expected, strict=True):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-4)
    # The forward-only call leaves no gradient; the others do.
    assert all(torch.count_nonzero(g) == 0 for g in gradients(engine, "carol"))
    assert all(any(torch.count_nonzero(g) > 0 for g in gradients(engine, n)) for n in ("alice", "bob"))
    clear_gradients(engine)


def test_the_adapters_change_the_log_probs_so_the_routing_matters(engine: ModelEngine) -> None:
    datum = sft_datum([3, 8, 1, 7, 7, 2, 9, 30])
    results = engine.forward_backward_batch(
        [ForwardBackwardCall(name, [datum], "cross_entropy", None, True) for name in ("alice", "bob", "carol")]
    )
    logprobs = [r.loss_fn_outputs[0]["logprobs"] for r in results]
    assert not torch.allclose(logprobs[0], logprobs[1]) and not torch.allclose(logprobs[1], logprobs[2])


def test_a_bad_call_in_a_pass_gets_its_error_and_the_others_their_results(engine: ModelEngine) -> None:
    good = ForwardBackwardCall("alice", [sft_datum([3, 8, 1, 7])], "cross_entropy", None, True)
    missing_input = ForwardBackwardCall("bob", [sft_datum([3, 8, 1, 7])], "importance_sampling", None, True)
    unknown = ForwardBackwardCall("nobody", [sft_datum([3, 8, 1, 7])], "cross_entropy", None, True)
    first, second, third = engine.forward_backward_batch([good, missing_input, unknown])
    (alone,) = engine.forward_backward_batch([good])
    torch.testing.assert_close(first.loss_fn_outputs[0]["logprobs"], alone.loss_fn_outputs[0]["logprobs"])
    assert isinstance(second, UserInputError) and "'logprobs'" in str(second)
    assert isinstance(third, NotFoundError) and "'nobody'" in str(third)


def test_a_training_pass_run_in_a_generations_pause_gets_the_same_gradients(engine: ModelEngine) -> None:
    call = calls()[0]
    clear_gradients(engine)
    engine.forward_backward_batch([call])
    expected = gradients(engine, "alice")
    clear_gradients(engine)

    ran: list[ForwardBackwardResult] = []

    def pause() -> None:
        if not ran:
            (result,) = engine.forward_backward_batch([call])
            ran.append(result)

    request = SamplingRequest(
        prompt_tokens=(5, 9, 14), max_tokens=3 * PAUSE_EVERY_STEPS, temperature=0, stop_at_eos=False
    )
    (outcome,) = engine.sample_batch([request], pause)
    assert len(outcome.sequences[0].tokens) == 3 * PAUSE_EVERY_STEPS and len(ran) == 1
    for got, want in zip(gradients(engine, "alice"), expected, strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    clear_gradients(engine)
