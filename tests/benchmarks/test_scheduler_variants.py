"""The scheduling variants the fairness and trial-pair benchmarks measure: each sets the one constant it names away
from the server's own, and an unknown one is refused with the list."""

from __future__ import annotations

import math
import sys
from types import ModuleType

import pytest

from benchmarks import scheduler_variants
from benchmarks.scheduler_variants import VARIANTS
from trainer_backend import scheduler, service
from trainer_backend.engine import sampling
from trainer_backend.samplers import builtin


@pytest.mark.parametrize(
    ("variant", "module", "constant", "value"),
    [
        ("twice-pause-share", scheduler, "PAUSE_SHARE_LIMIT", 2.0),
        ("no-pause-share-limit", scheduler, "PAUSE_SHARE_LIMIT", math.inf),
        ("join-within-budget", scheduler, "JOIN_BUDGET_LIMIT", 1.0),
        ("join-half-budget", scheduler, "JOIN_EVEN_SHARE_OF", 1.0),
        ("join-new-parties-only", scheduler, "JOIN_OWN_PARTY", False),
        ("join-regardless-of-recent-share", scheduler, "JOIN_WITHIN_RECENT_SHARE", False),
        ("no-gathering-window", builtin, "SAMPLING_BATCH_WINDOW_S", 0.0),
        ("whole-budget-prefill", builtin, "PREFILL_PASS_SHARE", 1.0),
        ("scores-taken-in", sampling, "TAKE_IN_PROMPT_SCORES", True),
        ("join-one-at-a-time", builtin, "SAME_PASS_SHARED_PREFIX", math.inf),
        ("passes-whole", service, "TRAINING_PASSES_PAUSE", False),
        ("pauses-by-call", scheduler, "PAUSE_SHARE_BY_PARTY", False),
    ],
)
def test_a_variant_sets_its_constant_away_from_the_servers(
    monkeypatch: pytest.MonkeyPatch, variant: str, module: ModuleType, constant: str, value: float
) -> None:
    monkeypatch.setattr(module, constant, getattr(module, constant))  # put back after the test
    assert getattr(module, constant) != value
    VARIANTS[variant]()
    assert getattr(module, constant) == value


def test_an_unknown_variant_is_refused_naming_the_known_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["scheduler_variants", "fastest", "serve"])
    with pytest.raises(SystemExit, match=r"unknown variant 'fastest'; the variants are .*twice-pause-share"):
        scheduler_variants.main()
