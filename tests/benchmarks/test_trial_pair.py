"""The trial-pair benchmark's arithmetic: each trial's share of the device over windows of the backend's readings."""

from __future__ import annotations

import pytest

from benchmarks import trial_pair
from benchmarks.trial_pair import Reading, shares_over_windows


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
