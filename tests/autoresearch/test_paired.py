"""McNemar's exact test of two held-out evaluations of the same questions."""

from __future__ import annotations

import pytest

from autoresearch.trials.paired import compare, mcnemar_exact_p
from tasks.report import HeldOutAnswer, HeldOutReport
from tasks.text2sql.dataset import Difficulty


def report(step: int, right: list[bool], ids: list[str] | None = None) -> HeldOutReport:
    ids = ids or [f"q{i}" for i in range(len(right))]
    answers = tuple(
        HeldOutAnswer(example_id=i, difficulty=Difficulty.EASY, completion="", correct=r)
        for i, r in zip(ids, right, strict=True)
    )
    return HeldOutReport(
        step=step, split="dev", accuracy=sum(right) / len(right), accuracy_by_difficulty={}, answers=answers
    )


@pytest.mark.parametrize(
    ("gained", "lost", "p_value"),
    [
        (0, 0, 1.0),
        (10, 0, 2 / 1024),
        # 2 * P(X <= 5), X ~ Binomial(17, 1/2) = 2 * 9402 / 131072
        (12, 5, 2 * 9402 / 131072),
        (5, 12, 2 * 9402 / 131072),
        (3, 3, 1.0),
    ],
)
def test_the_exact_p_value_is_the_two_sided_binomial_tail(gained: int, lost: int, p_value: float) -> None:
    assert mcnemar_exact_p(gained, lost) == pytest.approx(p_value)


def test_comparison_counts_questions_that_changed_either_way() -> None:
    before = report(0, [True, False, False, True, False])
    after = report(30, [True, True, True, False, False])
    comparison = compare(before, after)
    assert (comparison.gained, comparison.lost, comparison.questions) == (2, 1, 5)
    assert comparison.gain == pytest.approx(0.2)
    assert comparison.p_value == pytest.approx(1.0)


def test_evaluations_of_different_questions_are_not_compared() -> None:
    with pytest.raises(ValueError, match="same held-out questions"):
        compare(report(0, [True, False]), report(5, [True, False], ids=["q0", "q9"]))
