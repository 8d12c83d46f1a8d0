"""Did RL change held-out accuracy? Two evaluations of the same questions compared answer by answer.

McNemar's exact test: of the questions the two checkpoints disagree on, `gained` became right and `lost` became
wrong; with no real change each disagreement goes either way with probability 1/2, so the two-sided p-value is
the chance of a split at least this uneven under Binomial(gained + lost, 1/2).
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict

from tasks.report import HeldOutReport


class PairedComparison(BaseModel):
    """Held-out accuracy before and after, on the same questions, and McNemar's exact test of the difference."""

    model_config = ConfigDict(frozen=True)

    questions: int
    accuracy_before: float
    accuracy_after: float
    gained: int  # wrong before, right after
    lost: int  # right before, wrong after
    p_value: float

    @property
    def gain(self) -> float:
        return self.accuracy_after - self.accuracy_before

    def summary(self) -> str:
        """Gained, lost and the p-value as the benchmarks' tables show them: `+3/−16, p=0.0044`."""
        return f"+{self.gained}/−{self.lost}, p={self.p_value:.2g}"


def mcnemar_exact_p(gained: int, lost: int) -> float:
    """Two-sided exact p-value of `gained` against `lost` discordant pairs."""
    discordant = gained + lost
    if discordant == 0:
        return 1.0
    tail = sum(math.comb(discordant, k) for k in range(min(gained, lost) + 1)) / 2**discordant
    return min(1.0, 2 * tail)


def compare(before: HeldOutReport, after: HeldOutReport, form: str | None = None) -> PairedComparison:
    """Compare two evaluations question by question, all their questions or those of one `form` ("seen", "unseen").

    Raises:
        ValueError: the reports are not of the same questions, or have none of `form`.
    """
    right_before = {a.example_id: a.correct for a in before.answers if form is None or a.form == form}
    right_after = {a.example_id: a.correct for a in after.answers if form is None or a.form == form}
    if right_before.keys() != right_after.keys():
        raise ValueError("the two evaluations are not of the same held-out questions")
    if not right_before:
        raise ValueError(f"the evaluations have no held-out question of form {form!r}")
    gained = sum(right_after[q] and not right_before[q] for q in right_before)
    lost = sum(right_before[q] and not right_after[q] for q in right_before)
    return PairedComparison(
        questions=len(right_before),
        accuracy_before=sum(right_before.values()) / len(right_before),
        accuracy_after=sum(right_after.values()) / len(right_after),
        gained=gained,
        lost=lost,
        p_value=mcnemar_exact_p(gained, lost),
    )


def compare_by_form(before: HeldOutReport, after: HeldOutReport) -> dict[str, PairedComparison]:
    """`compare` on the questions of each form the evaluations have; empty when their questions say no form."""
    forms = [form for form, accuracy in after.accuracy_by_form.items() if accuracy is not None]
    return {form: compare(before, after, form) for form in forms}
