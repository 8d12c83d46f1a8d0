"""oneDNN linear layers against `F.linear`: the same values and gradients up to float rounding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from torch import nn

from trainer_backend.engine.onednn_linear import RoutedLinear, applies, linear, route_linears

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
