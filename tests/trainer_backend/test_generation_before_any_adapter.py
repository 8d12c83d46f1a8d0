"""A generation that began before the engine held any adapter (a server just started, on a storage root whose
sampler weights outlived the last process) runs on the bare model. Loading an adapter wraps that model in PEFT, in
place; the generation's rows must stay on the base model, and a request for sampler weights cannot join it (its rows
would need the wrapper): it waits for the next generation, or runs in this one's pause.

Found by the soak with a crash in the middle (benchmarks/soak.py): right after the restart, /v1 requests on a saved
adapter joined another tenant's base-model generation, and the whole batch was answered 500, "jobs name adapters, but
the model has none". Keeping them out, they ran nested in the generation's pause instead, and the base model's rows
went on through the adapter just loaded: wrong tokens, silently.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import torch

from trainer_backend.engine.model_engine import ModelEngine
from trainer_backend.engine.types import AdamSettings, DecodedDatum, LoraSettings, SamplingRequest
from trainer_backend.models.loading import load_base_model
from trainer_backend.models.registry import resolve_base_model

BASE = SamplingRequest(prompt_tokens=(5, 9, 14), max_tokens=24, temperature=0, stop_at_eos=False)
ON_SAVED = SamplingRequest(prompt_tokens=(7, 3), max_tokens=4, temperature=0, stop_at_eos=False)


def fresh_engine(models: Path) -> ModelEngine:
    return ModelEngine(load_base_model(resolve_base_model("tiny-gemma3", models), torch.device("cpu"), torch.float32))


def saved_sampler_weights(models: Path, folder: Path) -> Path:
    """Sampler weights of a trained adapter, saved by an engine that is then gone (a server that was killed)."""
    engine = fresh_engine(models)
    engine.create_adapter("trained", LoraSettings(rank=4, seed=1))
    ids = [1, 5, 9, 11, 4, 2]
    datum = DecodedDatum(
        model_input_tokens=ids[:-1],
        loss_fn_inputs={"target_tokens": torch.tensor(ids[1:]), "weights": torch.ones(len(ids) - 1)},
    )
    engine.forward_backward("trained", [datum], "cross_entropy", None, False)
    engine.optim_step("trained", AdamSettings(learning_rate=0.05))
    folder.mkdir()
    engine.save("trained", folder, include_optimizer=False)
    return folder


def test_a_request_for_saved_weights_does_not_join_a_generation_begun_before_any_adapter(tmp_path: Path) -> None:
    weights = saved_sampler_weights(tmp_path / "models", tmp_path / "sampler_weights")
    engine = fresh_engine(tmp_path / "models")
    on_saved = replace(ON_SAVED, weights_folder=weights)
    offered: list[bool] = []

    def admit(accepts: Callable[[SamplingRequest], bool]) -> Sequence[SamplingRequest]:
        if offered:
            return []
        offered.append(accepts(on_saved))
        return [on_saved] if offered[-1] else []

    (base,) = engine.sample_batch([BASE], admit=admit)

    assert offered == [False]
    assert len(base.sequences[0].tokens) == BASE.max_tokens
    # In a generation of its own, the request for the saved weights is served.
    (answered,) = engine.sample_batch([on_saved])
    assert len(answered.sequences[0].tokens) == ON_SAVED.max_tokens


def test_a_generation_begun_before_any_adapter_stays_on_the_base_model_when_one_loads_in_its_pause(
    tmp_path: Path,
) -> None:
    weights = saved_sampler_weights(tmp_path / "models", tmp_path / "sampler_weights")
    (alone,) = fresh_engine(tmp_path / "models").sample_batch([BASE])
    engine = fresh_engine(tmp_path / "models")
    nested: list[object] = []

    def pause() -> None:
        if not nested:
            nested.extend(engine.sample_batch([replace(ON_SAVED, weights_folder=weights)]))

    (paused,) = engine.sample_batch([BASE], pause)

    assert len(nested) == 1 and len(nested[0].sequences[0].tokens) == ON_SAVED.max_tokens
    assert paused.sequences[0].tokens == alone.sequences[0].tokens
