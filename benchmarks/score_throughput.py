"""How many completions per second the text-to-SQL scorer handles on this machine.

Run: python -m benchmarks.score_throughput [--split dev] [--workers 2] [--repeats 3]

The candidates mimic what an RL group produces for each question: the right query, the right query
followed by rambling, near misses (another constant, another case), a query over the wrong rows, and
text that is not SQL. Gold results are computed once before timing (they are cached in training too);
the cache of predicted results is off, so every candidate really executes. A last row scores the same
candidates again with the cache on: what repeated completions within an RL group cost.
"""

from __future__ import annotations

import argparse
import re
import time

from rich.console import Console
from rich.table import Table

from tasks.text2sql.dataset import Example
from tasks.text2sql.prompts import tables_used
from tasks.text2sql.reward.rewards import DEFAULT_REWARD_SPEC, ExecutionMatch, Format, Parses, ResultOverlap, RewardSpec
from tasks.text2sql.reward.scoring import Scorer, parses, schema_items
from tasks.text2sql.sources.bundled import load_bundled

RICH_SPEC = RewardSpec(
    components=(ExecutionMatch(), ResultOverlap(weight=0.2), Parses(weight=0.05), Format(weight=0.1))
)


def candidates_for(example: Example) -> list[str]:
    gold = example.gold_sql
    bumped = re.sub(r"\d+", lambda m: str(int(m.group()) + 1), gold, count=1)
    table = sorted(tables_used(gold))[0]
    return [
        f"{gold};",
        f"{gold};\nQuestion: How many rows are there?\nSQL: SELECT COUNT(*) FROM {table};",
        f"{bumped};",
        f"{gold.lower()};",
        f"SELECT * FROM {table};",
        "I would need to look at the data first.",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", default="dev")
    parser.add_argument("--workers", type=int, default=2, help="sandbox worker processes")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    console = Console(width=120)
    dataset = load_bundled()
    examples = dataset.split(args.split)
    items = [(e, c) for e in examples for c in candidates_for(e)]
    table = Table(
        title=f"scoring throughput on bundled/{args.split}, {len(items)} candidates, {args.workers} sandbox workers"
    )
    for column in ("reward spec", "best candidates/s", "median candidates/s", "accuracy of candidates"):
        table.add_column(column, justify="right")
    for name, spec in (
        ("default (match + format)", DEFAULT_REWARD_SPEC),
        ("match + overlap + parses + format", RICH_SPEC),
    ):
        rates = []
        for _ in range(args.repeats):
            parses.cache_clear()
            schema_items.cache_clear()
            with Scorer(dataset, result_cache_size=0, workers=args.workers) as scorer:
                for example in examples:
                    scorer.gold_results(example)
                start = time.perf_counter()
                scores = scorer.score_many(items, spec)
                rates.append(len(items) / (time.perf_counter() - start))
        rates.sort()
        accuracy = sum(s.correct for s in scores) / len(scores)
        table.add_row(name, f"{rates[-1]:,.0f}", f"{rates[len(rates) // 2]:,.0f}", f"{accuracy:.1%}")
    with Scorer(dataset, workers=args.workers) as scorer:
        scorer.score_many(items, DEFAULT_REWARD_SPEC)
        start = time.perf_counter()
        scorer.score_many(items, DEFAULT_REWARD_SPEC)
        repeated = len(items) / (time.perf_counter() - start)
    table.add_row("default, repeated completions (cache hits)", f"{repeated:,.0f}", "-", "-")
    console.print(table)
    console.print(
        "command: python -m benchmarks.score_throughput " + " ".join(f"--{k} {v}" for k, v in vars(args).items())
    )


if __name__ == "__main__":
    main()
