"""Training and sampling cost of the backend's engine on the real Gemma 3 270M.

Run: python -m benchmarks.backend_gemma [--device cpu] [--batch 8] [--tokens 128] [--repeats 2] [--vllm-python PATH]

1. forward_backward (cross-entropy, LoRA rank 8 on attention and MLP) + optim_step for batch × tokens, with the
   chunked log-prob path the server uses and with the naive full-logits path: seconds per step, and the extra
   peak memory of a step (resident set high-water mark above the resident set before it). The first step also
   pays one-time allocations (thread pools, allocator arenas); the steady-state figure is the best of the later
   steps, which is what a long-running server pays per step.
2. Sampling tokens per second at batch 1 and 8 (num_samples of one prompt, no early stop); with `--vllm-python`
   (the interpreter of vLLM's environment) the same requests through vLLM too, side by side (`--sampler vllm`).

Each measurement runs in a fresh process, so one path's allocations cannot hide the other's peak, with
MALLOC_MMAP_THRESHOLD_ set so that freed large buffers go back to the system instead of staying in glibc's heap
(otherwise the resident set never shrinks and later peaks are hidden).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from benchmarks.against_commit import run_module

if TYPE_CHECKING:
    from trainer_backend.engine.types import SamplingRequest, SamplingResult

MEASURE_FLAG = "--measure"


def _rss_peak_reset() -> None:
    # Writing 5 to clear_refs resets VmHWM (Linux), so the next peak is the step's own.
    Path("/proc/self/clear_refs").write_text("5")


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _sampling_rates(sample: Callable[[SamplingRequest], SamplingResult], tokens: int) -> dict[str, float]:
    """Tokens per second of `sample` at batch 1 and 8: num_samples of one prompt, tokens // 4 new tokens each."""
    from trainer_backend.engine.types import SamplingRequest

    generator = torch.Generator().manual_seed(0)
    prompt = tuple(torch.randint(10, 20_000, (32,), generator=generator).tolist())
    rates = {}
    for samples in (1, 8):
        request = SamplingRequest(
            prompt, num_samples=samples, max_tokens=tokens // 4, temperature=1.0, seed=0, stop_at_eos=False
        )
        sample(SamplingRequest(prompt, max_tokens=2, stop_at_eos=False))  # warm-up
        start = time.perf_counter()
        result = sample(request)
        elapsed = time.perf_counter() - start
        rates[f"batch {samples}"] = sum(len(s.tokens) for s in result.sequences) / elapsed
    return rates


def measure_vllm(device: str, tokens: int, vllm_python: Path) -> dict:
    """The 'sample' measurement's requests through a vLLM server started for it."""
    import tempfile

    from trainer_backend.models.gemma import GEMMA_3_270M
    from trainer_backend.models.loading import load_base_model, select_device
    from trainer_backend.models.registry import default_cache_root, resolve_base_model
    from trainer_backend.samplers.vllm_client import VllmClient
    from trainer_backend.samplers.vllm_process import VllmSettings

    loaded = load_base_model(resolve_base_model(GEMMA_3_270M, default_cache_root()), select_device(device))
    with tempfile.TemporaryDirectory(prefix="vllm-benchmark-") as scratch:
        settings = VllmSettings(
            model_folder=loaded.folder,
            served_name=loaded.name,
            python=vllm_python,
            log_path=Path(scratch) / "vllm.log",
            device=loaded.device.type,
        )
        sampler = VllmClient(settings, lambda ids: loaded.tokenizer.decode(ids, skip_special_tokens=False))
        try:
            rates = _sampling_rates(sampler.sample, tokens)
        finally:
            sampler.close()
    return {"tokens_per_s": rates}


def measure(kind: str, device: str, batch: int, tokens: int, repeats: int) -> dict:
    """One measurement, in this process: 'chunked', 'full' or 'sample'."""
    from trainer_backend.engine.model_engine import ModelEngine
    from trainer_backend.engine.types import AdamSettings, DecodedDatum, LoraSettings
    from trainer_backend.models.gemma import GEMMA_3_270M
    from trainer_backend.models.loading import load_base_model, select_device
    from trainer_backend.models.registry import default_cache_root, resolve_base_model

    torch.manual_seed(0)
    loaded = load_base_model(resolve_base_model(GEMMA_3_270M, default_cache_root()), select_device(device))
    engine = ModelEngine(loaded, chunked_logprobs=kind != "full")
    engine.create_adapter("bench", LoraSettings(rank=8, train_mlp=True, train_attn=True, train_unembed=False))
    if kind == "sample":
        return {"tokens_per_s": _sampling_rates(engine.sample, tokens)}
    generator = torch.Generator().manual_seed(0)
    datums = []
    for _ in range(batch):
        ids = torch.randint(10, 20_000, (tokens + 1,), generator=generator)
        datums.append(DecodedDatum(ids[:-1].tolist(), {"target_tokens": ids[1:], "weights": torch.ones(tokens)}))
    adam = AdamSettings(learning_rate=1e-4)
    seconds, peaks = [], []
    for _ in range(repeats + 1):
        baseline = _rss_kib("VmRSS")
        _rss_peak_reset()
        start = time.perf_counter()
        engine.forward_backward("bench", datums, "cross_entropy", None, forward_only=False)
        engine.optim_step("bench", adam)
        seconds.append(time.perf_counter() - start)
        peaks.append((_rss_kib("VmHWM") - baseline) / 1024)
    return {"seconds": min(seconds[1:]), "first_peak_mib": peaks[0], "extra_peak_mib": min(peaks[1:])}


def _in_subprocess(kind: str, args: argparse.Namespace) -> dict:
    arguments = [MEASURE_FLAG, kind, "--device", args.device, "--batch", str(args.batch)]
    arguments += ["--tokens", str(args.tokens), "--repeats", str(args.repeats)]
    if args.vllm_python is not None:
        arguments += ["--vllm-python", str(args.vllm_python)]
    return run_module("benchmarks.backend_gemma", arguments, environment={"MALLOC_MMAP_THRESHOLD_": "65536"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(MEASURE_FLAG, choices=["chunked", "full", "sample", "sample-vllm"], help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--vllm-python", type=Path, help="also sample through vLLM, started with this interpreter")
    args = parser.parse_args()
    if args.measure == "sample-vllm":
        print(json.dumps(measure_vllm(args.device, args.tokens, args.vllm_python)))
        return
    if args.measure:
        print(json.dumps(measure(args.measure, args.device, args.batch, args.tokens, args.repeats)))
        return

    from rich.console import Console
    from rich.table import Table

    console = Console(width=120)
    with console.status("measuring (each in a fresh process, a few minutes on 2 CPU cores)"):
        chunked = _in_subprocess("chunked", args)
        full = _in_subprocess("full", args)
        sampling = _in_subprocess("sample", args)
        through_vllm = _in_subprocess("sample-vllm", args) if args.vllm_python is not None else None
    table = Table(title=f"Gemma 3 270M, LoRA rank 8, {args.batch} × {args.tokens} tokens, {args.device}")
    table.add_column("forward_backward + optim_step")
    table.add_column("seconds", justify="right")
    table.add_column("extra peak MiB, steady state", justify="right")
    table.add_column("extra peak MiB, first step", justify="right")
    for name, figures in (("chunked log-probs (server)", chunked), ("full logits (naive)", full)):
        table.add_row(
            name,
            f"{figures['seconds']:.2f}",
            f"{figures['extra_peak_mib']:,.0f}",
            f"{figures['first_peak_mib']:,.0f}",
        )
    table.add_row(
        "ratio chunked / naive",
        f"{chunked['seconds'] / full['seconds']:.2f}",
        f"{chunked['extra_peak_mib'] / full['extra_peak_mib']:.2f}",
        f"{chunked['first_peak_mib'] / full['first_peak_mib']:.2f}",
    )
    console.print(table)
    rates = Table(title=f"sampling, {args.tokens // 4} new tokens per sequence")
    rates.add_column("batch")
    rates.add_column("built-in engine, tokens/s", justify="right")
    if through_vllm is not None:
        rates.add_column("vLLM, tokens/s", justify="right")
    for batch, rate in sampling["tokens_per_s"].items():
        vllm_rate = [] if through_vllm is None else [f"{through_vllm['tokens_per_s'][batch]:.1f}"]
        rates.add_row(batch, f"{rate:.1f}", *vllm_rate)
    console.print(rates)
    console.print(
        "command: python -m benchmarks.backend_gemma "
        f"--device {args.device} --batch {args.batch} --tokens {args.tokens} --repeats {args.repeats}"
    )


if __name__ == "__main__":
    main()
