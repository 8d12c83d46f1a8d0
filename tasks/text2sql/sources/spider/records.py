"""Reading a Spider or BIRD folder's JSON files into typed records, and finding each db_id's SQLite file."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tasks.text2sql.errors import DatasetError


@dataclass(frozen=True)
class RawExample:
    id: str
    split: str
    db_id: str
    question: str
    sqlite_sql: str
    evidence: str | None = None
    source_difficulty: str | None = None


class SpiderRecord(BaseModel):
    model_config = ConfigDict(extra="ignore")

    db_id: str
    question: str
    query: str

    def raw(self, split: str, index: int) -> RawExample:
        """The example; Spider's have no ids of their own, so an example is named by its place in the split."""
        return RawExample(f"spider-{split}-{index}", split, self.db_id, self.question, self.query)


class BirdRecord(BaseModel):
    model_config = ConfigDict(extra="ignore")

    question_id: int | None = None
    db_id: str
    question: str
    evidence: str | None = None
    sql: str = Field(alias="SQL")
    difficulty: str | None = None

    def raw(self, split: str, index: int) -> RawExample:
        """The example, named by its question_id (BIRD's train file has none: then by its place)."""
        number = index if self.question_id is None else self.question_id
        return RawExample(
            f"bird-{split}-{number}", split, self.db_id, self.question, self.sql, self.evidence, self.difficulty
        )


class _TableRecord(BaseModel):
    model_config = ConfigDict(extra="ignore")

    db_id: str


_Record = TypeVar("_Record", bound=BaseModel)


def existing_folder(root: Path, release: str) -> Path:
    """`root` resolved; raises DatasetError naming the fix when it is not a folder."""
    root = Path(root).expanduser().resolve()
    if not root.is_dir():
        what = "a file, not a folder" if root.exists() else "no such folder"
        raise DatasetError(f"{root}: {what}; give the folder the {release} release was unpacked into")
    return root


def read_records(path: Path, model: type[_Record]) -> list[_Record]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise DatasetError(f"{path}: missing") from error
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DatasetError(f"{path}: not readable JSON: {error}") from error
    if not isinstance(data, list):
        raise DatasetError(f"{path}: expected a JSON list of objects, got {type(data).__name__}")
    records = []
    for index, item in enumerate(data):
        try:
            records.append(model.model_validate(item))
        except ValidationError as error:
            raise DatasetError(f"{path}: entry {index} is malformed: {error}") from error
    return records


@dataclass(frozen=True)
class TablesFile:
    path: Path
    db_ids: frozenset[str]


def read_tables_file(path: Path) -> TablesFile:
    return TablesFile(path, frozenset(record.db_id for record in read_records(path, _TableRecord)))


def sqlite_path(db_id: str, source: Path, tables: TablesFile, database_dirs: tuple[Path, ...]) -> Path:
    """The SQLite file of a db_id that an example of `source` names; raises DatasetError naming both."""
    if db_id not in tables.db_ids:
        raise DatasetError(f"{source}: db_id {db_id!r} is not described in {tables.path}")
    for folder in database_dirs:
        path = folder / db_id / f"{db_id}.sqlite"
        if path.is_file():
            return path
    expected = " or ".join(str(folder / db_id / f"{db_id}.sqlite") for folder in database_dirs)
    raise DatasetError(
        f"{source}: db_id {db_id!r} has no database file ({expected}); put the release's copy there, or remove the "
        "questions on it"
    )
