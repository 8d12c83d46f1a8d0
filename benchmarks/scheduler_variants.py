"""The server with one of its scheduling mechanisms set otherwise, to measure what that mechanism costs or buys
(`python -m benchmarks.fairness --engine --variants …`). Each variant changes one module constant or switch of this
tree's code before the server starts; the server is otherwise the same.

Run: python -m benchmarks.scheduler_variants VARIANT serve [the flags of python -m trainer_backend serve]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Callable

from trainer_backend import scheduler, service
from trainer_backend.engine import sampling
from trainer_backend.operations import BatchKind
from trainer_backend.samplers import builtin


def _no_joining() -> None:
    # A running generation never has room for more rows: another tenant's requests nest in its pause instead.
    sampling.joinable_capacity = lambda cache: None


def _no_nesting() -> None:
    register = scheduler.Scheduler.register

    def without_nesting(self: scheduler.Scheduler, kind: BatchKind) -> None:
        register(self, dataclasses.replace(kind, nests=False))

    scheduler.Scheduler.register = without_nesting


def _no_pause_share_limit() -> None:
    scheduler.PAUSE_SHARE_LIMIT = math.inf


def _twice_pause_share() -> None:
    scheduler.PAUSE_SHARE_LIMIT = 2.0


def _no_gathering_window() -> None:
    builtin.SAMPLING_BATCH_WINDOW_S = 0.0


def _join_within_budget() -> None:
    scheduler.JOIN_BUDGET_LIMIT = 1.0


def _join_half_budget() -> None:
    scheduler.JOIN_EVEN_SHARE_OF = 1.0


def _join_new_parties_only() -> None:
    scheduler.JOIN_OWN_PARTY = False


def _join_regardless_of_recent_share() -> None:
    scheduler.JOIN_WITHIN_RECENT_SHARE = False


def _whole_budget_prefill() -> None:
    builtin.PREFILL_PASS_SHARE = 1.0


def _scores_taken_in() -> None:
    sampling.TAKE_IN_PROMPT_SCORES = True


def _join_one_at_a_time() -> None:
    builtin.SAME_PASS_SHARED_PREFIX = math.inf


def _passes_whole() -> None:
    service.TRAINING_PASSES_PAUSE = False


def _pauses_by_call() -> None:
    scheduler.PAUSE_SHARE_BY_PARTY = False


VARIANTS: dict[str, Callable[[], None]] = {
    "no-joining": _no_joining,  # nested batches only, as before joining
    "no-nesting": _no_nesting,  # what a generation cannot take in waits for its end
    "no-pause-share-limit": _no_pause_share_limit,  # others' work runs in every pause
    "twice-pause-share": _twice_pause_share,  # pauses lend others twice the time the call keeps (the limit before)
    "no-gathering-window": _no_gathering_window,  # a batch forms (or takes requests in) as soon as one is ready
    "join-within-budget": _join_within_budget,  # no tenant takes a running batch past its budget
    "join-half-budget": _join_half_budget,  # past the budget, a second tenant holds half a budget (the rule before)
    "join-new-parties-only": _join_new_parties_only,  # a call takes in only parties it has none of (the rule before)
    "join-regardless-of-recent-share": _join_regardless_of_recent_share,  # a party ahead in the call still joins
    "whole-budget-prefill": _whole_budget_prefill,  # a generation's first pass may prefill its whole budget (before)
    "scores-taken-in": _scores_taken_in,  # a generation takes prompt-scoring requests in, between two steps
    "join-one-at-a-time": _join_one_at_a_time,  # beside others, even questions over one schema join one by one (before)
    "passes-whole": _passes_whole,  # a training pass neither pauses nor parks when nested: it runs whole (before)
    "pauses-by-call": _pauses_by_call,  # pauses lent by the call's own time, whoever had it (the rule before)
}


def add_variants_option(parser: argparse.ArgumentParser, when: str = "") -> None:
    """`--variants`, as the benchmarks that measure servers take it; `when` prefixes its help ("with --engine: ")."""
    parser.add_argument(
        "--variants",
        nargs="*",
        default=[],
        choices=sorted(VARIANTS),
        help=f"{when}also measure this tree's server with each of these scheduling mechanisms set otherwise",
    )


def main() -> None:
    variant, *rest = sys.argv[1:]
    if variant not in VARIANTS:
        raise SystemExit(f"unknown variant {variant!r}; the variants are {', '.join(VARIANTS)}")
    VARIANTS[variant]()
    from trainer_backend.__main__ import main as serve_main

    sys.argv = ["trainer_backend", *rest]
    serve_main()


if __name__ == "__main__":
    main()
