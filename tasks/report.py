"""The one report of held-out answers every task gives, whoever evaluates: a trial, a controller or a CLI."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field


class HeldOutAnswer(BaseModel):
    """One held-out question, the model's greedy completion and whether the task judged it correct."""

    model_config = ConfigDict(frozen=True)

    example_id: str
    difficulty: str
    completion: str
    correct: bool


class HeldOutReport(BaseModel):
    """Accuracy on held-out questions, overall and by difficulty, with every answer."""

    model_config = ConfigDict(frozen=True)

    step: int = Field(0, description="RL steps the evaluated weights had taken; 0 for a model outside a trial")
    split: str
    accuracy: float
    # Every difficulty level of the task, in its order; None for a level the questions have none of.
    accuracy_by_difficulty: dict[str, float | None]
    answers: tuple[HeldOutAnswer, ...]

    @classmethod
    def of(cls, answers: Sequence[HeldOutAnswer], split: str, levels: Sequence[str], step: int = 0) -> HeldOutReport:
        """The report of `answers`, broken down by the task's difficulty `levels`."""
        by_difficulty = {}
        for level in levels:
            marks = [a.correct for a in answers if a.difficulty == level]
            by_difficulty[level] = sum(marks) / len(marks) if marks else None
        accuracy = sum(a.correct for a in answers) / len(answers) if answers else 0.0
        return cls(
            step=step, split=split, accuracy=accuracy, accuracy_by_difficulty=by_difficulty, answers=tuple(answers)
        )

    def counts(self, difficulty: str) -> tuple[int, int]:
        """(correct, total) answers of one difficulty."""
        marks = [a.correct for a in self.answers if a.difficulty == difficulty]
        return sum(marks), len(marks)
