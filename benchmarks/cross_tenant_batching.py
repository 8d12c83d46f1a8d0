"""What mixing adapters in one device call costs: the same work on 4 different adapters vs on one adapter.

Run: python -m benchmarks.cross_tenant_batching [--model google/gemma-3-270m] [--device cpu] [--repeats 2]
     [--vllm-python PATH]

1. Sampling: 8 requests × 2 samples × 32 new tokens (no early stop) in one generation batch, every request on
   one adapter, then two requests on each of 4 adapters: tokens/s and the ratio mixed ÷ one adapter
   (target ≥ 0.8). For scale, the same 8 requests one at a time.
2. forward_backward (cross-entropy, every token weighted): 4 calls × 2 datums × 128 tokens in one pass, all on one
   adapter's data (one call of 8 datums), then one call per adapter: tokens/s and the ratio. For scale, the 4
   calls one at a time.

Adapters are LoRA rank 8 on attention and MLP, trained one step so that none is zero. Each figure is the best
of `--repeats` runs after a warm-up. With `--vllm-python` (the interpreter of vLLM's environment) the sampling row is
measured again through vLLM (`--sampler vllm`: the same adapters hot-loaded, the 8 requests sent at once, vLLM
batching them) and printed beside the built-in engine's.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from benchmarks import command_line
from trainer_backend.engine.model_engine import ModelEngine
from trainer_backend.engine.types import (
    AdamSettings,
    DecodedDatum,
    ForwardBackwardCall,
    LoraSettings,
    SamplingRequest,
)
from trainer_backend.engine.weights_proof import WeightChecks, probe_tokens
from trainer_backend.models.loading import dtype_name, load_base_model, select_device
from trainer_backend.models.registry import default_cache_root, resolve_base_model
from trainer_backend.samplers.vllm_client import VllmClient
from trainer_backend.samplers.vllm_process import VllmSettings

ADAPTERS = 4


def best_rate(work: Callable[[], int], repeats: int) -> float:
    """Tokens per second of `work` (which returns the tokens it processed), best of `repeats` after a warm-up."""
    work()
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = work()
        rates.append(tokens / (time.perf_counter() - start))
    return max(rates)


def random_datum(generator: torch.Generator, tokens: int, vocab: int) -> DecodedDatum:
    ids = torch.randint(10, min(20_000, vocab), (tokens + 1,), generator=generator)
    return DecodedDatum(ids[:-1].tolist(), {"target_tokens": ids[1:], "weights": torch.ones(tokens)})


def vllm_rates(loaded, folders: list[Path], prompts: list, args, scratch: Path):
    """Tokens/s of the sampling row through vLLM: one adapter, the adapters mixed, one request at a time."""
    settings = VllmSettings(
        model_folder=loaded.folder,
        served_name=loaded.name,
        python=args.vllm_python,
        max_loras=ADAPTERS,
        max_lora_rank=8,
        log_path=scratch / "vllm.log",
        device=loaded.device.type,
    )
    sampler = VllmClient(
        settings,
        lambda ids: loaded.tokenizer.decode(ids, skip_special_tokens=False),
        WeightChecks(dtype_name(loaded.model.dtype)),
        probe_tokens(loaded.tokenizer),
    )
    try:
        for folder in folders:
            sampler.load_adapter(folder)
        adapters = folders

        def request(index: int, prompt: tuple[int, ...], adapter: Path) -> int:
            sampling = SamplingRequest(
                prompt, num_samples=2, max_tokens=args.new_tokens, seed=index, stop_at_eos=False, weights_folder=adapter
            )
            return sum(len(s.tokens) for s in sampler.sample(sampling).sequences)

        def at_once(chosen: list[Path]) -> Callable[[], int]:
            def run() -> int:
                with ThreadPoolExecutor(len(prompts)) as pool:
                    return sum(pool.map(request, range(len(prompts)), prompts, chosen))

            return run

        def one_at_a_time() -> int:
            return sum(request(i, p, adapters[i % ADAPTERS]) for i, p in enumerate(prompts))

        one = best_rate(at_once([adapters[0]] * len(prompts)), args.repeats)
        mixed = best_rate(at_once([adapters[i % ADAPTERS] for i in range(len(prompts))]), args.repeats)
        return one, mixed, best_rate(one_at_a_time, args.repeats)
    finally:
        sampler.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="google/gemma-3-270m")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--datum-tokens", type=int, default=128)
    parser.add_argument("--vllm-python", type=Path, help="also sample through vLLM, started with this interpreter")
    args = parser.parse_args()

    from rich.console import Console
    from rich.table import Table

    console = Console(width=120)
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="cross-tenant-") as scratch, console.status("measuring"):
        loaded = load_base_model(resolve_base_model(args.model, default_cache_root()), select_device(args.device))
        engine = ModelEngine(loaded)
        names = [f"tenant-{i}" for i in range(ADAPTERS)]
        folders = []
        for i, name in enumerate(names):
            engine.create_adapter(name, LoraSettings(rank=8, seed=i))
            engine.forward_backward(
                name, [random_datum(generator, 16, loaded.vocab_size)], "cross_entropy", None, False
            )
            engine.optim_step(name, AdamSettings(learning_rate=1e-3))
            folder = Path(scratch) / name
            folder.mkdir()
            engine.save(name, folder, include_optimizer=False)
            folders.append(folder)

        prompts = [
            tuple(torch.randint(10, min(20_000, loaded.vocab_size), (48,), generator=generator).tolist())
            for _ in range(8)
        ]

        def sampling(weights: list[Path]) -> Callable[[], int]:
            requests = [
                SamplingRequest(
                    p, num_samples=2, max_tokens=args.new_tokens, seed=i, stop_at_eos=False, weights_folder=folder
                )
                for i, (p, folder) in enumerate(zip(prompts, weights, strict=True))
            ]

            def together() -> int:
                return sum(len(s.tokens) for r in engine.sample_batch(requests) for s in r.sequences)

            return together

        def sampling_one_at_a_time() -> int:
            requests = [
                SamplingRequest(p, 2, args.new_tokens, stop_at_eos=False, weights_folder=folders[i % ADAPTERS])
                for i, p in enumerate(prompts)
            ]
            return sum(len(s.tokens) for r in requests for s in engine.sample_batch([r])[0].sequences)

        sample_one = best_rate(sampling([folders[0]] * len(prompts)), args.repeats)
        sample_mixed = best_rate(sampling([folders[i % ADAPTERS] for i in range(len(prompts))]), args.repeats)
        sample_serial = best_rate(sampling_one_at_a_time, args.repeats)
        through_vllm = (
            vllm_rates(loaded, folders, prompts, args, Path(scratch)) if args.vllm_python is not None else None
        )

        datums = [random_datum(generator, args.datum_tokens, loaded.vocab_size) for _ in range(2 * ADAPTERS)]
        tokens = len(datums) * args.datum_tokens

        def passes(calls: list[ForwardBackwardCall]) -> Callable[[], int]:
            def run() -> int:
                engine.forward_backward_batch(calls)
                for name in names:
                    for param in engine.adapters.parameters(name):
                        param.grad = None
                return tokens

            return run

        per_adapter = [
            ForwardBackwardCall(name, datums[2 * i : 2 * i + 2], "cross_entropy", None, False)
            for i, name in enumerate(names)
        ]
        train_one = best_rate(
            passes([ForwardBackwardCall(names[0], datums, "cross_entropy", None, False)]), args.repeats
        )
        train_mixed = best_rate(passes(per_adapter), args.repeats)

        def one_pass_at_a_time() -> int:
            for call in per_adapter:
                passes([call])()
            return tokens

        train_serial = best_rate(one_pass_at_a_time, args.repeats)

    table = Table(title=f"{args.model}, {ADAPTERS} adapters (LoRA rank 8), {args.device}")
    table.add_column("work")
    table.add_column("one adapter, tok/s", justify="right")
    table.add_column(f"{ADAPTERS} adapters mixed, tok/s", justify="right")
    table.add_column("mixed ÷ one (target ≥ 0.8)", justify="right")
    table.add_column("requests one at a time, tok/s", justify="right")
    table.add_row(
        f"sampling 8 requests × 2 × {args.new_tokens} tokens",
        f"{sample_one:.1f}",
        f"{sample_mixed:.1f}",
        f"{sample_mixed / sample_one:.2f}",
        f"{sample_serial:.1f}",
    )
    if through_vllm is not None:
        one, mixed, serial = through_vllm
        table.add_row(
            f"the same sampling through vLLM ({args.device})",
            f"{one:.1f}",
            f"{mixed:.1f}",
            f"{mixed / one:.2f}",
            f"{serial:.1f}",
        )
    table.add_row(
        f"forward_backward {len(datums)} × {args.datum_tokens} tokens",
        f"{train_one:.0f}",
        f"{train_mixed:.0f}",
        f"{train_mixed / train_one:.2f}",
        f"{train_serial:.0f}",
    )
    console.print(table)
    console.print(command_line("benchmarks.cross_tenant_batching"))


if __name__ == "__main__":
    main()
