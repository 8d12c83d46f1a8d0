"""Text-to-SQL as a `Task`: questions over DuckDB databases, answered with one SQL query, scored by execution."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping, Sequence

from tasks.errors import SplitError
from tasks.interface import OneTurn, Task
from tasks.reward_code.admission import Verdict
from tasks.reward_code.loading import CodeReference
from tasks.reward_code.sandbox import CodeSandbox
from tasks.text2sql.agentic.conversation import chat_demonstration, render_chat_prompt
from tasks.text2sql.agentic.episode import Episode as AgenticEpisode
from tasks.text2sql.agentic.episode import EpisodeLimits
from tasks.text2sql.agentic.prompts import demonstration, render_agentic_prompt
from tasks.text2sql.agentic.turns import ANSWER
from tasks.text2sql.dataset import Difficulty, Example, Text2SqlDataset
from tasks.text2sql.errors import Text2SqlError
from tasks.text2sql.prompts import FewShot, render_prompt
from tasks.text2sql.reward.reward_code import gate
from tasks.text2sql.reward.reward_code_inputs import SIGNATURE
from tasks.text2sql.reward.rewards import (
    COMPONENT_KINDS,
    DEFAULT_REWARD_SPEC,
    SINGLE_TURN,
    EpisodeFacts,
    ExecutionMatch,
    RewardSpec,
)
from tasks.text2sql.reward.scoring import Score, Scorer
from tasks.text2sql.sources.data_source import DataSource

logger = logging.getLogger(__name__)


class OneTurnEpisode(OneTurn[Example]):
    """A single-turn answer as an episode: the completion is the final answer, reached in one turn."""

    def final_completion(self) -> str:
        return self.transcript()

    def facts(self) -> EpisodeFacts:
        return SINGLE_TURN


# What the reward scores of an episode: its final answer as a completion, and how it went.
Text2SqlEpisode = OneTurnEpisode | AgenticEpisode


class Text2SqlTask(Task[Example, RewardSpec]):
    """A text-to-SQL data set; the prompt shows the schema and the question and ends with 'SQL:'.

    Held-out answers are judged by execution match on every database variant (test-suite matching). Completions
    are scored on a `Scorer` made on first use, so a task that only renders prompts holds no workers.
    """

    name = "text2sql"
    reward_spec_type = RewardSpec
    data_source_type = DataSource
    default_reward_spec = DEFAULT_REWARD_SPEC
    base_reward_component = "execution_match"
    optional_reward_components = tuple(kind for kind in COMPONENT_KINDS if kind != "execution_match")
    description = (
        "The task is text-to-SQL: the model reads a database's schema and a question and writes one DuckDB query; an "
        "answer is right when its result matches the gold query's on every variant of the database (execution "
        "match), and held-out accuracy is the fraction of right answers. Optional reward components: result_overlap "
        "(F1 of the result's rows, partial credit), parses and executes (the SQL parses, runs), format (one clean "
        "statement), length_penalty (long completions), schema_linking (the gold query's tables and columns named), "
        "and for agentic episodes turn_penalty, failed_exploration and unanswered (how the episode went)."
    )

    def __init__(self, dataset: Text2SqlDataset) -> None:
        self.dataset = dataset
        self._scorer: Scorer | None = None
        # Each solved example's demonstration, by (example id, max_turns, chat): it runs a query, and every prompt
        # shows it.
        self._demonstrations: dict[tuple[str, int, bool], str] = {}

    @classmethod
    def open(cls, source: DataSource) -> Text2SqlTask:
        """The task over the data `source` names; what loading a release left out or changed is logged.

        Raises:
            DatasetError: a file of the release does not load, named with the fix.
        """
        dataset = source.load()
        for note in dataset.notes:
            logger.warning("%s", note)
        return cls(dataset)

    @classmethod
    def bundled(cls) -> Text2SqlTask:
        """The task over the data set that ships with the project (its databases built on first use)."""
        return cls.open(DataSource())

    @classmethod
    def reward_spec_from_weights(cls, weights: Mapping[str, float]) -> RewardSpec:
        """Execution match on every database variant at weight 1, plus each optional component of positive weight.

        Raises:
            RewardSpecError: a component that does not exist, or a weight outside its bounds.
        """
        added = [{"kind": kind, "weight": weight} for kind, weight in sorted(weights.items()) if weight > 0]
        return RewardSpec.parse({"components": [ExecutionMatch(weight=1.0, databases="all"), *added]})

    # --- reward components written as code (tasks.reward_code.admission.CodeRewardTask) ---------------------

    reward_code_signature = SIGNATURE

    def probe_reward_code(self, sandbox: CodeSandbox) -> Verdict:
        return gate(self, sandbox)

    @classmethod
    def reward_spec_with_code(cls, reward_spec: RewardSpec, code: CodeReference, weight: float) -> RewardSpec:
        """`reward_spec` with the referenced code as its `code` component, at `weight`.

        Raises:
            RewardSpecError: the weight is outside the components' bounds, or the spec already has code.
        """
        added = {"kind": "code", "code": code.model_dump(), "weight": weight}
        return RewardSpec.parse({"components": [*reward_spec.model_dump()["components"], added]})

    @property
    def split_names(self) -> tuple[str, ...]:
        return tuple(self.dataset.splits)

    @property
    def difficulty_levels(self) -> tuple[str, ...]:
        return tuple(Difficulty)

    @property
    def scorer(self) -> Scorer:
        """The scorer this task's completions are scored on (gold results cached across calls)."""
        if self._scorer is None:
            self._scorer = Scorer(self.dataset)
        return self._scorer

    def split(self, name: str) -> tuple[Example, ...]:
        if name not in self.dataset.splits:
            raise SplitError(f"no split {name!r} in data set {self.dataset.name!r}; splits: {sorted(self.split_names)}")
        return self.dataset.splits[name]

    def few_shot_examples(self, count: int, split: str) -> tuple[Example, ...]:
        """The first `count` examples of `split`, cycling through the difficulties so that shots show each."""
        pools = [[e for e in self.split(split) if e.difficulty is d] for d in Difficulty]
        ordered = [e for round_ in itertools.zip_longest(*pools) for e in round_ if e is not None]
        return tuple(ordered[:count])

    def prompt(self, example: Example, shots: Sequence[Example] = (), max_turns: int = 1, chat: bool = False) -> str:
        """One turn: the schema, `shots` answered, the question, and 'SQL:'. More: the agentic format, `shots`
        solved by exploring once, the question; in a chat (`chat`), the conversation's instructions (every query is
        run and shown, then revised or confirmed), `shots` solved that way, the question."""
        db_path = self.dataset.database(example.db_id).path
        if max_turns == 1:
            return render_prompt(example, db_path, [FewShot(s, self.dataset.database(s.db_id).path) for s in shots])
        limits = EpisodeLimits(max_turns=max_turns)
        for shot in shots:
            if (shot.id, max_turns, chat) not in self._demonstrations:
                path = self.dataset.database(shot.db_id).path
                self._demonstrations[shot.id, max_turns, chat] = (
                    chat_demonstration(shot, path, self.scorer.sandbox, limits.rows_fetched, limits.observation)
                    if chat
                    else demonstration(shot, path, self.scorer.sandbox, limits)
                )
        shown = [self._demonstrations[shot.id, max_turns, chat] for shot in shots]
        if chat:
            return render_chat_prompt(example, db_path, shown)
        return render_agentic_prompt(example, db_path, shown, limits)

    def gold_completion(self, example: Example, max_turns: int = 1) -> str:
        # One turn: as the few-shot blocks show it, after 'SQL:', a space, the query and the ';' that stops
        # sampling. More: the answer at once, in the turn format.
        return f" {example.gold_sql};" if max_turns == 1 else f"{ANSWER} {example.gold_sql};"

    def episode(self, example: Example, max_turns: int = 1, chat: bool = False) -> Text2SqlEpisode:
        """A fresh episode on `example`; an agentic one's explorations run in the reward's sandbox on the primary
        database, and in a chat (`chat`) every query the model writes is run and its last one is the answer."""
        if max_turns == 1:
            return OneTurnEpisode(example)
        path = self.dataset.database(example.db_id).path
        return AgenticEpisode(example, path, self.scorer.sandbox, EpisodeLimits(max_turns=max_turns), chat)

    def score_episodes(self, episodes_B: Sequence[Text2SqlEpisode], reward_spec: RewardSpec) -> list[Score]:
        """Each finished episode's reward: its final answer scored as a completion, and how the episode went."""
        if any(not episode.done for episode in episodes_B):
            raise Text2SqlError("only finished episodes are scored")
        return self.scorer.score_many(
            [(e.example, e.final_completion()) for e in episodes_B], reward_spec, [e.facts() for e in episodes_B]
        )

    def judge_episodes(self, episodes_B: Sequence[Text2SqlEpisode]) -> list[bool]:
        return [score.correct for score in self.score_episodes(episodes_B, DEFAULT_REWARD_SPEC)]

    def close(self) -> None:
        if self._scorer is not None:
            self._scorer.close()
            self._scorer = None
