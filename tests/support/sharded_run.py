"""A scripted series of engine calls on a tiny model, made by one plain engine or by a sharded group (this process
leads; it starts the followers), with what they computed saved for the tests to compare, and the bytes of the base
model's decoder layers that the (leading) process holds before any adapter exists.

Both run forward/backward in micro-batches of about 40 tokens, so that a pass takes several, and a group's shares
(`sharding/data_parallel.py`) take different numbers of them.

Run: python tests/support/sharded_run.py MODEL_FOLDER SHARDS OUT_FOLDER
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch.distributed.tensor import DTensor
from transformers import AutoConfig

from trainer_backend.engine.microbatches import activation_bytes_per_token
from trainer_backend.engine.model_engine import ModelEngine
from trainer_backend.engine.types import (
    AdamSettings,
    DecodedDatum,
    ForwardBackwardCall,
    LoraSettings,
    SamplingRequest,
    SamplingResult,
)
from trainer_backend.models.loading import load_base_model
from trainer_backend.models.registry import resolve_base_model
from trainer_backend.sharding.group import ShardPlace, free_port, start_followers
from trainer_backend.sharding.replica import LeaderEngine
from trainer_backend.sharding.shard_model import decoder_layers, resident_weight_bytes
from trainer_backend.sharding.shards import EngineSettings, sharded_engine
from trainer_backend.structured_output import JsonSchemaConstraints

PROMPT = (5, 9, 14, 3, 22, 7, 30, 11)
# Long enough for the data that begin with it to be computed through it once (`engine/prefixes.py`).
SYSTEM = tuple(range(60, 84))
PIECE_TOKENS = 40


def datum(tokens: list[int], advantage: float | None = None) -> DecodedDatum:
    inputs = {"target_tokens": torch.tensor(tokens[1:]), "weights": torch.ones(len(tokens) - 1)}
    if advantage is not None:
        inputs = {
            "target_tokens": torch.tensor(tokens[1:]),
            "logprobs": -torch.ones(len(tokens) - 1),
            "advantages": torch.full((len(tokens) - 1,), advantage),
        }
    return DecodedDatum(tokens[:-1], inputs)


def system_datum(user: list[int], completion: list[int]) -> DecodedDatum:
    """A completion after the shared system prompt and a user turn, trained on the completion alone: nothing of the
    shared prefix has a gradient of its own, only through its keys and values."""
    tokens = [*SYSTEM, *user, *completion]
    weights = torch.zeros(len(tokens) - 1)
    weights[len(SYSTEM) + len(user) - 1 :] = 1
    return DecodedDatum(tokens[:-1], {"target_tokens": torch.tensor(tokens[1:]), "weights": weights})


def script(engine: ModelEngine | LeaderEngine, out: Path) -> dict:
    """The calls, and what each computed."""
    results: dict = {}
    torch.manual_seed(0)  # the adapters' initial weights come from the global generator
    engine.create_adapter("a", LoraSettings(rank=4))
    engine.create_adapter("b", LoraSettings(rank=2, train_mlp=False))
    sequences = [[*PROMPT, 40 + i, 41 + i, 12 + i] for i in range(4)]
    first = engine.forward_backward_batch(
        [
            ForwardBackwardCall("a", [datum(s) for s in sequences], "cross_entropy", None, False),
            ForwardBackwardCall("b", [datum(s, 0.5) for s in sequences[:2]], "importance_sampling", None, False),
            ForwardBackwardCall("a", [], "cross_entropy", None, False),  # refused: no datums
            ForwardBackwardCall("b", [datum(s, -0.7) for s in sequences[1:4]], "ppo", None, False),
            ForwardBackwardCall("b", [datum(s, 0.3) for s in sequences[2:]], "cispo", None, False),
            ForwardBackwardCall("b", [datum(s, 1.1) for s in sequences[:3]], "dro", None, False),
            ForwardBackwardCall("b", [datum(s) for s in sequences[1:]], "cross_entropy", None, True),
        ]
    )
    # Alone in its batch, a prompt's six completions are more than one process's share: they are split.
    users = [[90 + i, 91 + i, 92] for i in range(6)]
    second = engine.forward_backward_batch(
        [
            ForwardBackwardCall(
                "a", [system_datum(u, [40 + i, 12, 13, 14]) for i, u in enumerate(users)], "cross_entropy", None, False
            )
        ]
    )
    computed = [first[0], first[1], *first[3:], *second]
    results["refused"] = type(first[2]).__name__
    results["fb_logprobs"] = [o["logprobs"] for outcome in computed for o in outcome.loss_fn_outputs]
    results["fb_loss"] = [outcome.metrics["loss:sum"] for outcome in computed]
    engine.optim_step("a", AdamSettings(learning_rate=1e-2))
    engine.optim_step("b", AdamSettings(learning_rate=1e-2))
    for name in ("a", "b"):
        (out / name).mkdir()
        engine.save(name, out / name, False)
        results[f"saved_{name}"] = load_file(out / name / "adapter_model.safetensors")

    paused: list[int] = []
    taken: list[int] = []
    # Taken in under a JSON constraint (structured output): the followers make it again from its grammar.
    constraints = JsonSchemaConstraints(engine.loaded.tokenizer, engine.loaded.vocab_size)
    extra = SamplingRequest(
        PROMPT[:5], num_samples=2, max_tokens=4, temperature=1.0, seed=11, constraint=constraints.for_schema(None, "")
    )

    def pause() -> None:
        # Another tenant's training step inside the generation's pause, once.
        if not paused:
            engine.forward_backward_batch(
                [ForwardBackwardCall("b", [datum(sequences[2])], "cross_entropy", None, False)]
            )
            engine.optim_step("b", AdamSettings(learning_rate=1e-2))
        paused.append(1)

    def admit(accepts: object) -> list[SamplingRequest]:
        if taken or not accepts(extra):
            return []
        taken.append(1)
        return [extra]

    requests = [
        SamplingRequest(PROMPT, num_samples=3, max_tokens=6, temperature=1.0, seed=5, weights_folder=out / "a"),
        SamplingRequest(PROMPT[:6], num_samples=1, max_tokens=5, temperature=0.0),
        # No seed: the leader draws one, which every process repeats.
        SamplingRequest(PROMPT[:4], num_samples=2, max_tokens=5, temperature=1.0),
    ]
    sampled = engine.sample_batch(requests, pause, admit)
    results["taken_in"] = len(taken)
    results["sampled"] = [[s.tokens for s in o.sequences] for o in (sampled[0], sampled[1], sampled[3])]
    results["sampled_logprobs"] = [[s.logprobs for s in o.sequences] for o in (sampled[0], sampled[1], sampled[3])]
    results["unseeded_sampled"] = all(isinstance(o, SamplingResult) for o in sampled)
    results["constrained_texts"] = [engine.loaded.tokenizer.decode(s.tokens) for s in sampled[3].sequences]
    scored = engine.sample_batch(
        [SamplingRequest((*PROMPT, 40 + i), max_tokens=1, seed=1, prompt_logprobs=True) for i in range(3)]
    )
    results["prompt_logprobs"] = [o.prompt_logprobs[1:] for o in scored]
    engine.load("c", out / "a", False)
    (forward,) = engine.forward_backward_batch(
        [ForwardBackwardCall("c", [datum(sequences[0])], "cross_entropy", None, True)]
    )
    results["loaded_logprobs"] = forward.loss_fn_outputs[0]["logprobs"]
    return results


def main(folder: Path, shards: int, out: Path) -> None:
    resolved = resolve_base_model(str(folder), out / "cache")
    budget = PIECE_TOKENS * activation_bytes_per_token(AutoConfig.from_pretrained(resolved.folder), 4)
    settings = EngineSettings(
        base_model=str(folder),
        model_cache=out / "cache",
        device="cpu",
        dtype="float32",
        activation_budget=budget,
        spill_root=out / "spill",
    )
    if shards == 1:
        loaded = load_base_model(resolved, torch.device("cpu"), torch.float32)
        engine = settings.engine(loaded)
        layer_bytes = resident_weight_bytes(decoder_layers(loaded.model))
        results = script(engine, out)
    else:
        place = ShardPlace(0, shards, port=free_port())
        followers = start_followers(place, settings.arguments())
        group, local = sharded_engine(settings, place)
        leader = LeaderEngine(local, group, followers)
        layer_bytes = resident_weight_bytes(decoder_layers(local.loaded.model))
        results = script(leader, out)
        # Every layer's base weights back to their shard after all those calls: the memory stays saved.
        base = [p for name, p in decoder_layers(local.loaded.model).named_parameters() if "lora_" not in name]
        results["resharded_after"] = all(isinstance(p, DTensor) for p in base)
        leader.close()
    results["layer_bytes"] = layer_bytes
    torch.save(results, out / "results.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
