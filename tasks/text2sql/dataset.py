"""The data model every source of text-to-SQL data produces: examples, databases and splits."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from tasks.text2sql.errors import DatasetError


class Difficulty(StrEnum):
    """Spider's hardness levels."""

    EASY = "easy"
    MEDIUM = "medium"
    HARD = "hard"
    EXTRA = "extra"


class QuestionForm(StrEnum):
    """Whether a held-out question's form (its template family and phrasing) also occurs in training data."""

    SEEN = "seen"
    UNSEEN = "unseen"


class Example(BaseModel):
    """One question with its gold SQL (DuckDB dialect) over one database."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    db_id: str
    question: str
    gold_sql: str
    difficulty: Difficulty
    # BIRD's external knowledge ("evidence"); None for sources without it.
    evidence: str | None = None
    # Whether training data asks questions of this form; None for sources that do not say (Spider, BIRD).
    form: QuestionForm | None = None


@dataclass(frozen=True)
class Database:
    """A DuckDB file and the variants that share its schema with other contents."""

    db_id: str
    path: Path
    variants: tuple[Path, ...] = ()

    @property
    def all_paths(self) -> tuple[Path, ...]:
        """The primary database first, then its variants."""
        return (self.path, *self.variants)


@dataclass(frozen=True)
class Text2SqlDataset:
    """Examples by split, and the databases they run on."""

    name: str
    splits: dict[str, tuple[Example, ...]]
    databases: dict[str, Database]
    notes: tuple[str, ...] = field(default=())

    def split(self, name: str) -> tuple[Example, ...]:
        """The examples of one split; raises DatasetError naming the splits that exist."""
        if name not in self.splits:
            raise DatasetError(f"no split {name!r} in data set {self.name!r}; splits: {sorted(self.splits)}")
        return self.splits[name]

    def database(self, db_id: str) -> Database:
        """The database an example runs on; raises DatasetError when it is unknown."""
        if db_id not in self.databases:
            raise DatasetError(f"no database {db_id!r} in data set {self.name!r}")
        return self.databases[db_id]
