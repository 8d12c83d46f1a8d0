"""Build the bundled data set: the databases (on first use, into a cache) and the question files (in the repo).

`python -m tasks.text2sql rebuild` regenerates both; a test checks that doing so reproduces the committed files.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import duckdb

from tasks.text2sql.dataset import Database, Difficulty, Example
from tasks.text2sql.sources.difficulty import classify_difficulty
from tasks.text2sql.sources.domains.loader import Family, family_files, load_family
from tasks.text2sql.sources.domains.schema import Domain
from tasks.text2sql.sources.generation.questions import Scope, draw_candidate
from tasks.text2sql.sources.generation.rows import build_database
from tasks.text2sql.sources.seeding import derived_rng

SEED = 20261129
VARIANTS = 3  # the primary database and two others with the same schema
QUESTIONS_PER_DATABASE = {"train": 205, "dev": 165, "test": 165}
# Share of each difficulty among a database's questions, close to Spider's dev set.
DIFFICULTY_SHARE = {
    Difficulty.EASY: 0.24,
    Difficulty.MEDIUM: 0.40,
    Difficulty.HARD: 0.18,
    Difficulty.EXTRA: 0.18,
}
MAX_DRAWS_PER_QUESTION = 60

SPLIT_DOMAINS: dict[str, tuple[Domain, ...]] = load_family(Family.BUNDLED)
GENERATION_DIR = Path(__file__).resolve().parent
# The bundled question files are the task's own data (tasks/text2sql/data/), two folders above the generator.
QUESTIONS_DIR = GENERATION_DIR.parents[1] / "data"


def generator_fingerprint() -> str:
    """Changes whenever the generator's code or domain files change, so a cache built from older ones is never
    reused."""
    digest = hashlib.sha256(str(SEED).encode())
    sources = [
        *sorted(GENERATION_DIR.glob("*.py")),
        GENERATION_DIR.parent / "seeding.py",
        *family_files(Family.BUNDLED),
    ]
    for source in sources:
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def default_cache_root() -> Path:
    override = os.environ.get("TEXT2SQL_CACHE_DIR")
    return Path(override) if override else Path.home() / ".cache" / "rl-posttrain" / "text2sql"


def database_path(root: Path, db_id: str, variant: int) -> Path:
    return root / db_id / (f"{db_id}.duckdb" if variant == 0 else f"{db_id}.variant{variant}.duckdb")


def ensure_databases(cache_root: Path | None = None) -> dict[str, Database]:
    """Build every bundled database once per generator version; later calls only look the files up."""
    root = (cache_root or default_cache_root()) / f"bundled-{generator_fingerprint()}"
    if not (root / "COMPLETE").exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        # Build beside the target and rename: concurrent first uses (test workers) never see half a build.
        scratch = Path(tempfile.mkdtemp(prefix=".building-", dir=root.parent))
        for domains in SPLIT_DOMAINS.values():
            for domain in domains:
                for variant in range(VARIANTS):
                    build_database(domain, SEED, variant, database_path(scratch, domain.db_id, variant))
        (scratch / "COMPLETE").write_text(generator_fingerprint())
        try:
            scratch.rename(root)
        except OSError:
            shutil.rmtree(scratch, ignore_errors=True)  # another process finished first; its build is identical
    return {
        domain.db_id: Database(
            domain.db_id,
            database_path(root, domain.db_id, 0),
            tuple(database_path(root, domain.db_id, v) for v in range(1, VARIANTS)),
        )
        for domains in SPLIT_DOMAINS.values()
        for domain in domains
    }


def _ties(con: duckdb.DuckDBPyConnection, sql: str) -> bool:
    values = [row[0] for row in con.execute(sql).fetchall()]
    return len(values) != len(set(values))


def generate_questions(domain: Domain, database: Database, split: str) -> list[Example]:
    """Draw question/SQL pairs until the database's quota per difficulty is met (or draws run out)."""
    target = QUESTIONS_PER_DATABASE[split]
    quota = {d: round(target * share) for d, share in DIFFICULTY_SHARE.items()}
    taken: Counter[Difficulty] = Counter()
    seen_sql: set[str] = set()
    seen_questions: set[str] = set()
    examples: list[Example] = []
    with duckdb.connect(str(database.path), read_only=True) as con:
        scope = Scope(domain, con, derived_rng(SEED, "questions", domain.db_id), held_out=split != "train")
        for _ in range(target * MAX_DRAWS_PER_QUESTION):
            if len(examples) >= sum(quota.values()):
                break
            candidate = draw_candidate(scope)
            if candidate is None or candidate.sql in seen_sql or candidate.question in seen_questions:
                continue
            difficulty = classify_difficulty(candidate.sql)
            if taken[difficulty] >= quota[difficulty]:
                continue
            if not con.execute(candidate.sql).fetchmany(1):
                continue
            if candidate.tie_check_sql and _ties(con, candidate.tie_check_sql):
                continue
            seen_sql.add(candidate.sql)
            seen_questions.add(candidate.question)
            taken[difficulty] += 1
            examples.append(
                Example(
                    id=f"{domain.db_id}-{len(examples):04d}",
                    db_id=domain.db_id,
                    question=candidate.question,
                    gold_sql=candidate.sql,
                    difficulty=difficulty,
                    form=candidate.form,
                )
            )
    return examples


def question_file(directory: Path, split: str) -> Path:
    return directory / f"{split}.json"


def write_question_files(directory: Path, cache_root: Path | None = None) -> dict[str, list[Example]]:
    """Generate every split's questions and write them as JSON into `directory`."""
    databases = ensure_databases(cache_root)
    directory.mkdir(parents=True, exist_ok=True)
    splits: dict[str, list[Example]] = {}
    for split, domains in SPLIT_DOMAINS.items():
        examples = [e for d in domains for e in generate_questions(d, databases[d.db_id], split)]
        payload = [e.model_dump(mode="json", exclude_none=True) for e in examples]
        question_file(directory, split).write_text(json.dumps(payload, indent=1, ensure_ascii=False) + "\n")
        splits[split] = examples
    return splits
