"""What a batch-invariant held-out evaluation costs: a trial's evaluation batched, then batch-invariant, on one server.

Run: python -m benchmarks.batch_invariance [--trial experiments/trials/text2sql_gemma.yaml] [--eval-size 332]
     python -m benchmarks.batch_invariance --trial experiments/trials/text2sql_tiny.yaml   # the tiny model, seconds

The evaluation is the trial's own (`evaluate_checkpoint` of the base model: the trial's prompts, greedy, every
question sent at once) on the first `--eval-size` questions of its held-out split, with `eval_batch_invariant` off
(the server batches the questions, up to 64 rows a generation batch, prefilling a schema they share once) and on (each
question a generation batch of its own), on one `python -m trainer_backend serve` of the trial's base model, after a
warm-up evaluation of a few questions. Nothing else runs on the server, so the batched answers are the ones this
server gives that evaluation alone. Prints each wall time, their ratio, each accuracy and how many answers differ.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from autoresearch.sdk_logging import quiet_sdk_logs
from autoresearch.trials.backend import local_backend
from autoresearch.trials.config import TrialConfig, load_trial_config
from autoresearch.trials.evaluation import evaluate_checkpoint
from tasks.report import HeldOutReport

ROOT = Path(__file__).resolve().parents[1]
WARMUP_QUESTIONS = 4


def timed(config: TrialConfig, url: str) -> tuple[float, HeldOutReport]:
    started = time.perf_counter()
    report = evaluate_checkpoint(config, url)
    return time.perf_counter() - started, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--trial", type=Path, default=ROOT / "experiments" / "trials" / "text2sql_gemma.yaml", help="trial config"
    )
    parser.add_argument("--eval-size", type=int, default=332, help="held-out questions evaluated (dev: 332 in all)")
    args = parser.parse_args()
    quiet_sdk_logs()

    from rich.console import Console
    from rich.table import Table

    console = Console(width=120)
    config = load_trial_config(args.trial).model_copy(update={"eval_size": args.eval_size})
    runs: dict[str, tuple[float, HeldOutReport]] = {}
    with tempfile.TemporaryDirectory() as scratch, local_backend(config.base_model, Path(scratch)) as url:
        with console.status("warm-up"):
            timed(config.model_copy(update={"eval_size": WARMUP_QUESTIONS}), url)
        for name, invariant in (("batched", False), ("batch-invariant", True)):
            with console.status(f"{name}: {args.eval_size} questions on {config.base_model}"):
                runs[name] = timed(config.model_copy(update={"eval_batch_invariant": invariant}), url)
    table = Table(title=f"held-out evaluation of {config.base_model}, {args.eval_size} questions, greedy")
    for column in ("evaluation", "wall s", "questions/s", "execution accuracy"):
        table.add_column(column, justify="left" if column == "evaluation" else "right")
    for name, (seconds, report) in runs.items():
        table.add_row(name, f"{seconds:.1f}", f"{args.eval_size / seconds:.2f}", f"{report.accuracy:.1%}")
    console.print(table)
    (batched_s, batched), (invariant_s, invariant) = runs["batched"], runs["batch-invariant"]
    pairs = zip(batched.answers, invariant.answers, strict=True)
    differing = sum(a.completion != b.completion for a, b in pairs)
    ratio = invariant_s / batched_s
    console.print(f"wall time, batch-invariant ÷ batched: {ratio:.2f}; answers that differ: {differing}")
    console.print(f"command: python -m benchmarks.batch_invariance --trial {args.trial} --eval-size {args.eval_size}")


if __name__ == "__main__":
    main()
