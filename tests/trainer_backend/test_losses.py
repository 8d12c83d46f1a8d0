"""Tinker's built-in losses against hand computations, their gradients, a tiny Gemma 3, and their errors.

Shared numbers: policy log-probs p = [-1.0, -0.5], sampler log-probs q = [-1.2, -0.4], advantages A = [2.0, -1.0],
so the importance ratios are r = [e^0.2, e^-0.1] = [1.2214, 0.9048].
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from transformers import Gemma3ForCausalLM

from trainer_backend.engine.logprobs import target_logprobs
from trainer_backend.engine.losses import LOSSES, LossInputError, UnknownLossError, compute_loss
from trainer_backend.errors import UserInputError
from trainer_backend.models.tiny import tiny_gemma3_config

P = [-1.0, -0.5]
Q = [-1.2, -0.4]
A = [2.0, -1.0]


def policy(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, requires_grad=True)


def rl_inputs(q: list[float] = Q, advantages: list[float] = A, **extra: torch.Tensor) -> dict[str, torch.Tensor]:
    return {
        "target_tokens": torch.arange(len(q)),
        "logprobs": torch.tensor(q),
        "advantages": torch.tensor(advantages),
        **extra,
    }


def single(loss_fn: str, logprobs: torch.Tensor, inputs: dict[str, torch.Tensor], config=None) -> float:
    result = compute_loss(loss_fn, [logprobs], [inputs], config)
    result.loss.backward()
    return result.loss.item()


def test_registry_holds_the_documented_losses() -> None:
    assert list(LOSSES) == ["cross_entropy", "importance_sampling", "ppo", "cispo", "dro"]


def test_cross_entropy_is_the_weighted_negative_log_likelihood_sum() -> None:
    logprobs = policy([-1.0, -0.5, -3.0])
    inputs = {"target_tokens": torch.tensor([4, 5, 6]), "weights": torch.tensor([1.0, 1.0, 0.0])}
    assert single("cross_entropy", logprobs, inputs) == pytest.approx(1.0 + 0.5)
    assert logprobs.grad.tolist() == [-1.0, -1.0, 0.0]


def test_cross_entropy_weights_default_to_one() -> None:
    inputs = {"target_tokens": torch.tensor([4, 5, 6])}
    assert single("cross_entropy", policy([-1.0, -0.5, -3.0]), inputs) == pytest.approx(4.5)


def test_importance_sampling_value_and_gradient() -> None:
    logprobs = policy(P)
    value = single("importance_sampling", logprobs, rl_inputs())
    assert value == pytest.approx(-(math.exp(0.2) * 2.0 + math.exp(-0.1) * -1.0))
    # d/dp of -(e^(p - q) A) is -e^(p - q) A.
    assert logprobs.grad.tolist() == pytest.approx([-math.exp(0.2) * 2.0, math.exp(-0.1) * 1.0])


def test_weights_mask_rl_losses_too() -> None:
    logprobs = policy(P)
    value = single("importance_sampling", logprobs, rl_inputs(weights=torch.tensor([1.0, 0.0])))
    assert value == pytest.approx(-math.exp(0.2) * 2.0)
    assert logprobs.grad[1].item() == 0.0


def test_ppo_clips_only_where_the_ratio_leaves_the_trust_region_in_the_advantage_direction() -> None:
    # Default thresholds [0.8, 1.2]. Token by token:
    #   0: r = e^0.2 = 1.221 > 1.2, A > 0  -> clipped objective 1.2 * 2, no gradient
    #   1: r = e^-0.1 = 0.905 inside        -> r * A, gradient -r * A
    #   2: r = e^-1 = 0.368 < 0.8, A < 0    -> clipped objective 0.8 * -1, no gradient
    #   3: r = e^-1 = 0.368 < 0.8, A > 0    -> min picks the unclipped r * A, gradient -r * A
    logprobs = policy([-1.0, -0.5, -2.0, -2.0])
    inputs = rl_inputs(q=[-1.2, -0.4, -1.0, -1.0], advantages=[2.0, -1.0, -1.0, 0.5])
    value = single("ppo", logprobs, inputs)
    assert value == pytest.approx(-(1.2 * 2.0 + math.exp(-0.1) * -1.0 + 0.8 * -1.0 + math.exp(-1.0) * 0.5))
    assert logprobs.grad.tolist() == pytest.approx([0.0, math.exp(-0.1), 0.0, -math.exp(-1.0) * 0.5])


def test_ppo_thresholds_come_from_loss_fn_config() -> None:
    logprobs = policy(P)
    value = single("ppo", logprobs, rl_inputs(), {"clip_low_threshold": 0.95, "clip_high_threshold": 1.3})
    # Token 0 (r = 1.221) is now inside; token 1 (r = 0.905 < 0.95, A < 0) is clipped at 0.95.
    assert value == pytest.approx(-(math.exp(0.2) * 2.0 + 0.95 * -1.0))
    assert logprobs.grad.tolist() == pytest.approx([-math.exp(0.2) * 2.0, 0.0])


def test_ppo_thresholds_may_come_per_datum_from_loss_fn_inputs() -> None:
    inputs = rl_inputs(clip_high_threshold=torch.tensor([1.3]))
    assert single("ppo", policy(P), inputs) == pytest.approx(-(math.exp(0.2) * 2.0 + math.exp(-0.1) * -1.0))


def test_cispo_weights_log_probs_by_the_detached_clipped_ratio() -> None:
    logprobs = policy(P)
    value = single("cispo", logprobs, rl_inputs(), {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2})
    # Coefficients clip(r) = [1.2, e^-0.1]; they are constants, so the gradient is -clip(r) * A.
    assert value == pytest.approx(-(1.2 * -1.0 * 2.0 + math.exp(-0.1) * -0.5 * -1.0))
    assert logprobs.grad.tolist() == pytest.approx([-1.2 * 2.0, math.exp(-0.1)])


def test_cispo_default_clip_is_one_sided_up_to_four() -> None:
    value = single("cispo", policy(P), rl_inputs())
    assert value == pytest.approx(-(math.exp(0.2) * -1.0 * 2.0 + math.exp(-0.1) * -0.5 * -1.0))


def test_dro_adds_a_quadratic_penalty_on_the_log_ratio() -> None:
    logprobs = policy(P)
    value = single("dro", logprobs, rl_inputs(), {"beta": 0.1})
    # -(p A - beta/2 (p - q)^2), with p - q = [0.2, -0.1].
    assert value == pytest.approx(-((-1.0 * 2.0 - 0.05 * 0.04) + (-0.5 * -1.0 - 0.05 * 0.01)))
    # Gradient -(A - beta (p - q)).
    assert logprobs.grad.tolist() == pytest.approx([-(2.0 - 0.1 * 0.2), -(-1.0 + 0.1 * 0.1)])


def test_dro_beta_defaults_to_the_documented_example() -> None:
    value = single("dro", policy(P), rl_inputs())
    assert value == pytest.approx(-((-2.0 - 0.025 * 0.04) + (0.5 - 0.025 * 0.01)))


def test_batch_loss_is_the_sum_over_data_and_outputs_are_the_detached_logprobs() -> None:
    first, second = policy(P), policy([-0.3])
    result = compute_loss("importance_sampling", [first, second], [rl_inputs(), rl_inputs([-0.3], [4.0])])
    expected = -(math.exp(0.2) * 2.0 - math.exp(-0.1)) - 4.0
    assert result.loss.item() == pytest.approx(expected)
    assert result.metrics == {"loss:sum": pytest.approx(expected)}
    assert [output.keys() for output in result.outputs] == [{"logprobs"}, {"logprobs"}]
    assert torch.equal(result.outputs[1]["logprobs"], second.detach())
    assert not result.outputs[0]["logprobs"].requires_grad


def test_two_dimensional_targets_share_the_shape_of_every_input() -> None:
    logprobs_NK = policy([-1.0, -0.5]).reshape(1, 2)
    inputs = {"target_tokens": torch.tensor([[3, 4]]), "weights": torch.tensor([[0.25, 0.75]])}
    assert compute_loss("cross_entropy", [logprobs_NK], [inputs]).loss.item() == pytest.approx(0.25 + 0.375)


@pytest.mark.parametrize("loss_fn", ["cross_entropy", "importance_sampling", "ppo", "cispo", "dro"])
def test_tiny_gemma_logprobs_feed_every_loss_with_finite_gradients(loss_fn: str) -> None:
    torch.manual_seed(0)
    config = tiny_gemma3_config(100, width=32, final_logit_softcapping=30.0)
    model = Gemma3ForCausalLM(config)
    tokens_BT = torch.randint(0, 100, (2, 9))
    input_BT, targets_BT = tokens_BT[:, :-1], tokens_BT[:, 1:]

    hidden_BTH = model.model(input_ids=input_BT).last_hidden_state
    logprobs_BT = target_logprobs(hidden_BTH, model.lm_head.weight, targets_BT, 3, config.final_logit_softcapping)
    with torch.no_grad():
        reference_BT = F.log_softmax(model(input_ids=input_BT).logits.float(), -1).gather(-1, targets_BT[..., None])
    torch.testing.assert_close(logprobs_BT.detach(), reference_BT.squeeze(-1))

    # Datum 1 is shorter, as a batch padded to its longest datum would be.
    lengths = (8, 5)
    logprobs = [logprobs_BT[i, :n] for i, n in enumerate(lengths)]
    inputs = [
        {
            "target_tokens": targets_BT[i, :n],
            "weights": torch.ones(n),
            "logprobs": logprobs_BT[i, :n].detach() + 0.1,
            "advantages": torch.linspace(-1.0, 1.0, n),
        }
        for i, n in enumerate(lengths)
    ]
    if loss_fn == "cross_entropy":
        inputs = [{"target_tokens": datum["target_tokens"], "weights": datum["weights"]} for datum in inputs]
    result = compute_loss(loss_fn, logprobs, inputs)
    result.loss.backward()

    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(bool(torch.isfinite(grad).all()) for grad in grads)
    assert model.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
    assert math.isfinite(result.metrics["loss:sum"])


def test_unknown_loss_names_the_supported_ones() -> None:
    with pytest.raises(UnknownLossError, match="unknown loss_fn 'mse'; supported: cross_entropy, importance_sampling"):
        compute_loss("mse", [policy(P)], [rl_inputs()])


@pytest.mark.parametrize("loss_fn", ["gspo", "stable_reinforce", "custom"])
def test_tinker_losses_without_an_implementation_are_refused_clearly(loss_fn: str) -> None:
    with pytest.raises(UnknownLossError, match=f"'{loss_fn}' is a Tinker loss this server does not implement"):
        compute_loss(loss_fn, [policy(P)], [rl_inputs()])


def test_custom_loss_points_to_forward_backward_custom() -> None:
    with pytest.raises(UnknownLossError, match="pass a Python callable to forward_backward_custom"):
        compute_loss("custom", [policy(P)], [rl_inputs()], {"loss_id": "abc"})


def test_loss_errors_are_user_errors() -> None:
    assert issubclass(UnknownLossError, UserInputError)
    assert issubclass(LossInputError, UserInputError)
    assert LossInputError("x").status_code == 400


def test_missing_input_names_the_key_and_the_datum() -> None:
    incomplete = rl_inputs()
    del incomplete["advantages"]
    with pytest.raises(LossInputError, match="datum 1: loss_fn_inputs lacks 'advantages', which ppo requires") as err:
        compute_loss("ppo", [policy(P), policy(P)], [rl_inputs(), incomplete])
    assert (err.value.datum_index, err.value.key) == (1, "advantages")


def test_input_of_another_shape_is_rejected() -> None:
    inputs = rl_inputs(advantages=[2.0, -1.0, 0.5])
    with pytest.raises(LossInputError, match=r"datum 0: 'advantages' has shape \(3,\) but 'target_tokens' has shape"):
        compute_loss("importance_sampling", [policy(P)], [inputs])


def test_target_tokens_must_match_the_policy_logprobs() -> None:
    with pytest.raises(LossInputError, match=r"'target_tokens' has shape \(2,\) but the policy log-probs have shape"):
        compute_loss("importance_sampling", [policy([-1.0])], [rl_inputs()])


@pytest.mark.parametrize(("key", "bad"), [("advantages", math.nan), ("weights", math.inf), ("logprobs", -math.inf)])
def test_non_finite_inputs_are_rejected(key: str, bad: float) -> None:
    inputs = rl_inputs(weights=torch.ones(2))
    inputs[key] = torch.tensor([0.0, bad])
    with pytest.raises(LossInputError, match=f"datum 0: '{key}' contains NaN or infinite values"):
        compute_loss("importance_sampling", [policy(P)], [inputs])


def test_unknown_input_key_is_rejected() -> None:
    with pytest.raises(LossInputError, match="loss_fn_inputs key 'mask' is not an input of importance_sampling"):
        compute_loss("importance_sampling", [policy(P)], [rl_inputs(mask=torch.ones(2))])


@pytest.mark.parametrize(
    ("loss_fn", "config", "message"),
    [
        ("ppo", {"beta": 0.1}, "loss_fn_config key 'beta' does not apply to ppo"),
        ("cross_entropy", {"clip_low_threshold": 0.9}, r"does not apply to cross_entropy \(accepted: none\)"),
        ("dro", {"beta": -0.1}, r"'beta' must be a finite number in \[0.0, inf\], got -0.1"),
        ("ppo", {"clip_low_threshold": 1.5}, r"'clip_low_threshold' must be a finite number in \[0.0, 1.0\]"),
        ("cispo", {"clip_high_threshold": 0.9}, r"'clip_high_threshold' must be a finite number in \[1.0, inf\]"),
        ("ppo", {"clip_high_threshold": math.inf}, "'clip_high_threshold' must be a finite number"),
        ("ppo", {"clip_low_threshold": "0.8"}, "'clip_low_threshold' must be a number, got '0.8'"),
    ],
)
def test_bad_config_is_rejected(loss_fn: str, config: dict, message: str) -> None:
    inputs = rl_inputs() if loss_fn != "cross_entropy" else {"target_tokens": torch.arange(2)}
    with pytest.raises(LossInputError, match=message):
        compute_loss(loss_fn, [policy(P)], [inputs], config)


def test_bad_per_datum_threshold_is_rejected() -> None:
    inputs = rl_inputs(clip_low_threshold=torch.tensor([1.5]))
    with pytest.raises(LossInputError, match="datum 0: loss_fn_inputs 'clip_low_threshold' must be a finite number"):
        compute_loss("ppo", [policy(P)], [inputs])


def test_empty_or_misaligned_batches_are_rejected() -> None:
    with pytest.raises(LossInputError, match="no data"):
        compute_loss("ppo", [], [])
    with pytest.raises(LossInputError, match="2 log-prob tensors for 1 data"):
        compute_loss("ppo", [policy(P), policy(P)], [rl_inputs()])
