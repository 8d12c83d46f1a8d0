"""Reward components and the reward spec that weighs them.

A reward is a pure function of (example, completion, and in the agentic environment how the episode went: its
`EpisodeFacts`): the spec is data, so an agent can propose a variant as
JSON and a study can store it. Each component computes its value from the `Evidence` the scorer gathered about a
completion (`value`); its docstring says how a policy could game it; weigh them so that gaming one never beats
getting the answer right.
"""

from __future__ import annotations

import json
import logging
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Annotated, Literal, Protocol, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tasks.reward_code.admission import VALUE_RANGE
from tasks.reward_code.loading import CodeReference, sandbox_for
from tasks.text2sql.errors import RewardSpecError
from validation_errors import describe_validation_error

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EpisodeFacts:
    """How an answer was reached: in one turn, or after exploratory queries (the agentic environment)."""

    # Policy turns, the final answer's included.
    turns: int = 1
    # Exploratory queries that did not run to a result (an error, a refusal, a timeout).
    failed_explorations: int = 0
    # The episode ended with a final answer, not with a malformed turn or at the turn limit.
    answered: bool = True


# A single-turn completion: one turn, always taken as the answer (its form is `format`'s business).
SINGLE_TURN = EpisodeFacts()


class Evidence(Protocol):
    """What the scorer knows of one completion, computed when a component first asks for it."""

    @property
    def episode(self) -> EpisodeFacts:
        """How the answer was reached (SINGLE_TURN outside the agentic environment)."""

    @property
    def completion_chars(self) -> int:
        """The completion's length in characters."""

    def correct(self, databases: Literal["primary", "all"]) -> bool:
        """Whether the result matches the gold one on the primary database, or on every variant as well."""

    def result_overlap(self) -> float:
        """F1 of the predicted result's rows against the gold result's, on the primary database."""

    def parses(self) -> bool:
        """Whether sqlglot parses the extracted SQL as DuckDB."""

    def executes(self) -> bool:
        """Whether the extracted SQL ran without error on the primary database."""

    def well_formed(self) -> bool:
        """One statement DuckDB parses, and the completion stopped cleanly after it."""

    def schema_overlap(self) -> float:
        """Jaccard overlap of the tables and columns the SQL names with those the gold query names."""

    def code_inputs(self) -> tuple[str, dict[str, object], dict[str, object]]:
        """(completion, example, execution) as a reward function written as code receives them (`reward_code`)."""


class _Component(BaseModel, ABC):
    """A reward component: its weight, and `value`, what it is worth for one completion before weighting."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    weight: float = Field(1.0, ge=-10.0, le=10.0, description="multiplies the component's value")

    @abstractmethod
    def value(self, evidence: Evidence) -> float: ...

    @field_validator("weight")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("weight must be a finite number")
        return value


class ExecutionMatch(_Component):
    """1 if the prediction's result equals the gold result, else 0 (see matching.py).

    With databases="all", it must match on every variant database too (test-suite accuracy), which rejects
    queries that are right by coincidence on one database's contents. Gaming: hard-coding literal answers
    read from the schema's data can match on one database; "all" defeats most of it.
    """

    kind: Literal["execution_match"] = "execution_match"
    databases: Literal["primary", "all"] = "all"

    def value(self, evidence: Evidence) -> float:
        return float(evidence.correct(self.databases))


class ResultOverlap(_Component):
    """F1 between predicted and gold result rows, in [0, 1]: partial credit for nearly-right answers.

    Gaming: returning many rows (SELECT * without a filter) raises recall; precision keeps F1 low, but a weight
    near ExecutionMatch's makes "close enough" as good as right. Keep it well below.
    """

    kind: Literal["result_overlap"] = "result_overlap"

    def value(self, evidence: Evidence) -> float:
        return evidence.result_overlap()


class Parses(_Component):
    """1 if sqlglot parses the SQL as DuckDB, else 0.

    Gaming: `SELECT 1` parses; alone it teaches nothing about the question. Use as a small shaping term.
    """

    kind: Literal["parses"] = "parses"

    def value(self, evidence: Evidence) -> float:
        return float(evidence.parses())


class Executes(_Component):
    """1 if the SQL runs without error in the sandbox, else 0.

    Gaming: any valid query over any table executes; same caveat as Parses.
    """

    kind: Literal["executes"] = "executes"

    def value(self, evidence: Evidence) -> float:
        return float(evidence.executes())


class Format(_Component):
    """1 if the completion is one statement DuckDB parses and it stops cleanly (nothing but a fence after it).

    Gaming: any short parseable statement (`SELECT 1;`) is well formed; keep the weight small.
    """

    kind: Literal["format"] = "format"

    def value(self, evidence: Evidence) -> float:
        return float(evidence.well_formed())


class LengthPenalty(_Component):
    """-min(1, (characters - free_chars) / scale_chars) for completions longer than free_chars, else 0.

    Use a positive weight: the value itself is negative. Gaming: pushes toward terse SQL, which may drop
    needed clauses; keep it small next to ExecutionMatch.
    """

    kind: Literal["length_penalty"] = "length_penalty"
    free_chars: int = Field(400, ge=0, description="completions up to this length are not penalised")
    scale_chars: int = Field(400, gt=0, description="excess characters at which the penalty reaches 1")

    def value(self, evidence: Evidence) -> float:
        excess = max(0, evidence.completion_chars - self.free_chars)
        return -min(1.0, excess / self.scale_chars)


class SchemaLinking(_Component):
    """Jaccard overlap of the tables and columns the prediction names with those the gold query names.

    Gaming: naming the right columns in a wrong query earns it; mentioning every column lowers Jaccard.
    """

    kind: Literal["schema_linking"] = "schema_linking"

    def value(self, evidence: Evidence) -> float:
        return evidence.schema_overlap()


class TurnPenalty(_Component):
    """-(turns - 1): minus one for each exploratory turn before the answer (0 in a single-turn task).

    Use a positive weight: the value itself is negative. Gaming: answering at once avoids it, which is the
    single-turn policy; a weight near ExecutionMatch's teaches the model never to look at the data.
    """

    kind: Literal["turn_penalty"] = "turn_penalty"

    def value(self, evidence: Evidence) -> float:
        return float(-(evidence.episode.turns - 1))


class FailedExploration(_Component):
    """Minus one for each exploratory query that failed (an error, a refusal, a timeout).

    Use a positive weight. Gaming: exploring with trivial queries (`SELECT 1`) never fails; TurnPenalty
    prices those turns.
    """

    kind: Literal["failed_exploration"] = "failed_exploration"

    def value(self, evidence: Evidence) -> float:
        return float(-evidence.episode.failed_explorations)


class Unanswered(_Component):
    """-1 when the episode ended without a final answer (a malformed turn, or the turn limit), else 0.

    Use a positive weight (SkyRL-SQL's -1 for a malformed episode is weight 1). Gaming: any answer escapes it,
    right or wrong; it only pays to answer at all.
    """

    kind: Literal["unanswered"] = "unanswered"

    def value(self, evidence: Evidence) -> float:
        return 0.0 if evidence.episode.answered else -1.0


class CodeReward(_Component):
    """A reward function written as code (`tasks.text2sql.reward.reward_code` gives its signature), admitted by the
    gate, stored as an Optuna artifact and loaded by its sha256; it runs in a sandboxed worker. Its value is clipped
    to [-1, 1], and a call that fails (an error, a limit) is worth 0.

    Gaming: whatever the function pays for; the gate only checks that right answers score above wrong ones on a
    probe batch, so keep its weight below ExecutionMatch's. Not searched by weight: a study adds it from an LLM's
    proposal (`search_space.reward.code`).
    """

    kind: Literal["code"] = "code"
    code: CodeReference

    def value(self, evidence: Evidence) -> float:
        outcome = sandbox_for(self.code).call_many([evidence.code_inputs()])[0]
        if outcome.value is None:
            log.warning("reward code %s failed on a completion, worth 0: %s", self.code.sha256[:12], outcome.error)
            return 0.0
        low, high = VALUE_RANGE
        return min(max(outcome.value, low), high)


RewardComponent = Annotated[
    ExecutionMatch
    | ResultOverlap
    | Parses
    | Executes
    | Format
    | LengthPenalty
    | SchemaLinking
    | TurnPenalty
    | FailedExploration
    | Unanswered
    | CodeReward,
    Field(discriminator="kind"),
]
ComponentKind = Literal[
    "execution_match",
    "result_overlap",
    "parses",
    "executes",
    "format",
    "length_penalty",
    "schema_linking",
    "turn_penalty",
    "failed_exploration",
    "unanswered",
]
COMPONENT_KINDS: tuple[str, ...] = get_args(ComponentKind)


class RewardSpec(BaseModel):
    """A weighted sum of reward components; the total is what the RL loop maximises."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    components: tuple[RewardComponent, ...] = Field(min_length=1)

    @field_validator("components")
    @classmethod
    def _one_of_each(cls, components: tuple[_Component, ...]) -> tuple[_Component, ...]:
        kinds = [c.kind for c in components]
        repeated = sorted({k for k in kinds if kinds.count(k) > 1})
        if repeated:
            raise ValueError(f"each component kind may appear once; repeated: {repeated}")
        return components

    def needs_all_databases(self) -> bool:
        return any(isinstance(c, ExecutionMatch) and c.databases == "all" for c in self.components)

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def parse(cls, data: str | dict) -> RewardSpec:
        """Validate a spec from JSON text or a dict; errors name each bad field and what is allowed."""
        try:
            if isinstance(data, str):
                return cls.model_validate(json.loads(data))
            return cls.model_validate(data)
        except json.JSONDecodeError as error:
            raise RewardSpecError(f"reward spec is not valid JSON: {error}") from None
        except ValidationError as error:
            problems = describe_validation_error(error, cls, root="spec")
            raise RewardSpecError(
                f"invalid reward spec: {problems} (component kinds: {', '.join(COMPONENT_KINDS)})"
            ) from None


DEFAULT_REWARD_SPEC = RewardSpec(components=(ExecutionMatch(weight=1.0), Format(weight=0.1)))
