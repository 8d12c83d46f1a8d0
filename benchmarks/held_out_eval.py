"""A trial's held-out evaluation on Gemma 3 270M, on the backend of an earlier commit and on this tree, in one run.

Run: python -m benchmarks.held_out_eval [--before HEAD] [--eval-size 128]

The evaluation is the trial's own (`evaluate_checkpoint`: the Gemma trial's zero-shot prompts of about 275 tokens,
greedy, at most 64 new tokens, every question sent at once) of the base model on the first `--eval-size` questions
of the dev split. The dev questions are over two databases, so most of each prompt is one of two schemas: the server
may prefill each schema once. The only difference between the two runs is the server: `--before` is checked out
into a temporary directory and its `python -m trainer_backend serve` runs from there.

Prints the wall time of each evaluation and their ratio, each backend's peak resident memory during it (sampled
twice a second), and checks that both servers gave the same answers (greedy decoding: any difference beyond float
rounding would change some answer).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from autoresearch.sdk_logging import quiet_sdk_logs
from autoresearch.trials.config import load_trial_config
from autoresearch.trials.evaluation import evaluate_checkpoint
from benchmarks.against_commit import MemoryWatch, compared_trees, server_from
from benchmarks.rl_step import RECIPES
from tasks.report import HeldOutReport
from trainer_backend.models.gemma import GEMMA_3_270M
from trainer_backend.models.registry import default_cache_root, resolve_base_model


@dataclass(frozen=True)
class Evaluation:
    seconds: float
    peak_gib: float  # the backend's resident memory at its highest, from its start to the evaluation's end
    report: HeldOutReport


def measure(tree: Path, workdir: Path, name: str, eval_size: int) -> Evaluation:
    folder = resolve_base_model(GEMMA_3_270M, default_cache_root()).folder
    trial = RECIPES[GEMMA_3_270M].trial
    # Batched on both servers: an earlier commit's server batches every request, whatever the session asks.
    update = {"eval_size": eval_size, "base_model": str(folder), "eval_batch_invariant": False}
    config = load_trial_config(trial).model_copy(update=update)
    with server_from(tree, workdir / f"{name}-backend", folder) as (url, server), MemoryWatch(server) as watch:
        started = time.perf_counter()
        report = evaluate_checkpoint(config, url)
        seconds = time.perf_counter() - started
    return Evaluation(seconds, watch.peak_bytes / 2**30, report)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default="HEAD", help="commit of the server to compare with")
    parser.add_argument("--eval-size", type=int, default=128, help="dev questions evaluated (332 in all)")
    args = parser.parse_args()
    quiet_sdk_logs()

    from rich.console import Console
    from rich.table import Table

    console = Console(width=120)
    with tempfile.TemporaryDirectory() as scratch:
        workdir = Path(scratch)
        results = {}
        with compared_trees(args.before, "before") as trees:
            for tree in trees:
                with console.status(f"{tree.name} server: evaluating {args.eval_size} dev questions on Gemma 3 270M"):
                    results[tree.name] = measure(tree.folder, workdir, tree.name, args.eval_size)
    table = Table(title=f"held-out evaluation, Gemma 3 270M base model, {args.eval_size} dev questions, greedy")
    for column in ("server", "wall s", "questions/s", "execution accuracy", "backend peak RSS"):
        table.add_column(column, justify="right" if column != "server" else "left")
    for name, run in results.items():
        label = f"before ({args.before})" if name == "before" else "this tree"
        table.add_row(
            label,
            f"{run.seconds:.1f}",
            f"{args.eval_size / run.seconds:.2f}",
            f"{run.report.accuracy:.1%}",
            f"{run.peak_gib:.1f} GiB",
        )
    console.print(table)
    before, new = results["before"], results["new"]
    pairs = zip(before.report.answers, new.report.answers, strict=True)
    differing = sum(a.completion != b.completion for a, b in pairs)
    console.print(f"wall time, new ÷ before: {new.seconds / before.seconds:.2f}; answers that differ: {differing}")
    console.print(f"command: python -m benchmarks.held_out_eval --before {args.before} --eval-size {args.eval_size}")


if __name__ == "__main__":
    main()
