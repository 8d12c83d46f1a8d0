"""The gate that admits a text-to-SQL reward component written as code (its inputs: `reward_code_inputs.py`).

It runs the function on a probe batch from the training split: for each of a few questions its gold answer, another
question's gold SQL over the same database, and the gold SQL cut to no rows; wrong answers that happen to be right (a
question whose gold result is empty) are left out. Right answers must score above wrong ones on average, and every
value must be a number in [-1, 1], or the function is refused with the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from tasks.reward_code.admission import VALUE_RANGE, Verdict, judge
from tasks.reward_code.sandbox import CodeSandbox
from tasks.text2sql.dataset import Example
from tasks.text2sql.reward.rewards import DEFAULT_REWARD_SPEC
from tasks.text2sql.reward.scoring import Scorer

# Questions of the training split the gate probes, each with its right answer and up to two wrong ones.
PROBE_QUESTIONS = 8
PROBE_SPLIT = "train"

_Kind = Literal["right", "another question's gold SQL", "the gold SQL cut to no rows"]


class ProbedTask(Protocol):
    """What the gate reads of the task: its training questions, their gold answers and its scorer."""

    @property
    def scorer(self) -> Scorer: ...

    def split(self, name: str) -> tuple[Example, ...]: ...

    def gold_completion(self, example: Example, max_turns: int = 1) -> str: ...


@dataclass(frozen=True)
class Probe:
    example: Example
    completion: str
    kind: _Kind


def probe_batch(task: ProbedTask) -> list[Probe]:
    """Right and known-wrong answers to `PROBE_QUESTIONS` questions spread over the training split."""
    examples = task.split(PROBE_SPLIT)
    chosen = examples[:: max(1, len(examples) // PROBE_QUESTIONS)][:PROBE_QUESTIONS]
    probes = []
    for example in chosen:
        probes.append(Probe(example, task.gold_completion(example), "right"))
        other = next((o for o in examples if o.db_id == example.db_id and o.gold_sql != example.gold_sql), None)
        if other is not None:
            probes.append(Probe(example, f" {other.gold_sql};", "another question's gold SQL"))
        cut = f" SELECT * FROM ({example.gold_sql}) AS probe LIMIT 0;"
        probes.append(Probe(example, cut, "the gold SQL cut to no rows"))
    return probes


def gate(task: ProbedTask, sandbox: CodeSandbox) -> Verdict:
    """Run the function in `sandbox` on the probe batch and judge it: every value a number in range, and right
    answers above wrong ones on average."""
    probes = probe_batch(task)
    evidence = task.scorer.evidence_many([(p.example, p.completion) for p in probes], DEFAULT_REWARD_SPEC)
    # A wrong answer that happens to be right (its question's gold result is empty too) probes nothing.
    kept = [(p, e) for p, e in zip(probes, evidence, strict=True) if (p.kind == "right") == e.correct_all]
    outcomes = sandbox.call_many([e.code_inputs() for _, e in kept], stop_at_error=True)
    low, high = VALUE_RANGE
    for (probe, _), outcome in zip(kept, outcomes, strict=False):
        where = f"on {probe.example.id} ({probe.kind})"
        if outcome.value is None:
            return Verdict("sandbox", f"{where}: {outcome.error}")
        if not low <= outcome.value <= high:
            return Verdict("sandbox", f"{where}: it returned {outcome.value:g}, outside [{low:g}, {high:g}]")
    right = [o.value for (p, _), o in zip(kept, outcomes, strict=True) if p.kind == "right"]
    wrong = [o.value for (p, _), o in zip(kept, outcomes, strict=True) if p.kind != "right"]
    return judge(right, wrong)
