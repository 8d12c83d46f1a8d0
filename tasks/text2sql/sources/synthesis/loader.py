"""The synthesized training data as a `Text2SqlDataset`: the shipped question file over databases rebuilt from the
seed on first use."""

from __future__ import annotations

import hashlib
from pathlib import Path

from pydantic import ValidationError

from tasks.text2sql.dataset import Text2SqlDataset
from tasks.text2sql.errors import DatasetError
from tasks.text2sql.sources.bundled import read_question_file
from tasks.text2sql.sources.synthesis.databases import database_digests, ensure_synth_databases
from tasks.text2sql.sources.synthesis.manifest import QUESTIONS_FILE, Manifest, manifest_path

REBUILD = "`python -m tasks.text2sql build-data` (see docs/text2sql.md; cached LLM answers are reused)"


def read_manifest(questions_file: Path) -> Manifest:
    path = manifest_path(questions_file)
    try:
        return Manifest.model_validate_json(path.read_text())
    except FileNotFoundError:
        raise DatasetError(f"{path} is missing; rebuild the synthesized data with {REBUILD}") from None
    except (ValidationError, ValueError) as error:
        raise DatasetError(f"{path} is malformed ({error}); rebuild the synthesized data with {REBUILD}") from None


def load_synthesized(
    questions_file: Path = QUESTIONS_FILE, cache_root: Path | None = None, show_progress: bool = True
) -> Text2SqlDataset:
    """The train split of the synthesized data and its databases (built from the seed when first needed).

    Raises:
        DatasetError: the question file or its manifest is missing, malformed or torn (they disagree), or the
            databases this code builds are not those the questions were written over.
    """
    try:
        text = questions_file.read_text()
    except FileNotFoundError:
        raise DatasetError(f"{questions_file} is missing; build it with {REBUILD}") from None
    manifest = read_manifest(questions_file)
    if hashlib.sha256(text.encode()).hexdigest() != manifest.questions_sha256:
        raise DatasetError(
            f"{questions_file} and its manifest disagree (the file was edited, or a build stopped between writing "
            f"the two); rebuild with {REBUILD}"
        )
    examples = read_question_file(questions_file)
    databases = ensure_synth_databases(manifest.seed, manifest.databases, cache_root, show_progress)
    built = database_digests(manifest.seed, manifest.databases, cache_root)
    changed = sorted(db_id for db_id, digest in manifest.databases.items() if built[db_id] != digest)
    if changed:
        raise DatasetError(
            f"the questions in {questions_file} were written over databases this code no longer builds "
            f"({changed[0]}{f' and {len(changed) - 1} more' if len(changed) > 1 else ''} changed: the schemas or "
            f"the row generator were edited); rebuild the questions with {REBUILD}"
        )
    return Text2SqlDataset(name="synthesized", splits={"train": examples}, databases=databases)
