"""This machine's limits the way the engine uses it, and how close sampling and forward_backward come to them.

Run: python -m benchmarks.roofline [--model google/gemma-3-270m] [--device cpu] [--dtype auto] [--new-tokens 32]
     [--profile]

Any base model the server knows (`--model Qwen/Qwen2.5-Coder-0.5B-Instruct`: its chat prompts). Run it once per
model to put their fractions of the bound side by side.

1. GEMM GFLOP/s at the model's shapes (Gemma 3 270M: the 262,144 × 640 unembedding, the MLP and attention
   projections) in the dtype the engine computes in (`--dtype`, as `serve --dtype`: auto takes bf16 on CPUs with
   bf16 instructions), for a few row counts; the best is the machine's compute peak. In fp32, through both matmul
   libraries PyTorch has on a CPU (MKL, which `F.linear` calls, and oneDNN, which the engine calls on x86); in bf16,
   `F.linear` is oneDNN's. The unembedding is timed both as `F.linear` and as the engine's `unembedding_logits`.
   The decoder products in the other dtype are timed too, apart, for comparison (not in the bound).
2. Memory bandwidth: a large copy (read + write) and a large sum (read).
3. Sampling tokens/s at 1, 16 and 32 rows (one ~275-token prompt of the Gemma trial, `num_samples` rows, no stop),
   decode only (the prefill is timed apart and taken out), against the bound of a decode step: the larger of its
   FLOPs at the peak rate and the bytes it must read (every weight, the KV cache) at the read bandwidth.
4. forward_backward tokens/s of an RL step's batch (8 prompts × 4 completions of 48 tokens, importance sampling,
   advantages on the completions) against the FLOPs of the work it does at the peak rate: the decoder forward and
   its input gradients over the tokens computed (each shared prompt once), the LoRA gradients, and the unembedding
   (one matmul where no gradient flows, two where it does). With `--profile`, one more forward_backward under
   `torch.profiler`, its operators by their own time: where the time beyond the bound goes.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table
from torch.profiler import ProfilerActivity, profile

from autoresearch.trials.data import PromptRenderer, TrainingOrder, split_of
from tasks.text2sql.task import Text2SqlTask
from trainer_backend.engine.model_engine import ModelEngine
from trainer_backend.engine.onednn_linear import applies
from trainer_backend.engine.onednn_linear import linear as onednn_linear
from trainer_backend.engine.prefixes import shared_prefix_groups
from trainer_backend.engine.types import (
    DecodedDatum,
    LoraSettings,
    SamplingRequest,
)
from trainer_backend.engine.unembedding import unembedding_logits
from trainer_backend.models.gemma import GEMMA_3_270M
from trainer_backend.models.loading import DTYPES, dtype_name, load_base_model, select_device, select_dtype
from trainer_backend.models.registry import default_cache_root, resolve_base_model

LORA_RANK = 16


def best_seconds(work: Callable[[], object], repeats: int = 3) -> float:
    work()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def decoder_shapes(hidden: int, intermediate: int, attention: int) -> dict[str, tuple[int, int]]:
    """The decoder's linear products at the model's widths, by name, as (in, out)."""
    return {
        f"mlp up / gate ({hidden} → {intermediate})": (hidden, intermediate),
        f"mlp down ({intermediate} → {hidden})": (intermediate, hidden),
        f"attention q ({hidden} → {attention})": (hidden, attention),
    }


def linear_rates(
    k: int, n: int, project: Callable[[torch.Tensor, torch.Tensor], object], dtype: torch.dtype = torch.float32
) -> dict[int, float]:
    """GFLOP/s of `project(x, weight)`, an `[m, k] @ [k, n]` product, by row count m."""
    weight = torch.randn(n, k, dtype=dtype)
    by_rows = {}
    for rows in (32, 256, 1024):
        x = torch.randn(rows, k, dtype=dtype)
        by_rows[rows] = 2 * rows * k * n / best_seconds(lambda: project(x, weight)) / 1e9  # noqa: B023
    return by_rows


def gemm_rates(
    hidden: int, vocab: int, intermediate: int, attention: int, dtype: torch.dtype
) -> dict[str, dict[int, float]]:
    """GFLOP/s of `[m, k] @ [k, n]` products at the model's shapes in `dtype`, for several row counts m, through
    `F.linear` (MKL in fp32) and, where the engine routes it, oneDNN (fp32 on an x86 CPU)."""
    rates: dict[str, dict[int, float]] = {}
    unembedding = torch.randn(vocab, hidden, dtype=dtype)
    plain = "MKL" if dtype == torch.float32 else "F.linear"
    libraries = {plain: F.linear, "oneDNN": onednn_linear} if applies(unembedding) else {plain: F.linear}
    for name, (k, n) in decoder_shapes(hidden, intermediate, attention).items():
        for library, project in libraries.items():
            rates[f"{name}, {library}"] = linear_rates(k, n, project, dtype)
    for name, project in ((f"unembedding, {plain}", F.linear), ("unembedding, engine", unembedding_logits)):
        rates[name] = {}
        for rows in (1, 16, 32, 128):
            x = torch.randn(rows, hidden, dtype=dtype)
            seconds = best_seconds(lambda: project(x, unembedding))  # noqa: B023
            rates[name][rows] = 2 * rows * hidden * vocab / seconds / 1e9
    return rates


def decoder_rates(hidden: int, intermediate: int, attention: int, dtype: torch.dtype) -> dict[str, dict[int, float]]:
    """GFLOP/s of the decoder products in `dtype` through `F.linear`: the dtype the engine does not compute in, for
    comparison (not part of the bound below)."""
    shapes = decoder_shapes(hidden, intermediate, attention)
    return {name: linear_rates(k, n, F.linear, dtype) for name, (k, n) in shapes.items()}


def rates_table(title: str, rates: dict[str, dict[int, float]]) -> Table:
    """A table of GFLOP/s, a row per product and a column per row count."""
    table = Table(title=title)
    table.add_column("product")
    row_counts = sorted({rows for by_rows in rates.values() for rows in by_rows})
    for rows in row_counts:
        table.add_column(f"{rows} rows", justify="right")
    for name, by_rows in rates.items():
        table.add_row(name, *(f"{by_rows[r]:.0f}" if r in by_rows else "" for r in row_counts))
    return table


def bandwidths() -> dict[str, float]:
    source = torch.ones(2**28 // 4)
    target = torch.empty_like(source)
    copy_s = best_seconds(lambda: target.copy_(source))
    read_s = best_seconds(lambda: source.sum())
    return {"copy (read + write)": 2 * source.numel() * 4 / copy_s / 1e9, "read": source.numel() * 4 / read_s / 1e9}


def head_dim(config) -> int:
    """Width of one attention head: the config's own (Gemma sets it), else the hidden size over the heads."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def decode_bound(
    rows: int, context: int, linear_params: int, config, peak: float, read_gb_s: float, element_bytes: int
) -> float:
    """Tokens/s of a decode step at `rows` rows if it ran at the machine's limit, weights and KV cache of
    `element_bytes` each."""
    head = config.vocab_size * config.hidden_size
    kv_width = config.num_key_value_heads * head_dim(config)
    attention_flops = 2 * 2 * config.num_attention_heads * head_dim(config) * context * config.num_hidden_layers
    flops = rows * (2 * (linear_params + head) + attention_flops)
    kv_bytes = rows * config.num_hidden_layers * context * 2 * kv_width * element_bytes
    weight_bytes = (linear_params + head) * element_bytes
    seconds = max(flops / (peak * 1e9), (weight_bytes + kv_bytes) / (read_gb_s * 1e9))
    return rows / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=GEMMA_3_270M, help="a base model name or folder")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto", choices=["auto", *DTYPES], help="as `serve --dtype`")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument(
        "--profile", action="store_true", help="also print the operators that took forward_backward's time"
    )
    args = parser.parse_args()

    console = Console(width=120)
    torch.manual_seed(0)
    device = select_device(args.device)
    dtype = select_dtype(args.dtype, device)
    loaded = load_base_model(resolve_base_model(args.model, default_cache_root()), device, dtype)
    config = loaded.model.config
    attention = config.num_attention_heads * head_dim(config)
    with console.status("GEMM rates and memory bandwidth"):
        rates = gemm_rates(config.hidden_size, config.vocab_size, config.intermediate_size, attention, dtype)
        bandwidth = bandwidths()
    peak = max(max(by_rows.values()) for by_rows in rates.values())
    console.print(
        rates_table(
            f"{dtype_name(dtype)} GEMM GFLOP/s at {args.model}'s shapes ({torch.get_num_threads()} threads)", rates
        )
    )
    console.print(f"peak: {peak:.0f} GFLOP/s; " + "; ".join(f"{k} {v:.1f} GB/s" for k, v in bandwidth.items()))
    if loaded.device.type == "cpu":
        other = torch.float32 if dtype == torch.bfloat16 else torch.bfloat16
        with console.status(f"{dtype_name(other)} GEMM rates"):
            other_rates = decoder_rates(config.hidden_size, config.intermediate_size, attention, other)
        console.print(rates_table(f"{dtype_name(other)} GEMM GFLOP/s through F.linear, not in the bound", other_rates))

    engine = ModelEngine(loaded)
    engine.create_adapter("bench", LoraSettings(rank=LORA_RANK, train_mlp=True, train_attn=True, train_unembed=False))
    task = Text2SqlTask.bundled()
    renderer = PromptRenderer(task, loaded.tokenizer, 0, "train", prompt_format="auto")
    order = TrainingOrder(split_of(task, "train", "train_split"), 0)
    prompts = [renderer.prompt(e).tokens for e in order.batch(0, 8)]
    layers = loaded.model.model.layers
    linear_params = sum(m.weight.numel() for m in layers.modules() if isinstance(m, torch.nn.Linear))

    sampling = Table(title=f"sampling, base model, a {len(prompts[0])}-token prompt, {args.new_tokens} new tokens")
    for column in ("rows", "decode tokens/s", "bound tokens/s", "fraction of bound"):
        sampling.add_column(column, justify="right")
    with console.status("sampling at 1, 16 and 32 rows"):
        for rows in (1, 16, 32):
            prefill = SamplingRequest(
                prompts[0], num_samples=rows, max_tokens=1, temperature=1.0, seed=0, stop_at_eos=False
            )
            request = SamplingRequest(
                prompts[0], num_samples=rows, max_tokens=args.new_tokens, temperature=1.0, seed=0, stop_at_eos=False
            )
            prefill_s = best_seconds(lambda: engine.sample(prefill), repeats=2)  # noqa: B023
            total_s = best_seconds(lambda: engine.sample(request), repeats=2)  # noqa: B023
            rate = rows * (args.new_tokens - 1) / (total_s - prefill_s)
            context = len(prompts[0]) + args.new_tokens // 2
            bound = decode_bound(rows, context, linear_params, config, peak, bandwidth["read"], dtype.itemsize)
            sampling.add_row(str(rows), f"{rate:.1f}", f"{bound:.1f}", f"{rate / bound:.0%}")
    console.print(sampling)

    generator = torch.Generator().manual_seed(0)
    datums = []
    for prompt in prompts:
        for _ in range(4):
            completion = torch.randint(10, 20_000, (48,), generator=generator).tolist()
            tokens = [*prompt, *completion]
            n = len(tokens) - 1
            advantages = torch.zeros(n)
            advantages[len(prompt) - 1 :] = 0.5
            inputs = {"target_tokens": torch.tensor(tokens[1:]), "logprobs": -torch.ones(n), "advantages": advantages}
            datums.append(DecodedDatum(tokens[:-1], inputs))
    groups, alone = shared_prefix_groups([d.model_input_tokens for d in datums])
    computed = sum(
        g.prefix_length + sum(len(datums[i].model_input_tokens) - g.prefix_length for i in g.members) for g in groups
    )
    computed += sum(len(datums[i].model_input_tokens) for i in alone)
    datum_tokens = sum(len(d.model_input_tokens) for d in datums)
    live_rows = sum(int((d.loss_fn_inputs["advantages"] != 0).sum()) for d in datums)
    head = config.vocab_size * config.hidden_size
    lora_params = sum(p.numel() for p in engine.adapters.parameters("bench"))
    flops = computed * (2 * linear_params * 2 + 6 * lora_params) + 2 * head * (computed + live_rows)
    with console.status("forward_backward of an RL step's batch"):
        elapsed = best_seconds(
            lambda: engine.forward_backward("bench", datums, "importance_sampling", None, False), repeats=2
        )
        engine.adapters.optimizers["bench"].zero_grad(set_to_none=True)
    bound_s = flops / (peak * 1e9)
    training = Table(title="forward_backward, 8 prompts × 4 completions of 48 tokens, LoRA rank 16")
    for column in ("datum tokens", "tokens computed", "seconds", "datum tokens/s", "bound s", "fraction of bound"):
        training.add_column(column, justify="right")
    training.add_row(
        str(datum_tokens), str(computed), f"{elapsed:.1f}", f"{datum_tokens / elapsed:.0f}", f"{bound_s:.1f}",
        f"{bound_s / elapsed:.0%}",
    )  # fmt: skip
    console.print(training)
    if args.profile:
        with console.status("profiling one more forward_backward"), profile(activities=[ProfilerActivity.CPU]) as run:
            engine.forward_backward("bench", datums, "importance_sampling", None, False)
        console.out(run.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    console.print(
        f"command: python -m benchmarks.roofline --model {args.model} --device {args.device} --dtype {args.dtype} "
        f"--new-tokens {args.new_tokens}" + (" --profile" if args.profile else "")
    )


if __name__ == "__main__":
    main()
