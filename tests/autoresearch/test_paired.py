"""McNemar's exact test of two held-out evaluations of the same questions."""

from __future__ import annotations

import pytest

from autoresearch.trials.paired import compare, compare_by_form, mcnemar_exact_p
from tasks.errors import TaskError
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


def by_form(step: int, right: list[bool], forms: list[str | None]) -> HeldOutReport:
    answers = [
        HeldOutAnswer(example_id=f"q{i}", difficulty=Difficulty.EASY, completion="", correct=r, form=f)
        for i, (r, f) in enumerate(zip(right, forms, strict=True))
    ]
    return HeldOutReport.of(answers, "dev", list(Difficulty), step)


FORMS = ["seen", "seen", "unseen", "unseen", "unseen"]


def test_a_report_gives_seen_and_unseen_form_accuracy_apart_and_scores_either() -> None:
    report = by_form(3, [True, False, True, False, False], FORMS)
    assert report.accuracy_by_form == {"seen": 0.5, "unseen": pytest.approx(1 / 3)}
    assert report.counts_by_form("unseen") == (1, 3)
    assert report.score("held_out_accuracy") == pytest.approx(0.4)
    assert report.score("unseen_form_accuracy") == pytest.approx(1 / 3)


def test_questions_that_say_no_form_have_no_unseen_form_score() -> None:
    report = by_form(0, [True, False], [None, None])
    assert report.accuracy_by_form == {}
    with pytest.raises(TaskError, match="none of an unseen form"):
        report.score("unseen_form_accuracy")


def test_rl_is_compared_on_each_form_apart() -> None:
    before = by_form(0, [False, True, False, False, True], FORMS)
    after = by_form(8, [True, True, True, True, False], FORMS)
    comparisons = compare_by_form(before, after)
    assert (comparisons["seen"].gained, comparisons["seen"].lost, comparisons["seen"].questions) == (1, 0, 2)
    assert (comparisons["unseen"].gained, comparisons["unseen"].lost, comparisons["unseen"].questions) == (2, 1, 3)
    assert comparisons["unseen"].accuracy_before == pytest.approx(1 / 3)
    assert comparisons["unseen"].accuracy_after == pytest.approx(2 / 3)
    assert compare_by_form(by_form(0, [True], [None]), by_form(1, [False], [None])) == {}
