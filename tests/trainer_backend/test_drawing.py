"""Drawing a token: the one-pass draw from hidden states against a float64 draw over the whole vocabulary."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trainer_backend.engine import drawing
from trainer_backend.engine.drawing import draw_from_hidden, draw_from_logits, inverse_transform

HIDDEN = 16
# Not a multiple of the chunk, so the last chunk is short.
VOCAB = 1000
CHUNK = 128


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drawing, "VOCABULARY_CHUNK", CHUNK)


def reference_draw(logits_RV: torch.Tensor, temperature_R: torch.Tensor, uniform_R: torch.Tensor) -> torch.Tensor:
    """Inverse transform sampling over the whole vocabulary in float64; the argmax at temperature 0."""
    scaled_RV = logits_RV.double() / torch.where(temperature_R == 0, 1.0, temperature_R.double())[:, None]
    cdf_RV = scaled_RV.softmax(dim=-1).cumsum(dim=-1)
    drawn_R = torch.searchsorted(cdf_RV, uniform_R.double()[:, None] * cdf_RV[:, -1:], right=True)[:, 0]
    return torch.where(temperature_R == 0, logits_RV.argmax(dim=-1), drawn_R)


def test_a_draw_from_hidden_states_takes_the_token_of_a_whole_vocabulary_draw_and_its_logprob() -> None:
    generator = torch.Generator().manual_seed(0)
    weight_VH = torch.randn(VOCAB, HIDDEN, generator=generator)
    hidden_RH = torch.randn(64, HIDDEN, generator=generator)
    temperature_R = torch.tensor([0.0, 0.5, 1.0, 1.7]).repeat(16)
    uniform_R = torch.rand(64, generator=generator)
    softcap = 3.0
    logits_RV = torch.tanh(hidden_RH @ weight_VH.T / softcap) * softcap

    token_R, logprob_R = draw_from_hidden(hidden_RH, weight_VH, temperature_R, uniform_R, softcap)

    assert torch.equal(token_R, reference_draw(logits_RV, temperature_R, uniform_R))
    # A sampled row's logprob is under the distribution it was drawn from; a greedy row's is the model's own.
    scaled_RV = logits_RV / torch.where(temperature_R == 0, 1.0, temperature_R)[:, None]
    expected_R = F.log_softmax(scaled_RV, dim=-1).gather(1, token_R[:, None])[:, 0]
    torch.testing.assert_close(logprob_R, expected_R, atol=1e-5, rtol=0)


def test_a_draw_from_hidden_states_follows_the_probabilities_and_never_takes_an_impossible_token() -> None:
    # Logits 0, log 3 and log 6 for three tokens in three chunks; every other token's, -1e4, has probability 0.
    possible = [5, CHUNK + 7, VOCAB - 1]
    weight_VH = torch.full((VOCAB, 1), -1e4)
    weight_VH[possible, 0] = torch.tensor([1.0, 3.0, 6.0]).log()
    hidden_RH = torch.ones(20_000, 1)
    uniform_R = torch.rand(20_000, generator=torch.Generator().manual_seed(1))
    token_R, _ = draw_from_hidden(hidden_RH, weight_VH, torch.ones(20_000), uniform_R)
    frequencies = torch.bincount(token_R, minlength=VOCAB).float() / 20_000
    # 20,000 draws: a frequency's standard error is at most 0.0035, so 0.02 is more than five of them.
    torch.testing.assert_close(frequencies[possible], torch.tensor([0.1, 0.3, 0.6]), atol=0.02, rtol=0)
    assert frequencies.sum() == frequencies[possible].sum() == 1


def test_the_last_uniform_number_below_one_still_takes_a_possible_token() -> None:
    weight_VH = torch.full((VOCAB, 1), -1e4)
    weight_VH[3] = 0.0
    token_R, logprob_R = draw_from_hidden(torch.ones(1, 1), weight_VH, torch.ones(1), torch.tensor([1 - 2**-24]))
    assert token_R.tolist() == [3] and logprob_R.tolist() == [0.0]


def test_a_draw_from_logits_without_cuts_takes_the_same_token_for_the_same_generator() -> None:
    generator = torch.Generator().manual_seed(2)
    weight_VH = torch.randn(VOCAB, HIDDEN, generator=generator)
    hidden_RH = torch.randn(8, HIDDEN, generator=generator)
    from_logits_R, logprobs_R = draw_from_logits(hidden_RH @ weight_VH.T, 0.8, 0, 1.0, torch.Generator().manual_seed(3))
    uniform_R = torch.rand(8, generator=torch.Generator().manual_seed(3))
    from_hidden_R, hidden_logprobs_R = draw_from_hidden(hidden_RH, weight_VH, torch.full((8,), 0.8), uniform_R)
    assert torch.equal(from_logits_R, from_hidden_R)
    torch.testing.assert_close(logprobs_R, hidden_logprobs_R, atol=1e-5, rtol=0)


def test_inverse_transform_follows_the_weights_and_never_takes_an_impossible_entry() -> None:
    probs_BV = torch.tensor([[0.5, 0.0, 0.3, 0.2, 0.0], [0.0, 0.0, 0.0, 1.0, 0.0]]).repeat(20_000, 1)
    uniform_B1 = torch.rand((probs_BV.shape[0], 1), generator=torch.Generator().manual_seed(0))
    drawn_B = inverse_transform(probs_BV, uniform_B1)[:, 0]
    first = torch.bincount(drawn_B[0::2], minlength=5).float() / 20_000
    torch.testing.assert_close(first, probs_BV[0], atol=0.02, rtol=0)
    assert first[1] == 0 and first[4] == 0
    assert bool((drawn_B[1::2] == 3).all())
