"""Chunked target log-probs against a plain log_softmax, in values, gradients and peak memory."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from trainer_backend.engine.logprobs import LowRankDelta, full_logits_target_logprobs, target_logprobs
from trainer_backend.engine.unembedding import VOCABULARY_CHUNK
from trainer_backend.errors import UserInputError

B, T, H, V = 2, 7, 8, 50


def make_inputs(seed: int = 0, weight_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    hidden_BTH = torch.randn(B, T, H, generator=generator).requires_grad_()
    weight_VH = torch.randn(V, H, generator=generator).requires_grad_(weight_grad)
    targets_BT = torch.randint(0, V, (B, T), generator=generator)
    return hidden_BTH, weight_VH, targets_BT


def reference(hidden_BTH: torch.Tensor, weight_VH: torch.Tensor, targets_BT: torch.Tensor, cap: float | None):
    logits_BTV = hidden_BTH @ weight_VH.T
    if cap is not None:
        logits_BTV = torch.tanh(logits_BTV / cap) * cap
    return F.log_softmax(logits_BTV, dim=-1).gather(-1, targets_BT.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("cap", [None, 5.0])
def test_naive_path_matches_log_softmax(cap: float | None) -> None:
    hidden_BTH, weight_VH, targets_BT = make_inputs()
    actual = full_logits_target_logprobs(hidden_BTH, weight_VH, targets_BT, final_logit_softcapping=cap)
    torch.testing.assert_close(actual, reference(hidden_BTH, weight_VH, targets_BT, cap))


@pytest.mark.parametrize("cap", [None, 5.0])
@pytest.mark.parametrize("chunk_tokens", [1, 3, 5, 14, 256])
def test_chunked_matches_naive_in_values_and_hidden_gradients(chunk_tokens: int, cap: float | None) -> None:
    hidden_BTH, weight_VH, targets_BT = make_inputs()
    upstream_BT = torch.randn(B, T, generator=torch.Generator().manual_seed(1))

    naive = full_logits_target_logprobs(hidden_BTH, weight_VH, targets_BT, final_logit_softcapping=cap)
    (naive_grad,) = torch.autograd.grad((naive * upstream_BT).sum(), hidden_BTH)
    chunked = target_logprobs(hidden_BTH, weight_VH, targets_BT, chunk_tokens, final_logit_softcapping=cap)
    (chunked_grad,) = torch.autograd.grad((chunked * upstream_BT).sum(), hidden_BTH)

    torch.testing.assert_close(chunked, naive, atol=1e-5, rtol=0)
    torch.testing.assert_close(chunked_grad, naive_grad, atol=1e-5, rtol=0)


def test_a_low_rank_delta_on_the_unembedding_equals_the_dense_sum() -> None:
    hidden_BTH, weight_VH, targets_BT = make_inputs()
    generator = torch.Generator().manual_seed(3)
    a_RH = torch.randn(2, H, generator=generator).requires_grad_()
    b_VR = torch.randn(V, 2, generator=generator).requires_grad_()
    delta = LowRankDelta(a_RH, b_VR, scale=0.5)

    chunked = target_logprobs(hidden_BTH, weight_VH, targets_BT, chunk_tokens=3, lm_head_delta=delta)
    dense = reference(hidden_BTH, weight_VH + 0.5 * b_VR @ a_RH, targets_BT, None)
    torch.testing.assert_close(chunked, dense, atol=1e-5, rtol=0)
    chunked_grads = torch.autograd.grad(chunked.sum(), (a_RH, b_VR))
    dense_grads = torch.autograd.grad(dense.sum(), (a_RH, b_VR))
    for chunked_grad, dense_grad in zip(chunked_grads, dense_grads, strict=True):
        torch.testing.assert_close(chunked_grad, dense_grad, atol=1e-4, rtol=1e-4)


def test_weight_gets_a_gradient_only_when_it_requires_one() -> None:
    hidden_BTH, weight_VH, targets_BT = make_inputs(weight_grad=True)
    target_logprobs(hidden_BTH, weight_VH, targets_BT, chunk_tokens=4, final_logit_softcapping=5.0).sum().backward()
    chunked_grad = weight_VH.grad
    weight_VH.grad = None
    reference(hidden_BTH, weight_VH, targets_BT, 5.0).sum().backward()
    torch.testing.assert_close(chunked_grad, weight_VH.grad, atol=1e-5, rtol=0)

    hidden_BTH, frozen_VH, targets_BT = make_inputs()
    target_logprobs(hidden_BTH, frozen_VH, targets_BT, chunk_tokens=4).sum().backward()
    assert frozen_VH.grad is None
    assert hidden_BTH.grad is not None


def test_negative_targets_are_ignored_positions() -> None:
    hidden_BTH, weight_VH, targets_BT = make_inputs()
    targets_BT[0, 2:] = -100
    logprobs_BT = target_logprobs(hidden_BTH, weight_VH, targets_BT, chunk_tokens=3)
    logprobs_BT.sum().backward()

    assert torch.equal(logprobs_BT[0, 2:], torch.zeros(T - 2))
    assert torch.equal(hidden_BTH.grad[0, 2:], torch.zeros(T - 2, H))
    torch.testing.assert_close(logprobs_BT[1], reference(hidden_BTH, weight_VH, targets_BT.clamp(min=0), None)[1])


def test_several_targets_per_position() -> None:
    hidden_BTH, weight_VH, _ = make_inputs()
    targets_BTK = torch.randint(0, V, (B, T, 3), generator=torch.Generator().manual_seed(2))
    logprobs_BTK = target_logprobs(hidden_BTH, weight_VH, targets_BTK, chunk_tokens=4)
    expected_BTK = F.log_softmax(hidden_BTH @ weight_VH.T, dim=-1).gather(-1, targets_BTK)
    torch.testing.assert_close(logprobs_BTK, expected_BTK)


@pytest.mark.parametrize("cap", [None, 5.0])
def test_gradients_through_a_frozen_unembedding_with_several_targets_and_ignored_ones(cap: float | None) -> None:
    hidden_BTH, weight_VH, _ = make_inputs()
    targets_BTK = torch.randint(0, V, (B, T, 3), generator=torch.Generator().manual_seed(2))
    targets_BTK[1, 4:, 1] = -100
    upstream_BTK = torch.randn(B, T, 3, generator=torch.Generator().manual_seed(4))

    chunked = target_logprobs(hidden_BTH, weight_VH, targets_BTK, chunk_tokens=4, final_logit_softcapping=cap)
    (chunked_grad,) = torch.autograd.grad((chunked * upstream_BTK).sum(), hidden_BTH)
    naive = full_logits_target_logprobs(hidden_BTH, weight_VH, targets_BTK, final_logit_softcapping=cap)
    (naive_grad,) = torch.autograd.grad((naive * upstream_BTK).sum(), hidden_BTH)

    torch.testing.assert_close(chunked, naive, atol=1e-5, rtol=0)
    torch.testing.assert_close(chunked_grad, naive_grad, atol=1e-5, rtol=0)


@pytest.mark.parametrize("cap", [None, 5.0])
def test_a_vocabulary_of_several_chunks_is_reduced_exactly_across_them(cap: float | None) -> None:
    """The frozen path reduces the vocabulary a chunk at a time; targets in every chunk, a short last one, and a
    maximum that grows from chunk to chunk must give the whole softmax's values and gradients."""
    generator = torch.Generator().manual_seed(5)
    vocabulary = 2 * VOCABULARY_CHUNK + 37
    hidden_BTH = torch.randn(B, T, H, generator=generator).requires_grad_()
    # Later chunks hold larger logits, so the running maximum rises and earlier sums are rescaled.
    weight_VH = torch.randn(vocabulary, H, generator=generator) * torch.linspace(0.1, 2.0, vocabulary)[:, None]
    targets_BTK = torch.stack(
        [
            torch.randint(0, VOCABULARY_CHUNK, (B, T), generator=generator),
            torch.randint(VOCABULARY_CHUNK, 2 * VOCABULARY_CHUNK, (B, T), generator=generator),
            torch.randint(2 * VOCABULARY_CHUNK, vocabulary, (B, T), generator=generator),
        ],
        dim=-1,
    )
    targets_BTK[0, 2:, 1] = -100
    upstream_BTK = torch.randn(B, T, 3, generator=generator)

    chunked = target_logprobs(hidden_BTH, weight_VH, targets_BTK, chunk_tokens=4, final_logit_softcapping=cap)
    (chunked_grad,) = torch.autograd.grad((chunked * upstream_BTK).sum(), hidden_BTH)
    naive = full_logits_target_logprobs(hidden_BTH, weight_VH, targets_BTK, final_logit_softcapping=cap)
    (naive_grad,) = torch.autograd.grad((naive * upstream_BTK).sum(), hidden_BTH)

    torch.testing.assert_close(chunked, naive, atol=1e-5, rtol=0)
    torch.testing.assert_close(chunked_grad, naive_grad, atol=1e-5, rtol=1e-5)


def test_target_outside_vocabulary_is_a_user_error() -> None:
    hidden_BTH, weight_VH, targets_BT = make_inputs()
    targets_BT[1, 3] = V
    with pytest.raises(UserInputError, match=f"target token {V} is outside the model's vocabulary of {V}"):
        target_logprobs(hidden_BTH, weight_VH, targets_BT)


def test_mismatched_shapes_are_rejected() -> None:
    hidden_BTH, weight_VH, targets_BT = make_inputs()
    with pytest.raises(ValueError, match=r"targets must be \[2, 7\]"):
        target_logprobs(hidden_BTH, weight_VH, targets_BT[:, :5])
    with pytest.raises(ValueError, match=r"lm_head_weight must be \[V, 8\]"):
        target_logprobs(hidden_BTH, weight_VH[:, :4], targets_BT)
    with pytest.raises(ValueError, match="integer token ids"):
        target_logprobs(hidden_BTH, weight_VH, targets_BT.float())


_PEAK_PROBE = textwrap.dedent(
    """
    import torch
    from trainer_backend.engine.logprobs import LowRankDelta, full_logits_target_logprobs, target_logprobs

    def status_kib(field):
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))

    def extra_kib(fn, *args, **kwargs):
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")  # resets the peak (VmHWM) to the current resident size
        before = status_kib("VmRSS")
        fn(*args, **kwargs).sum().backward()
        return status_kib("VmHWM") - before

    torch.manual_seed(0)
    hidden = torch.randn(2, 256, 64, requires_grad=True)
    weight = torch.randn(32_000, 64) * 0.1
    targets = torch.randint(0, 32_000, (2, 256))
    for fn in (target_logprobs, full_logits_target_logprobs):  # load kernels
        fn(hidden[:, :4], weight[:100], targets[:, :4] % 100, chunk_tokens=2).sum().backward()
    chunked = extra_kib(target_logprobs, hidden, weight, targets, chunk_tokens=64)
    print(chunked, extra_kib(full_logits_target_logprobs, hidden, weight, targets))
    """
)


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's resettable peak RSS")
def test_chunked_peak_memory_is_a_fraction_of_the_full_logits() -> None:
    # glibc otherwise raises its mmap threshold after the first large free and keeps freed buffers in its heap, so
    # the peak would measure the allocator's reuse rather than which tensors are alive at once; with a fixed
    # threshold, each freed logits buffer goes back to the system.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
    probe = subprocess.run(
        [sys.executable, "-c", _PEAK_PROBE], capture_output=True, text=True, env=env, timeout=60, check=True
    )
    chunked_kib, full_kib = map(int, probe.stdout.split())
    # Full fp32 logits for 512 tokens x 32k vocab are 66 MB, and autograd keeps several such tensors alive.
    assert full_kib > 200_000
    assert chunked_kib < 0.35 * full_kib
