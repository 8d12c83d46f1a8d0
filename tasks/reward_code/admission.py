"""Whether reward code may be used: the static check, then a run in the sandbox on the task's probe batch, where right
answers must score above wrong ones. The verdict says which stage refused it and why, with the numbers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel

from tasks.reward_code.errors import RewardCodeError, StaticCheckError
from tasks.reward_code.loading import CodeReference
from tasks.reward_code.sandbox import CodeLimits, CodeSandbox
from tasks.reward_code.static_check import check_source

# What a reward function written as code may return; a value outside fails the gate, and is clipped in a trial.
VALUE_RANGE = (-1.0, 1.0)

Stage = Literal["static check", "sandbox", "gate", "accepted"]


@dataclass(frozen=True)
class Verdict:
    """The outcome of admitting reward code: accepted, or the stage that refused it and why; the gate's numbers
    (mean value on the right and on the known-wrong answers of the probe batch) where it got that far."""

    stage: Stage
    reason: str
    right_mean: float | None = None
    wrong_mean: float | None = None

    @property
    def accepted(self) -> bool:
        return self.stage == "accepted"

    def __str__(self) -> str:
        return self.reason if self.accepted else f"refused at the {self.stage}: {self.reason}"


@runtime_checkable
class CodeRewardTask(Protocol):
    """A task whose reward may hold a component written as code (text2sql: `tasks.text2sql.reward.reward_code`)."""

    # The function's signature and what each argument holds, for the LLM's prompt and the docs.
    reward_code_signature: str

    def probe_reward_code(self, sandbox: CodeSandbox) -> Verdict:
        """Run the code on the task's probe batch (right answers and known-wrong ones) and judge it."""

    @classmethod
    def reward_spec_with_code(cls, reward_spec: BaseModel, code: CodeReference, weight: float) -> BaseModel:
        """`reward_spec` with the referenced code added as a component of `weight`.

        Raises:
            TaskError: the weight or the reference does not validate.
        """


def admit(task: CodeRewardTask, source: str, limits: CodeLimits | None = None) -> Verdict:
    """The static check, then the task's gate with the code running in a sandbox under `limits`."""
    try:
        check_source(source)
    except StaticCheckError as error:
        return Verdict("static check", str(error))
    try:
        with CodeSandbox(source, limits) as sandbox:
            return task.probe_reward_code(sandbox)
    except RewardCodeError as error:
        return Verdict("sandbox", str(error))


def judge(right_B: list[float], wrong_B: list[float]) -> Verdict:
    """The gate: accepted when the mean on right answers is above the mean on wrong ones, both given."""
    if not right_B or not wrong_B:
        return Verdict(
            "gate", f"the probe batch needs right and wrong answers; it has {len(right_B)} and {len(wrong_B)}"
        )
    right, wrong = sum(right_B) / len(right_B), sum(wrong_B) / len(wrong_B)
    numbers = f"mean {right:.3f} on {len(right_B)} right answers, {wrong:.3f} on {len(wrong_B)} known-wrong ones"
    if right <= wrong:
        return Verdict("gate", f"it does not rank right SQL above wrong: {numbers}", right, wrong)
    return Verdict("accepted", f"accepted: {numbers}", right, wrong)
