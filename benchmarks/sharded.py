"""One process against a sharded group: the base weights each process holds and the time of an RL step's passes.

Run: python -m benchmarks.sharded [--model google/gemma-3-270m | Qwen/Qwen2.5-Coder-0.5B-Instruct | tiny-qwen2]
     [--shards 2] [--device cpu]

Each configuration runs in a process of its own (the sharded one leads followers it starts, as `serve --shards`
does), loads the model in the dtype `serve` picks, makes a rank-16 adapter and times, after one untimed run of each:
forward_backward of 8 prompts × 4 completions (256 + 32 tokens, seeded random ids, importance-sampling loss), the
optimizer step, and sampling 8 prompts × 4 completions of 32 tokens (temperature 1, seeded). Prints the decoder
layers' resident bytes per process, each pass's median (and the leading process's CPU time in it, which says what it
computed where other jobs share the CPU), and each process's peak resident memory: once the model is loaded (after a
one-token generation, whose gathers every process has made once it returns) and at the end.

Each process of a group computes its share of a forward_backward's datums, and every process the whole of a
generation (docs/sharding.md). On a CPU the processes share its cores and gather each layer's weights over gloo, so a
group is not expected to be faster here; on a GPU node each process has a GPU of its own and what the group adds is
the gathers of each layer's weights.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPTS, GROUP, PROMPT_TOKENS, COMPLETION_TOKENS = 8, 4, 256, 32
TIMED_RUNS = 2


def _peak_gib(pid: int | str = "self") -> float:
    """The peak resident memory (VmHWM) of process `pid` so far, in GiB; Linux only."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 2**20


def _worker(model: str, shards: int, device: str) -> dict:
    """The passes on one plain engine (`shards` 1) or on a group this process leads; times and bytes."""
    import torch

    from trainer_backend.engine.microbatches import ACTIVATION_BUDGET_BYTES
    from trainer_backend.engine.model_engine import ModelEngine
    from trainer_backend.engine.types import (
        AdamSettings,
        DecodedDatum,
        ForwardBackwardCall,
        LoraSettings,
        SamplingRequest,
    )
    from trainer_backend.models.loading import load_base_model, select_dtype
    from trainer_backend.models.registry import default_cache_root, resolve_base_model
    from trainer_backend.sharding.group import ShardPlace, free_port, start_followers
    from trainer_backend.sharding.replica import LeaderEngine
    from trainer_backend.sharding.shard_model import decoder_layers, resident_weight_bytes
    from trainer_backend.sharding.shards import EngineSettings, sharded_engine

    scratch = Path(tempfile.mkdtemp(prefix="sharded-bench-"))
    cache = default_cache_root()
    resolved = resolve_base_model(model, cache)  # converted once, before any follower looks for it
    processes: list[int | str] = ["self"]
    if shards == 1:
        target = torch.device(device)
        loaded = load_base_model(resolved, target, select_dtype("auto", target))
        engine = ModelEngine(loaded, spill_root=scratch / "spill")
        layers = decoder_layers(loaded.model)
    else:
        settings = EngineSettings(model, cache, device, "auto", ACTIVATION_BUDGET_BYTES, scratch / "spill")
        place = ShardPlace(0, shards, port=free_port())
        followers = start_followers(place, settings.arguments())
        processes += [process.pid for process in followers.processes]
        group, local = sharded_engine(settings, place)
        engine = LeaderEngine(local, group, followers)
        layers = decoder_layers(local.loaded.model)
    layer_bytes = resident_weight_bytes(layers)
    engine.sample_batch([SamplingRequest((10, 11), 1, 1, seed=0)])
    loaded_peaks = [_peak_gib(pid) for pid in processes]
    engine.create_adapter("bench", LoraSettings(rank=16))
    generator = torch.Generator().manual_seed(0)
    vocab = min(engine.loaded.vocab_size, 20_000)
    prompts = [torch.randint(10, vocab, (PROMPT_TOKENS,), generator=generator).tolist() for _ in range(PROMPTS)]
    datums = []
    for prompt in prompts:
        for _ in range(GROUP):
            tokens = prompt + torch.randint(10, vocab, (COMPLETION_TOKENS,), generator=generator).tolist()
            advantages = torch.zeros(len(tokens) - 1)
            advantages[len(prompt) - 1 :] = 0.5
            inputs = {"target_tokens": torch.tensor(tokens[1:]), "logprobs": -torch.ones(len(tokens) - 1)}
            datums.append(DecodedDatum(tokens[:-1], {**inputs, "advantages": advantages}))
    call = ForwardBackwardCall("bench", datums, "importance_sampling", None, False)
    requests = [
        SamplingRequest(tuple(p), GROUP, COMPLETION_TOKENS, temperature=1.0, seed=i, stop_at_eos=False)
        for i, p in enumerate(prompts)
    ]

    def timed(run: object) -> tuple[list[float], list[float]]:
        """The wall time of each timed run, and this process's CPU time in it (all its threads)."""
        times, cpu_times = [], []
        for _ in range(TIMED_RUNS + 1):
            started, cpu_started = time.perf_counter(), time.process_time()
            run()
            times.append(time.perf_counter() - started)
            cpu_times.append(time.process_time() - cpu_started)
        return times[1:], cpu_times[1:]

    forward_backward_s, forward_backward_cpu_s = timed(lambda: engine.forward_backward_batch([call]))
    sampling_s, sampling_cpu_s = timed(lambda: engine.sample_batch(requests))
    measured = {
        "forward_backward_s": forward_backward_s,
        "forward_backward_cpu_s": forward_backward_cpu_s,
        "optim_step_s": timed(lambda: engine.optim_step("bench", AdamSettings()))[0],
        "sampling_s": sampling_s,
        "sampling_cpu_s": sampling_cpu_s,
        "layer_bytes": layer_bytes,
        "loaded_peak_gib": loaded_peaks,
        "peak_gib": [_peak_gib(pid) for pid in processes],
    }
    engine.close()
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="google/gemma-3-270m")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        print(json.dumps(_worker(args.model, args.worker, args.device)))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    runs = {}
    for shards in (1, args.shards):
        console.print(f"{shards} process(es) …")
        command = [sys.executable, "-m", "benchmarks.sharded", "--model", args.model, "--device", args.device]
        done = subprocess.run([*command, "--worker", str(shards)], capture_output=True, text=True, check=True)
        runs[shards] = json.loads(done.stdout.strip().splitlines()[-1])
    table = Table(
        title=f"{args.model} on {args.device}: {PROMPTS} prompts × {GROUP}, {PROMPT_TOKENS} + {COMPLETION_TOKENS}"
    )
    for column in (
        "processes",
        "decoder layers / process",
        "forward_backward s",
        "optim_step s",
        "sampling s",
        "leader's CPU s: forward_backward / sampling",
        "peak GiB once loaded (each process)",
        "peak GiB (each process)",
    ):
        table.add_column(column, justify="right")
    for shards, run in runs.items():
        table.add_row(
            str(shards),
            f"{run['layer_bytes'] / 2**20:.1f} MiB",
            f"{statistics.median(run['forward_backward_s']):.2f}",
            f"{statistics.median(run['optim_step_s']):.3f}",
            f"{statistics.median(run['sampling_s']):.2f}",
            f"{statistics.median(run['forward_backward_cpu_s']):.1f} / {statistics.median(run['sampling_cpu_s']):.1f}",
            " / ".join(f"{peak:.2f}" for peak in run["loaded_peak_gib"]),
            " / ".join(f"{peak:.2f}" for peak in run["peak_gib"]),
        )
    console.print(table)
    console.print(
        f"command: python -m benchmarks.sharded --model {args.model} --shards {args.shards} --device {args.device}"
    )


if __name__ == "__main__":
    main()
