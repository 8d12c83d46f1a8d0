"""One agentic episode: a question, the policy's turns, and what each exploratory query returned.

The episode ends at a final answer, at a malformed turn, or when the policy has used `max_turns` turns without
answering. Exploratory queries run in the reward's own sandbox (read-only, its time, memory and row limits) on the
question's primary database; a refused or failing query is shown as an error and the episode goes on.

A chat episode (`chat=True`) is a conversation with a chat model (agentic/conversation.py): every query it writes is
run and shown, its answer is the last query it wrote, and a query repeated unchanged confirms it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tasks.text2sql.agentic.conversation import parse_reply, reply_observation
from tasks.text2sql.agentic.turns import ObservationLimits, ParsedTurn, TurnKind, parse_turn, render_result
from tasks.text2sql.dataset import Example
from tasks.text2sql.errors import Text2SqlError
from tasks.text2sql.reward.rewards import EpisodeFacts
from tasks.text2sql.sql.sandbox import ExecutionStatus, QueryRunner

# The cue shown when one turn is left, so that a policy which reads it answers rather than runs out.
LAST_TURN_CUE = "One turn left: answer now."


@dataclass(frozen=True)
class EpisodeLimits:
    """How long an episode may run and how much each exploration may show."""

    max_turns: int = 4
    # Rows an exploratory query fetches (beyond the shown ones they are only counted).
    rows_fetched: int = 50
    observation: ObservationLimits = field(default_factory=ObservationLimits)

    def __post_init__(self) -> None:
        if self.max_turns < 1 or self.rows_fetched < 1:
            raise Text2SqlError(
                f"episode limits must be positive: max_turns {self.max_turns}, rows {self.rows_fetched}"
            )


@dataclass(frozen=True)
class Turn:
    """One policy turn: what it wrote, what it asked for, and what the environment answered."""

    text: str
    parsed: ParsedTurn
    # The environment's reply to an exploration ("" after the final turn).
    observation: str = ""
    # How the exploratory query ended; None for an answer or a malformed turn.
    status: ExecutionStatus | None = None


@dataclass(eq=False)
class Episode:
    """The state of one episode; `step` takes the policy's next turn and returns what it reads next."""

    example: Example
    db_path: Path
    sandbox: QueryRunner
    limits: EpisodeLimits
    chat: bool = False
    turns: list[Turn] = field(default_factory=list, init=False)

    @property
    def done(self) -> bool:
        if not self.turns:
            return False
        return self.turns[-1].parsed.kind is not TurnKind.EXPLORE or len(self.turns) >= self.limits.max_turns

    @property
    def answer(self) -> str | None:
        """The final answer's SQL; None while running, or when the episode ended without one (in a chat episode:
        without any query)."""
        if self.turns and self.turns[-1].parsed.kind is TurnKind.ANSWER:
            return self.turns[-1].parsed.sql
        if self.chat and self.done:
            queries = [t.parsed.sql for t in self.turns if t.parsed.kind is TurnKind.EXPLORE]
            return queries[-1] if queries else None
        return None

    def step(self, text: str) -> str | None:
        """Take the policy's next turn; return the text it reads before its next turn, or None once it is over.

        Raises:
            Text2SqlError: the episode is already over.
        """
        if self.done:
            raise Text2SqlError(f"the episode of {self.example.id} is over; it takes no more turns")
        parsed = parse_reply(text) if self.chat else parse_turn(text)
        if self.chat and parsed.kind is TurnKind.EXPLORE and self._repeats_last_query(parsed.sql):
            parsed = ParsedTurn(TurnKind.ANSWER, self.turns[-1].parsed.sql)
        if parsed.kind is not TurnKind.EXPLORE:
            self.turns.append(Turn(text, parsed))
            return None
        result = self.sandbox.execute(self.db_path, parsed.sql, max_rows=self.limits.rows_fetched)
        shown = render_result(result, self.limits.observation)
        replies_left = self.limits.max_turns - len(self.turns) - 1
        if self.chat:
            observation = reply_observation(shown, result.ok, replies_left)
        else:
            observation = shown + ("\n" + LAST_TURN_CUE if replies_left == 1 else "")
        self.turns.append(Turn(text, parsed, observation, result.status))
        if self.done:
            return None
        # A chat observation is a user turn of its own; a plain one continues the transcript on lines of its own.
        return observation if self.chat else f"\n{observation}\n"

    def _repeats_last_query(self, sql: str) -> bool:
        """Whether `sql` is the query of the turn before, but for whitespace: a model that writes its query again
        after reading the result has confirmed it."""
        if not self.turns or self.turns[-1].parsed.kind is not TurnKind.EXPLORE:
            return False
        return sql.split() == self.turns[-1].parsed.sql.split()

    def facts(self) -> EpisodeFacts:
        """How the episode went, for the reward's episode components."""
        explorations = [t for t in self.turns if t.parsed.kind is TurnKind.EXPLORE]
        return EpisodeFacts(
            turns=len(self.turns),
            failed_explorations=sum(t.status is not ExecutionStatus.OK for t in explorations),
            answered=self.answer is not None,
        )

    def final_completion(self) -> str:
        """The final answer as a single-turn completion (what the reward's SQL components score); "" if none."""
        return f" {self.answer};" if self.answer is not None else ""

    def transcript(self) -> str:
        """Every turn and observation, as the policy wrote and read them."""
        parts = []
        for turn in self.turns:
            parts.append(turn.text)
            if turn.observation:
                parts.append(f"\n{turn.observation}\n")
        return "".join(parts)
