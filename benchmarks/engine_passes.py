"""An RL step's three engine passes, in process, on a shipped commit's engine and on this tree's, taking turns.

Run: python -m benchmarks.engine_passes [--model Qwen/Qwen2.5-Coder-0.5B-Instruct | google/gemma-3-270m]
     [--shipped HEAD] [--rounds 2]

`benchmarks.rl_step` times a whole step through a server, where the sampled completions (and so the work) differ
as soon as the trainers' rounding does, and the machine's speed drifts between the two servers' runs. This
benchmark holds the work fixed and takes turns: each round runs one process on `--shipped`'s engine, then one on
this tree's (the same script; only the import path differs). A process loads the model in the dtype `serve` picks,
makes a LoRA rank-16 adapter and times, after one untimed run of each:
- sampling: the recipe's 8 prompts (the trial's first batch, its prompt format) × its group of completions of at
  most its max tokens, at temperature 1, one generation batch through saved sampler weights;
- forward_backward: 8 prompts × the group with completions of seeded random lengths and tokens (12 to the max
  tokens), importance-sampling loss, advantages on the completions;
- reference scoring: the base model's log-probs of the same sequences, one `compute_logprobs` request each (prompt
  log-probs and one sampled token), as a trial with a KL penalty asks for them.
Prints each pass's median per engine, the ratio, and each process's peak resident memory.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# A worker runs this file with another tree's code first on its import path: it imports that tree's engine inside
# `_worker`, and nothing of this tree at the top.

PROMPTS = 8
TIMED_RUNS = 2


def _worker(model: str, group_size: int, max_tokens: int) -> dict:
    """The passes on the engine this process imports; their times in seconds and the peak resident memory."""
    import torch

    from autoresearch.trials.data import PromptRenderer, TrainingOrder, split_of
    from tasks.text2sql.task import Text2SqlTask
    from trainer_backend.engine.model_engine import ModelEngine
    from trainer_backend.engine.types import DecodedDatum, LoraSettings, SamplingRequest
    from trainer_backend.models.loading import load_base_model, select_dtype
    from trainer_backend.models.registry import default_cache_root, resolve_base_model

    cpu = torch.device("cpu")
    loaded = load_base_model(resolve_base_model(model, default_cache_root()), cpu, select_dtype("auto", cpu))
    engine = ModelEngine(loaded)
    engine.create_adapter("bench", LoraSettings(rank=16, train_mlp=True, train_attn=True, train_unembed=False))
    task = Text2SqlTask.bundled()
    renderer = PromptRenderer(task, loaded.tokenizer, 0, "train", prompt_format="auto")
    order = TrainingOrder(split_of(task, "train", "train_split"), 0)
    prompts = [renderer.prompt(example).tokens for example in order.batch(0, PROMPTS)]

    folder = Path(tempfile.mkdtemp(prefix="engine-passes-"))
    engine.save("bench", folder, False)
    requests = [
        SamplingRequest(tuple(p), group_size, max_tokens, temperature=1.0, seed=i, weights_folder=folder)
        for i, p in enumerate(prompts)
    ]
    generator = torch.Generator().manual_seed(0)
    datums, sequences = [], []
    for prompt in prompts:
        for length in torch.randint(12, max_tokens + 1, (group_size,), generator=generator).tolist():
            tokens = [*prompt, *torch.randint(10, 20_000, (length,), generator=generator).tolist()]
            sequences.append(tokens)
            advantages = torch.zeros(len(tokens) - 1)
            advantages[len(prompt) - 1 :] = 0.5
            inputs = {"target_tokens": torch.tensor(tokens[1:]), "logprobs": -torch.ones(len(tokens) - 1)}
            datums.append(DecodedDatum(tokens[:-1], {**inputs, "advantages": advantages}))

    def timed(run: object) -> list[float]:
        times = []
        for _ in range(TIMED_RUNS + 1):
            started = time.perf_counter()
            run()
            times.append(time.perf_counter() - started)
        return times[1:]

    sampled = engine.sample_batch(requests)
    sampling = timed(lambda: engine.sample_batch(requests))
    forward_backward = timed(lambda: engine.forward_backward("bench", datums, "importance_sampling", None, False))
    scoring_requests = [SamplingRequest(tuple(tokens), 1, 1, seed=0, prompt_logprobs=True) for tokens in sequences]
    scoring = timed(lambda: engine.sample_batch(scoring_requests))
    shutil.rmtree(folder)
    return {
        "sampling_s": sampling,
        "tokens_sampled": sum(len(s.tokens) for result in sampled for s in result.sequences),
        "forward_backward_s": forward_backward,
        "scoring_s": scoring,
        "peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


def _run_worker(tree: Path, model: str, group_size: int, max_tokens: int) -> dict:
    from benchmarks.against_commit import environment_for

    command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--model", model]
    command += ["--group-size", str(group_size), "--max-tokens", str(max_tokens)]
    done = subprocess.run(command, cwd=tree, env=environment_for(tree), capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="Qwen/Qwen2.5-Coder-0.5B-Instruct")
    parser.add_argument("--shipped", default="HEAD", help="the commit whose engine is compared with this tree's")
    parser.add_argument("--rounds", type=int, default=2, help="processes per engine, taking turns")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--group-size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--max-tokens", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(args.model, args.group_size, args.max_tokens)))
        return
    from rich.console import Console
    from rich.table import Table

    from benchmarks.against_commit import compared_trees
    from benchmarks.rl_step import RECIPES

    if args.model not in RECIPES:
        parser.error(f"--model must be one of {', '.join(sorted(RECIPES))}")
    recipe, shipped = RECIPES[args.model], args.shipped
    console = Console()
    runs: dict[str, list[dict]] = {}
    with compared_trees(shipped, f"shipped ({shipped})") as trees:
        for round_ in range(args.rounds):
            for tree in trees:
                console.print(f"round {round_ + 1}/{args.rounds}: {tree.name} …")
                runs.setdefault(tree.name, []).append(
                    _run_worker(tree.folder, args.model, recipe.group_size, recipe.max_tokens)
                )
    table = Table(title=f"{args.model}: {PROMPTS} prompts × {recipe.group_size} ≤ {recipe.max_tokens} tokens")
    for column in ("engine", "sampling s", "tokens sampled", "forward_backward s", "reference scoring s", "peak GiB"):
        table.add_column(column, justify="left" if column == "engine" else "right")
    medians = {}
    for name, measured in runs.items():
        sampling = statistics.median(t for run in measured for t in run["sampling_s"])
        training = statistics.median(t for run in measured for t in run["forward_backward_s"])
        scoring = statistics.median(t for run in measured for t in run["scoring_s"])
        medians[name] = (sampling, training, scoring)
        tokens = "/".join(str(run["tokens_sampled"]) for run in measured)
        peak = max(run["peak_gib"] for run in measured)
        table.add_row(name, f"{sampling:.1f}", tokens, f"{training:.1f}", f"{scoring:.1f}", f"{peak:.1f}")
    console.print(table)
    (old_sampling, old_training, old_scoring), (new_sampling, new_training, new_scoring) = medians.values()
    console.print(
        f"new ÷ shipped: sampling {new_sampling / old_sampling:.2f}, forward_backward {new_training / old_training:.2f}"
        f", reference scoring {new_scoring / old_scoring:.2f}"
    )
    console.print(f"command: python -m benchmarks.engine_passes --model {args.model} --shipped {shipped}")


if __name__ == "__main__":
    main()
