"""Past a limit, idle training adapters wait on disk and come back on use, with the same weights and Adam state."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainer_backend.engine.model_engine import ModelEngine
from trainer_backend.engine.types import AdamSettings, DecodedDatum, LoraSettings
from trainer_backend.models.loading import LoadedModel, load_base_model
from trainer_backend.models.registry import resolve_base_model

TENANTS = [f"tenant-{i}" for i in range(4)]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


def fresh_model(models: Path) -> LoadedModel:
    """Its own copy of the base model: an engine wraps the model it is given with its adapters."""
    return load_base_model(resolve_base_model("tiny-gemma3", models), torch.device("cpu"), torch.float32)


def datum(seed: int) -> DecodedDatum:
    ids = torch.randint(3, 200, (9,), generator=torch.Generator().manual_seed(seed))
    return DecodedDatum(ids[:-1].tolist(), {"target_tokens": ids[1:], "weights": torch.ones(8)})


def train_round_robin(engine: ModelEngine, rounds: int) -> None:
    for round_index in range(rounds):
        for i, name in enumerate(TENANTS):
            engine.forward_backward(name, [datum(10 * round_index + i)], "cross_entropy", None, False)
            engine.optim_step(name, AdamSettings(learning_rate=1e-2))


def weights_of(engine: ModelEngine, name: str, folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    folder.mkdir(parents=True, exist_ok=True)
    engine.save(name, folder, include_optimizer=True)
    return load_file(str(folder / "adapter_model.safetensors"))


def test_spilled_adapters_train_exactly_as_if_they_had_stayed_loaded(models: Path, tmp_path: Path) -> None:
    limited = ModelEngine(fresh_model(models), spill_root=tmp_path / "spill", max_loaded_adapters=2)
    for i, name in enumerate(TENANTS):
        limited.create_adapter(name, LoraSettings(rank=4, seed=i))
    assert limited.residency.loaded == 2 and limited.residency.spilled == 2
    assert sorted(p.name for p in (tmp_path / "spill").iterdir()) == TENANTS[:2]
    assert all(limited.has_adapter(name) for name in TENANTS)
    train_round_robin(limited, rounds=3)
    assert limited.residency.loaded <= 2
    limited_weights = {name: weights_of(limited, name, tmp_path / "a" / name) for name in TENANTS}

    unlimited = ModelEngine(fresh_model(models))
    for i, name in enumerate(TENANTS):
        unlimited.create_adapter(name, LoraSettings(rank=4, seed=i))
    train_round_robin(unlimited, rounds=3)
    for name in TENANTS:
        reference = weights_of(unlimited, name, tmp_path / "b" / name)
        assert reference.keys() == limited_weights[name].keys()
        for key, tensor in reference.items():
            torch.testing.assert_close(limited_weights[name][key], tensor, rtol=0, atol=0)


def test_an_adapter_holding_gradients_is_not_spilled(models: Path, tmp_path: Path) -> None:
    engine = ModelEngine(fresh_model(models), spill_root=tmp_path / "spill", max_loaded_adapters=1)
    engine.create_adapter("first", LoraSettings(rank=2, seed=0))
    engine.forward_backward("first", [datum(1)], "cross_entropy", None, False)
    engine.create_adapter("second", LoraSettings(rank=2, seed=1))
    # "first" has gradients waiting for its optim_step: both stay loaded, over the limit.
    assert engine.residency.loaded == 2 and engine.residency.spilled == 0
    engine.optim_step("first", AdamSettings(learning_rate=1e-2))
    engine.forward_backward("second", [datum(2)], "cross_entropy", None, False)
    engine.optim_step("second", AdamSettings(learning_rate=1e-2))
    assert engine.residency.loaded == 1 and engine.residency.spilled == 1
