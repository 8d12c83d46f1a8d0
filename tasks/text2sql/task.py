"""Text-to-SQL as a `Task`: questions over DuckDB databases, answered with one SQL query, scored by execution."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping, Sequence

from tasks.errors import SplitError
from tasks.interface import Task
from tasks.text2sql.agentic.episode import Episode as Text2SqlEpisode
from tasks.text2sql.agentic.episode import EpisodeLimits
from tasks.text2sql.agentic.prompts import demonstration, render_agentic_prompt
from tasks.text2sql.agentic.turns import ANSWER
from tasks.text2sql.data_source import DataSource
from tasks.text2sql.dataset import Difficulty, Example, Text2SqlDataset
from tasks.text2sql.errors import Text2SqlError
from tasks.text2sql.prompts import FewShot, render_prompt
from tasks.text2sql.rewards import COMPONENT_KINDS, DEFAULT_REWARD_SPEC, ExecutionMatch, RewardSpec
from tasks.text2sql.scoring import Score, Scorer

logger = logging.getLogger(__name__)


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
        # Each solved example's demonstration, by (example id, max_turns): it runs a query, and every prompt shows it.
        self._demonstrations: dict[tuple[str, int], str] = {}

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

    def render_prompt(self, example: Example, shots: Sequence[Example] = ()) -> str:
        few_shot = [FewShot(shot, self.dataset.database(shot.db_id).path) for shot in shots]
        return render_prompt(example, self.dataset.database(example.db_id).path, few_shot)

    def gold_completion(self, example: Example) -> str:
        # As the few-shot blocks show it: after 'SQL:', a space, the query and the ';' that stops sampling.
        return f" {example.gold_sql};"

    def score_batch(self, items_B: Sequence[tuple[Example, str]], reward_spec: RewardSpec) -> list[Score]:
        return self.scorer.score_many(items_B, reward_spec)

    def judge_batch(self, items_B: Sequence[tuple[Example, str]]) -> list[bool]:
        return [score.correct for score in self.score_batch(items_B, DEFAULT_REWARD_SPEC)]

    # --- the agentic environment: episodes of exploratory queries, then an answer ---------------------------

    def agentic_prompt(self, example: Example, shots: Sequence[Example], max_turns: int) -> str:
        """The prompt of an episode on `example`: the format, `shots` solved by exploring once, the question."""
        limits = EpisodeLimits(max_turns=max_turns)
        for shot in shots:
            if (shot.id, max_turns) not in self._demonstrations:
                path = self.dataset.database(shot.db_id).path
                self._demonstrations[shot.id, max_turns] = demonstration(shot, path, self.scorer.sandbox, limits)
        shown = [self._demonstrations[shot.id, max_turns] for shot in shots]
        return render_agentic_prompt(example, self.dataset.database(example.db_id).path, shown, limits)

    def agentic_gold_completion(self, example: Example) -> str:
        return f"{ANSWER} {example.gold_sql};"

    def episode(self, example: Example, max_turns: int) -> Text2SqlEpisode:
        """A fresh episode on `example`; its explorations run in the reward's sandbox on the primary database."""
        path = self.dataset.database(example.db_id).path
        return Text2SqlEpisode(example, path, self.scorer.sandbox, EpisodeLimits(max_turns=max_turns))

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
