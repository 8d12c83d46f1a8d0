"""The one report of held-out answers every task gives, whoever evaluates: a trial, a controller or a CLI."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tasks.errors import TaskError

# The forms a held-out question can have: whether training data asks questions of its form (its template family and
# phrasing) or not. Tasks whose data does not say give None.
FORMS = ("seen", "unseen")

# What a study can be judged on: all held-out questions, or only those of forms training never shows (transfer).
ScoreName = Literal["held_out_accuracy", "unseen_form_accuracy"]


class HeldOutAnswer(BaseModel):
    """One held-out question, the model's greedy completion and whether the task judged it correct."""

    model_config = ConfigDict(frozen=True)

    example_id: str
    difficulty: str
    completion: str
    correct: bool
    # "seen" or "unseen": whether training data asks questions of this form; None where the data does not say.
    form: str | None = None


def _accuracy(marks: Sequence[bool]) -> float | None:
    return sum(marks) / len(marks) if marks else None


class HeldOutReport(BaseModel):
    """Accuracy on held-out questions, overall, by difficulty and by form, with every answer."""

    model_config = ConfigDict(frozen=True)

    step: int = Field(0, description="RL steps the evaluated weights had taken; 0 for a model outside a trial")
    split: str
    accuracy: float
    # Every difficulty level of the task, in its order; None for a level the questions have none of.
    accuracy_by_difficulty: dict[str, float | None]
    # "seen" and "unseen" (None for a form the questions have none of); empty when no question says its form.
    accuracy_by_form: dict[str, float | None] = Field(default_factory=dict)
    answers: tuple[HeldOutAnswer, ...]

    @classmethod
    def of(cls, answers: Sequence[HeldOutAnswer], split: str, levels: Sequence[str], step: int = 0) -> HeldOutReport:
        """The report of `answers`, broken down by the task's difficulty `levels` and, where known, by form."""
        by_difficulty = {level: _accuracy([a.correct for a in answers if a.difficulty == level]) for level in levels}
        by_form = (
            {form: _accuracy([a.correct for a in answers if a.form == form]) for form in FORMS}
            if any(a.form is not None for a in answers)
            else {}
        )
        return cls(
            step=step,
            split=split,
            accuracy=_accuracy([a.correct for a in answers]) or 0.0,
            accuracy_by_difficulty=by_difficulty,
            accuracy_by_form=by_form,
            answers=tuple(answers),
        )

    def counts(self, difficulty: str) -> tuple[int, int]:
        """(correct, total) answers of one difficulty."""
        marks = [a.correct for a in self.answers if a.difficulty == difficulty]
        return sum(marks), len(marks)

    def counts_by_form(self, form: str) -> tuple[int, int]:
        """(correct, total) answers of one form."""
        marks = [a.correct for a in self.answers if a.form == form]
        return sum(marks), len(marks)

    def score(self, name: ScoreName) -> float:
        """The accuracy a study is judged on.

        Raises:
            TaskError: `unseen_form_accuracy` of questions none of which is of an unseen form.
        """
        return held_out_score(name, self.accuracy, self.accuracy_by_form)


def held_out_score(name: ScoreName, accuracy: float, accuracy_by_form: dict[str, float | None]) -> float:
    """`accuracy` or the unseen-form accuracy of `accuracy_by_form`, as `name` asks.

    Raises:
        TaskError: `unseen_form_accuracy` of questions none of which is of an unseen form.
    """
    if name == "held_out_accuracy":
        return accuracy
    unseen = accuracy_by_form.get("unseen")
    if unseen is None:
        raise TaskError(
            "the held-out questions have none of an unseen form, so there is no unseen_form_accuracy: judge on "
            "held_out_accuracy (objective.metric), or evaluate a split whose questions say their form (the bundled "
            "data's dev and test)"
        )
    return unseen
