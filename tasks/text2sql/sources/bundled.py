"""The data set that ships with the project: committed question files over databases built on first use."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from tasks.text2sql.dataset import Example, Text2SqlDataset
from tasks.text2sql.errors import DatasetError
from tasks.text2sql.sources.generation.build import QUESTIONS_DIR, SPLIT_DOMAINS, ensure_databases, question_file


def read_question_file(path: Path) -> tuple[Example, ...]:
    try:
        rows = json.loads(path.read_text())
        return tuple(Example.model_validate(row) for row in rows)
    except FileNotFoundError:
        raise DatasetError(f"{path} is missing; run `python -m tasks.text2sql rebuild` to regenerate it") from None
    except (json.JSONDecodeError, ValidationError) as error:
        raise DatasetError(f"{path} is malformed: {error}") from None


def load_bundled(cache_root: Path | None = None, questions_dir: Path = QUESTIONS_DIR) -> Text2SqlDataset:
    """Train, dev and test splits (by database, as in Spider) over the bundled DuckDB databases."""
    databases = ensure_databases(cache_root)
    splits = {split: read_question_file(question_file(questions_dir, split)) for split in SPLIT_DOMAINS}
    return Text2SqlDataset(name="bundled", splits=splits, databases=databases)
