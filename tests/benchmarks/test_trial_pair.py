"""The trial-pair benchmark: each trial's share of the device over windows of the backend's readings, and the recipe
both trials run."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoresearch.errors import ConfigurationError
from benchmarks import trial_pair
from benchmarks.trial_pair import Reading, pair_configs, shares_over_windows


def readings(rates: list[tuple[float, float]], every_s: float = 10.0, idle: range = range(0)) -> list[Reading]:
    """Cumulative device seconds of the two trials read every `every_s`, each interval at the given rates; in the
    intervals numbered in `idle`, one trial had no request open on the device."""
    seconds = {"trial-1": 0.0, "trial-2": 0.0}
    found = [Reading(0.0, dict(seconds), 0 not in idle)]
    for index, (first, second) in enumerate(rates, start=1):
        seconds = {"trial-1": seconds["trial-1"] + first * every_s, "trial-2": seconds["trial-2"] + second * every_s}
        found.append(Reading(index * every_s, dict(seconds), index not in idle))
    return found


def test_an_even_split_is_found_even_and_a_stall_is_found_in_the_window_that_holds_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(trial_pair, "WINDOW_S", 30.0)
    even = shares_over_windows(readings([(0.5, 0.5)] * 9), until=90.0)
    assert even is not None and even.worst_deviation == pytest.approx(0.0) and even.windows == 7
    # Trial 1 gets nothing for 30 s in the middle: the window over those 30 s is all trial 2's.
    stalled = shares_over_windows(readings([(0.5, 0.5)] * 3 + [(0.0, 1.0)] * 3 + [(0.5, 0.5)] * 3), until=90.0)
    assert stalled is not None and stalled.worst_deviation == pytest.approx(0.5)


def test_only_readings_while_both_ran_count_and_a_short_run_is_one_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trial_pair, "WINDOW_S", 300.0)
    # Trial 2 ran on alone after 40 s, when trial 1 had ended: that time is not a share trial 1 was denied.
    shares = shares_over_windows(readings([(0.5, 0.5)] * 4 + [(0.0, 1.0)] * 6), until=40.0)
    assert shares is not None and shares.window_s == 40.0 and shares.windows == 1
    assert shares.worst_deviation == pytest.approx(0.0)
    assert shares_over_windows(readings([(0.5, 0.5)]), until=5.0) is None


def test_only_the_time_both_had_work_open_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trial_pair, "WINDOW_S", 30.0)
    # Trial 1 scored its samples on its own side for 30 s (no request open) while trial 2 had the device alone.
    rates = [(0.5, 0.5)] * 3 + [(0.0, 1.0)] * 3 + [(0.5, 0.5)] * 3
    shares = shares_over_windows(readings(rates, idle=range(3, 6)), until=90.0)
    assert shares is not None and shares.worst_deviation == pytest.approx(0.0)
    assert (shares.both_working_s, shares.span_s, shares.windows) == (60.0, 90.0, 4)
    # Never both with work open at once: nothing to judge.
    assert shares_over_windows(readings(rates, idle=range(10)), until=90.0) is None


def test_the_plot_draws_each_servers_window_shares(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(trial_pair, "WINDOW_S", 30.0)
    stalled = shares_over_windows(readings([(0.5, 0.5)] * 3 + [(0.0, 1.0)] * 3 + [(0.5, 0.5)] * 3), until=90.0)
    assert stalled is not None
    # Trial 1's share falls to nothing in the window that holds the stall, and is even again after it.
    assert [share for _, share in stalled.window_shares] == pytest.approx([0.5, 1 / 3, 1 / 6, 0.0, 1 / 6, 1 / 3, 0.5])
    judged = trial_pair.PairFigures({}, 90.0, 90.0, stalled, None, None)
    unjudged = trial_pair.PairFigures({}, 1.0, 1.0, None, None, None)  # a server whose trials never both had work
    path = tmp_path / "shares.png"
    trial_pair.plot_shares({"this tree": judged, "another": unjudged}, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_change_to_the_recipe_goes_to_both_trials_and_a_bad_one_is_refused_naming_it() -> None:
    first, second = pair_configs("tiny-gemma3", steps=3, eval_interval=2, eval_size=4, changes=["kl_coef=0.01"])
    assert first.kl_coef == second.kl_coef == 0.01
    assert (first.steps, first.eval_interval, second.eval_interval) == (3, 2, 0)
    with pytest.raises(ConfigurationError, match="kl_coef"):
        pair_configs("tiny-gemma3", steps=3, eval_interval=2, eval_size=4, changes=["kl_coef=lots"])
    with pytest.raises(ConfigurationError, match="expected FIELD=VALUE"):
        pair_configs("tiny-gemma3", steps=3, eval_interval=2, eval_size=4, changes=["kl_coef"])
