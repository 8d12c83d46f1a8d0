"""One adapter and one AdamW state per training client, over one shared base model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainer_backend.engine.adapters import AdapterPool
from trainer_backend.engine.applied_weights import AppliedWeights
from trainer_backend.engine.residency import SamplerAdapters
from trainer_backend.engine.types import AdamSettings, LoraSettings
from trainer_backend.engine.weights_proof import WeightChecks, probe_tokens
from trainer_backend.errors import NotFoundError, UserInputError
from trainer_backend.models.loading import LoadedModel, load_base_model
from trainer_backend.models.registry import resolve_base_model


@pytest.fixture
def loaded(tmp_path: Path) -> LoadedModel:
    return load_base_model(resolve_base_model("tiny-gemma3", tmp_path), torch.device("cpu"), torch.float32)


def fill_gradients(pool: AdapterPool, name: str, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    grads = []
    for param in pool.parameters(name):
        param.grad = torch.randn(param.shape, generator=generator)
        grads.append(param.grad.clone())
    return grads


def test_a_step_applies_every_adam_setting(loaded: LoadedModel) -> None:
    pool = AdapterPool(loaded.model)
    pool.create("a", LoraSettings(rank=4, seed=1))
    adam = AdamSettings(learning_rate=0.05, beta1=0.8, beta2=0.9, eps=1e-6, weight_decay=0.1, grad_clip_norm=0.5)
    reference_params = [p.detach().clone().requires_grad_() for p in pool.parameters("a")]
    reference = torch.optim.AdamW(reference_params, lr=0.05, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1)
    for step in range(3):
        grads = fill_gradients(pool, "a", seed=step)
        for param, grad in zip(reference_params, grads, strict=True):
            param.grad = grad.clone()
        torch.nn.utils.clip_grad_norm_(reference_params, 0.5)
        reference.step()
        metrics = pool.step("a", adam)
        assert metrics["grad_norm:mean"] > 0.5  # reported before clipping
    for mine, expected in zip(pool.parameters("a"), reference_params, strict=True):
        torch.testing.assert_close(mine, expected)
    assert all(p.grad is None for p in pool.parameters("a"))


@pytest.mark.parametrize(
    ("field", "value"), [("learning_rate", -1e-3), ("beta1", 1.0), ("eps", 0.0), ("grad_clip_norm", float("nan"))]
)
def test_out_of_range_adam_settings_are_refused_by_name(field: str, value: float) -> None:
    with pytest.raises(UserInputError, match=f"adam_params.{field}"):
        AdamSettings(**{field: value}).validate()


def test_adapters_are_seeded_and_independent(loaded: LoadedModel) -> None:
    pool = AdapterPool(loaded.model)
    pool.create("a", LoraSettings(rank=4, seed=7))
    pool.create("b", LoraSettings(rank=4, seed=7))
    pool.create("c", LoraSettings(rank=4, seed=8))
    first, second, third = (pool.parameters(n) for n in ("a", "b", "c"))
    assert all(torch.equal(x, y) for x, y in zip(first, second, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(first, third, strict=True))
    fill_gradients(pool, "a", seed=0)
    pool.step("a", AdamSettings(learning_rate=0.1))
    assert all(torch.equal(x, y) for x, y in zip(pool.parameters("b"), second, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(pool.parameters("a"), second, strict=True))


def test_lora_settings_choose_the_trained_modules(loaded: LoadedModel) -> None:
    pool = AdapterPool(loaded.model)
    pool.create("mlp", LoraSettings(rank=2, train_attn=False, train_mlp=True, train_unembed=False))
    pool.create("all", LoraSettings(rank=2, train_attn=True, train_mlp=True, train_unembed=True))
    names = {n for n, _ in pool.peft_model.named_parameters() if ".mlp." in n and "lora_" in n}
    assert names and all(".mlp." in n for n in names)
    mlp_only = [n for n, _ in pool.peft_model.named_parameters() if ".mlp." in n and ".lora_A.mlp." in n]
    attention = [n for n, _ in pool.peft_model.named_parameters() if "self_attn" in n and ".lora_A.mlp." in n]
    assert mlp_only and not attention
    assert any("lm_head" in n and ".lora_A.all." in n for n, _ in pool.peft_model.named_parameters())
    with pytest.raises(UserInputError, match="trains nothing"):
        pool.create("none", LoraSettings(rank=2, train_attn=False, train_mlp=False, train_unembed=False))


def test_save_and_load_round_trip_with_the_optimizer(loaded: LoadedModel, tmp_path: Path) -> None:
    pool = AdapterPool(loaded.model)
    pool.create("a", LoraSettings(rank=4, seed=1))
    fill_gradients(pool, "a", seed=0)
    pool.step("a", AdamSettings(learning_rate=0.1))
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    pool.save("a", folder, include_optimizer=True)
    assert {p.name for p in folder.iterdir()} == {"adapter_model.safetensors", "adapter_config.json", "optimizer.pt"}

    pool.load("b", folder, with_optimizer=True, trainable=True)
    assert all(torch.equal(x, y) for x, y in zip(pool.parameters("a"), pool.parameters("b"), strict=True))
    for name in ("a", "b"):
        fill_gradients(pool, name, seed=1)
        pool.step(name, AdamSettings(learning_rate=0.1))
    assert all(torch.allclose(x, y) for x, y in zip(pool.parameters("a"), pool.parameters("b"), strict=True))


def test_deleting_the_last_adapter_restores_the_plain_base_model(loaded: LoadedModel) -> None:
    pool = AdapterPool(loaded.model)
    tokens = torch.tensor([[2, 10, 11, 12]])
    before = loaded.model(tokens).logits
    pool.create("a", LoraSettings(rank=4, seed=1))
    pool.delete("a")
    assert "a" not in pool
    torch.testing.assert_close(pool.base_model(tokens).logits, before)
    with pytest.raises(NotFoundError, match="no adapter 'a'"):
        pool.parameters("a")


def test_sampler_weights_a_running_batch_holds_stay_loaded_past_the_limit(loaded: LoadedModel, tmp_path: Path) -> None:
    pool = AdapterPool(loaded.model)
    folders = []
    for index in range(3):
        pool.create("trained", LoraSettings(rank=4, seed=index))
        folder = tmp_path / f"sampler-{index}"
        folder.mkdir()
        pool.save("trained", folder, include_optimizer=False)
        pool.delete("trained")
        folders.append(folder)
    applied = AppliedWeights(pool, probe_tokens(loaded.tokenizer), loaded.tokenizer.decode, 64, WeightChecks("float32"))
    sampler = SamplerAdapters(pool, limit=1, applied=applied)

    with sampler.batch() as use:
        outer = use(folders[0])
        # A batch nested in this one's pause loads other weights: the paused batch's stay loaded.
        with sampler.batch() as nested_use:
            nested = nested_use(folders[1])
            assert {outer, nested} <= set(pool.names)
        assert outer in pool.names
    # Once no batch holds them, the least recently used go as the limit says.
    latest = sampler.use(folders[2])
    assert [name for name in pool.names if name.startswith("sampler-")] == [latest]
