"""oneDNN linear layers against `F.linear`: the same values and gradients up to float rounding (a packed bf16
weight: the same bits)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from torch import nn

from trainer_backend.engine import onednn_linear
from trainer_backend.engine.onednn_linear import RoutedLinear, applies, linear, packed_weight, packs, route_linears

pytestmark = pytest.mark.skipif(not applies(torch.zeros(1)), reason="oneDNN linear layers run on x86 CPUs only")


def test_values_and_gradients_match_f_linear() -> None:
    generator = torch.Generator().manual_seed(0)
    weight_OI = torch.randn(48, 40, generator=generator, requires_grad=True)
    bias_O = torch.randn(48, generator=generator, requires_grad=True)
    input_BTI = torch.randn(3, 5, 40, generator=generator, requires_grad=True)
    upstream_BTO = torch.randn(3, 5, 48, generator=generator)

    output = linear(input_BTI, weight_OI, bias_O)
    gradients = torch.autograd.grad(output, (input_BTI, weight_OI, bias_O), upstream_BTO)
    expected = F.linear(input_BTI, weight_OI, bias_O)
    expected_gradients = torch.autograd.grad(expected, (input_BTI, weight_OI, bias_O), upstream_BTO)

    assert output.shape == (3, 5, 48)
    torch.testing.assert_close(output, expected, atol=1e-5, rtol=1e-5)
    for gradient, expected_gradient in zip(gradients, expected_gradients, strict=True):
        torch.testing.assert_close(gradient, expected_gradient, atol=1e-5, rtol=1e-5)


def test_a_frozen_weight_passes_the_gradient_to_the_input_only() -> None:
    weight_OI = torch.randn(16, 8)
    input_NI = torch.randn(4, 8, requires_grad=True)
    (input_grad,) = torch.autograd.grad(linear(input_NI, weight_OI).square().sum(), input_NI)
    (expected,) = torch.autograd.grad(F.linear(input_NI, weight_OI).square().sum(), input_NI)
    torch.testing.assert_close(input_grad, expected, atol=1e-5, rtol=1e-5)


def test_weights_it_does_not_apply_to_go_through_f_linear_unchanged() -> None:
    weight_OI = torch.randn(6, 5, dtype=torch.float64)
    input_NI = torch.randn(2, 5, dtype=torch.float64)
    assert not applies(weight_OI)
    assert torch.equal(linear(input_NI, weight_OI), F.linear(input_NI, weight_OI))


def test_a_routed_model_keeps_its_outputs_and_lora_still_wraps_its_layers() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.Linear(32, 12))
    inputs = torch.randn(7, 12)
    expected = model(inputs)

    assert route_linears(model) == 2
    assert all(type(layer) is RoutedLinear for layer in (model[0], model[2]))
    torch.testing.assert_close(model(inputs), expected, atol=1e-5, rtol=1e-5)

    lora = get_peft_model(model, LoraConfig(r=2, target_modules=["0", "2"], init_lora_weights=False))
    assert type(lora.base_model.model[0].base_layer) is RoutedLinear
    # The adapters change the output, and their gradients flow through the routed layers.
    output = lora(inputs)
    assert not torch.allclose(output, expected, atol=1e-3)
    output.square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in lora.named_parameters() if "lora_" in n)


def frozen_bf16_layer(generator: torch.Generator) -> nn.Linear:
    layer = nn.Linear(40, 48, dtype=torch.bfloat16).requires_grad_(False)
    layer.weight.copy_(torch.randn(48, 40, generator=generator))
    layer.bias.copy_(torch.randn(48, generator=generator))
    return layer


@pytest.fixture
def packings(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """The weights `packed_weight` reorders during a test, in order."""
    packed: list[torch.Tensor] = []

    def recording(weight_OI: torch.Tensor) -> torch.Tensor:
        packed.append(weight_OI.detach().clone())
        return packed_weight(weight_OI)

    monkeypatch.setattr(onednn_linear, "packed_weight", recording)
    return packed


bf16_packing = pytest.mark.skipif(
    not packs(torch.zeros(1, dtype=torch.bfloat16)), reason="oneDNN packs bf16 weights on CPUs with bf16 instructions"
)


@bf16_packing
def test_a_frozen_bf16_weight_is_packed_once_and_computes_f_linears_values(packings: list[torch.Tensor]) -> None:
    generator = torch.Generator().manual_seed(0)
    layer = frozen_bf16_layer(generator)
    expected_layer = frozen_bf16_layer(torch.Generator().manual_seed(0))
    route_linears(layer)
    input_BTI = torch.randn(3, 5, 40, generator=generator).bfloat16().requires_grad_()
    upstream_BTO = torch.randn(3, 5, 48, generator=generator).bfloat16()

    outputs = [layer(input_BTI) for _ in range(3)]
    (input_grad,) = torch.autograd.grad(outputs[0], input_BTI, upstream_BTO)
    expected = expected_layer(input_BTI)
    (expected_input_grad,) = torch.autograd.grad(expected, input_BTI, upstream_BTO)

    assert len(packings) == 1
    assert all(torch.equal(output, expected) for output in outputs)
    torch.testing.assert_close(input_grad, expected_input_grad)


@bf16_packing
def test_a_packed_weight_follows_its_layers_weight_when_it_changes(packings: list[torch.Tensor]) -> None:
    generator = torch.Generator().manual_seed(0)
    layer = frozen_bf16_layer(generator)
    route_linears(layer)
    input_NI = torch.randn(4, 40, generator=generator).bfloat16()
    layer(input_NI)

    with torch.no_grad():
        layer.weight.mul_(-2)
    assert torch.equal(layer(input_NI), F.linear(input_NI, layer.weight, layer.bias))
    layer.weight = nn.Parameter(torch.randn(48, 40, generator=generator).bfloat16(), requires_grad=False)
    assert torch.equal(layer(input_NI), F.linear(input_NI, layer.weight, layer.bias))
    assert len(packings) == 3


@bf16_packing
def test_a_trained_weight_and_the_layer_left_unpacked_keep_pytorchs_layout(packings: list[torch.Tensor]) -> None:
    generator = torch.Generator().manual_seed(0)
    body, head = frozen_bf16_layer(generator), frozen_bf16_layer(generator)
    trained = nn.Linear(40, 48, dtype=torch.bfloat16)
    model = nn.ModuleList([body, head, trained])
    assert route_linears(model, unpacked=head) == 3
    input_NI = torch.randn(4, 40, generator=generator).bfloat16()

    for layer in model:
        assert torch.equal(layer(input_NI), F.linear(input_NI, layer.weight, layer.bias))
    assert len(packings) == 1 and torch.equal(packings[0], body.weight)
