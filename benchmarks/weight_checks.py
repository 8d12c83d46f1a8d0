"""What checking sampler weights costs: each load's check (trainer_backend/engine/weights_proof.py) against the load.

Run: python -m benchmarks.weight_checks [--model google/gemma-3-270m] [--dtype auto] [--rank 16]
     [--learning-rate 1e-5] [--versions 5] [--vllm-python PATH]

One adapter (LoRA on attention and MLP, not the unembedding, as an RL trial trains it) takes one Adam step of
cross-entropy before each of `--versions` saves, so every version holds other weights. For each save: the save and
its proof (the hash, and the probe through the adapter). Each version is then loaded as sampler weights the way a
request loads them (`SamplerAdapters.use`): the load, and its check (the hash of the adapter in memory, the probe
through it; the base model's probe is computed once, on the first load, and shown apart). Medians over the versions
after the first. With `--vllm-python` the same versions are loaded into vLLM (`VllmClient.load_adapter`: its load
request, then the check: the file's hash, vLLM's probe through the adapter), and the largest gap between vLLM's move
of the probe and the trainer's is printed, beside what the check allows (`WeightChecks.allowed_apart`).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import torch

from trainer_backend.engine.model_engine import ModelEngine
from trainer_backend.engine.types import AdamSettings, DecodedDatum, LoraSettings
from trainer_backend.engine.weights_proof import (
    MIN_EFFECT_NATS,
    PROOF_FILE,
    AdapterProof,
    SamplerWeightsError,
    WeightChecks,
    largest_move,
    probe_tokens,
)
from trainer_backend.models.loading import dtype_name, load_base_model, select_device, select_dtype
from trainer_backend.models.registry import default_cache_root, resolve_base_model
from trainer_backend.samplers.vllm_client import VllmClient
from trainer_backend.samplers.vllm_process import VllmSettings

SQL = "Question: How many orders are there?\nSELECT COUNT(*) FROM orders;"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="google/gemma-3-270m")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto", help="what the base model computes in: auto, float32, bfloat16")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=1e-5)
    parser.add_argument("--versions", type=int, default=5)
    parser.add_argument("--vllm-python", type=Path, help="also load the versions into vLLM, started with this")
    args = parser.parse_args()

    from rich.console import Console
    from rich.table import Table

    console = Console(width=120)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="weight-checks-") as scratch, console.status("measuring") as status:
        device = select_device(args.device)
        resolved = resolve_base_model(args.model, default_cache_root())
        loaded = load_base_model(resolved, device, select_dtype(args.dtype, device))
        engine = ModelEngine(loaded)
        engine.create_adapter("trained", LoraSettings(rank=args.rank, seed=0, train_unembed=False))
        ids = loaded.tokenizer.encode(SQL)
        datum = DecodedDatum(ids[:-1], {"target_tokens": torch.tensor(ids[1:]), "weights": torch.ones(len(ids) - 1)})
        saves, proofs, folders = [], [], []
        for version in range(args.versions):
            status.update(f"saving version {version + 1} of {args.versions}")
            engine.forward_backward("trained", [datum], "cross_entropy", None, False)
            engine.optim_step("trained", AdamSettings(learning_rate=args.learning_rate))
            folder = Path(scratch) / "runs" / "bench" / "sampler_weights" / f"v{version}"
            folder.mkdir(parents=True)
            started = time.perf_counter()
            saved = engine.adapters.save("trained", folder, include_optimizer=False)
            saving = time.perf_counter() - started
            proof = engine.applied_weights.prove("trained", saved)
            saves.append((saving, time.perf_counter() - started - saving))
            (folder / PROOF_FILE).write_text(proof.model_dump_json())
            proofs.append(proof)
            folders.append(folder)

        builtin = []
        for version, folder in enumerate(folders):
            status.update(f"loading version {version + 1} on the built-in engine")
            before = engine.weight_checks.snapshot().seconds.get("builtin", 0.0)
            started = time.perf_counter()
            engine.sampler_adapters.use(folder)
            total = time.perf_counter() - started
            check = engine.weight_checks.snapshot().seconds["builtin"] - before
            builtin.append((total - check, check))

        vllm = vllm_loads(loaded, folders, proofs, args, Path(scratch), status) if args.vllm_python else None

    moves = [largest_move(p.probe_logprobs or (), p.base_probe_logprobs or ()) for p in proofs]
    dtype = dtype_name(loaded.model.dtype)
    table = Table(
        title=f"Checking sampler weights: {args.model} ({dtype}), LoRA rank {args.rank}, {loaded.device.type}"
    )
    for column in ("", "the work (ms)", "its check (ms)", "check ÷ work"):
        table.add_column(column, justify="right" if column else "left")

    def row(label: str, pairs: list[tuple[float, float]]) -> None:
        work, check = (statistics.median(p[i] for p in pairs[1:] or pairs) for i in (0, 1))
        table.add_row(label, f"{work * 1e3:.1f}", f"{check * 1e3:.1f}", f"{check / work:.2f}")

    row("save, and its proof", saves)
    row("built-in engine: load, and its check", builtin)
    table.add_row("  the first check, with the base model's probe", "", f"{builtin[0][1] * 1e3:.1f}", "")
    if vllm is not None:
        row("vLLM: load request, and its check", [(load.load_s, load.check_s) for load in vllm])
        table.add_row("  the first check, with the base model's probe", "", f"{vllm[0].check_s * 1e3:.1f}", "")
    console.print(table)
    console.print(
        f"The probe ({len(proofs[0].probe_tokens)} tokens) moves {min(moves):.1e} to {max(moves):.1e} nats from the "
        f"base model's over the versions (one Adam step at {args.learning_rate:g} each); a trained adapter must "
        f"move it by {MIN_EFFECT_NATS:.0e}."
    )
    if vllm is not None:
        versions = Table(title="vLLM against the trainer, per version (nats)")
        for column in ("version", "trainer's move", "vLLM's move", "apart", "allowed", "vLLM's load"):
            versions.add_column(column, justify="right")
        for version, load in enumerate(vllm):
            allowed = load.allowed
            versions.add_row(
                str(version + 1),
                f"{load.saved_move:.2e}",
                f"{load.vllm_move:.2e}",
                f"{load.apart:.2e}",
                f"{allowed:.2e}",
                load.outcome,
            )
        console.print(versions)


@dataclass(frozen=True)
class VllmLoad:
    """One version's load into vLLM: the load request's and the check's seconds, the largest move of the probe's
    answers from the base model's by the trainer (at the save) and by vLLM, how far apart the two moves are, and
    what the check said."""

    load_s: float
    check_s: float
    saved_move: float
    vllm_move: float
    apart: float
    allowed: float
    outcome: str


def vllm_loads(loaded, folders: list[Path], proofs: list[AdapterProof], args, scratch: Path, status) -> list[VllmLoad]:
    """Each version loaded into vLLM, as `load_adapter` loads and checks it, after its answers on the probe were
    measured under a name of their own (so that a refusal still shows how far apart they are)."""
    status.update("starting vLLM")
    settings = VllmSettings(
        model_folder=loaded.folder,
        served_name=loaded.name,
        python=args.vllm_python,
        max_loras=len(folders) + 1,
        max_lora_rank=args.rank,
        log_path=scratch / "vllm.log",
        device=loaded.device.type,
        dtype=dtype_name(loaded.model.dtype),
    )
    checks = WeightChecks(dtype_name(loaded.model.dtype))
    client = VllmClient(
        settings,
        lambda token_ids: loaded.tokenizer.decode(token_ids, skip_special_tokens=False),
        checks,
        probe_tokens(loaded.tokenizer),
    )
    try:
        loads = []
        base = prompt_logprobs(client, loaded.name, proofs[0].probe_tokens)
        for version, (folder, proof) in enumerate(zip(folders, proofs, strict=True)):
            status.update(f"loading version {version + 1} into vLLM")
            measuring = f"measure-{version}"
            httpx.post(f"{client.url}/v1/load_lora_adapter", json={"lora_name": measuring, "lora_path": str(folder)})
            through = prompt_logprobs(client, measuring, proof.probe_tokens)
            httpx.post(f"{client.url}/v1/unload_lora_adapter", json={"lora_name": measuring})
            moved = [a - b for a, b in zip(through, base, strict=True)]
            expected = [a - b for a, b in zip(proof.probe_logprobs or (), proof.base_probe_logprobs or (), strict=True)]
            before = checks.snapshot()
            started = time.perf_counter()
            try:
                client.load_adapter(folder)
                outcome = "passed"
            except SamplerWeightsError:
                refused = checks.snapshot().refused
                outcome = "refused: " + ", ".join(k[1] for k, n in refused.items() if n > before.refused.get(k, 0))
            total = time.perf_counter() - started
            check = checks.snapshot().seconds["vllm"] - before.seconds.get("vllm", 0.0)
            loads.append(
                VllmLoad(
                    total - check,
                    check,
                    largest_move(expected, [0.0] * len(expected)),
                    largest_move(moved, [0.0] * len(moved)),
                    largest_move(moved, expected),
                    checks.allowed_apart(proof),
                    outcome,
                )
            )
        return loads
    finally:
        client.close()


def prompt_logprobs(client: VllmClient, model: str, tokens: tuple[int, ...]) -> list[float]:
    """vLLM's log-probability of each probe token after the ones before it, through `model`."""
    body = {"model": model, "prompt": list(tokens), "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0}
    scores = httpx.post(f"{client.url}/v1/completions", json=body, timeout=120).json()["choices"][0]["prompt_logprobs"]
    return [score[str(token)]["logprob"] for token, score in zip(tokens[1:], scores[1:], strict=True)]


if __name__ == "__main__":
    main()
