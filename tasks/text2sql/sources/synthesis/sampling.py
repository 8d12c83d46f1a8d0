"""SQL first: draw queries from the grammar over a database and keep those the checks pass, deterministically."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import duckdb
import sqlglot

from tasks.text2sql.dataset import Database, Difficulty
from tasks.text2sql.sources.difficulty import classify_difficulty
from tasks.text2sql.sources.seeding import derived_rng
from tasks.text2sql.sources.synthesis.checks import judge
from tasks.text2sql.sources.synthesis.errors import SynthesisError
from tasks.text2sql.sources.synthesis.features import Feature, sql_features
from tasks.text2sql.sources.synthesis.grammar import QuerySampler
from tasks.text2sql.sources.synthesis.schemas import SynthDatabase
from tasks.text2sql.sql.sandbox import SqlSandbox

# Draws per query wanted, before a database is given up on: most rejections are cheap (empty, ties).
DRAWS_PER_QUERY = 25


@dataclass(frozen=True)
class SampledQuery:
    """A kept query, ready for a question: its SQL, what it uses, how hard Spider would call it."""

    db_id: str
    sql: str
    features: frozenset[Feature]
    difficulty: Difficulty
    # Position among the database's kept queries, which orders the build.
    index: int


@dataclass
class SamplingStats:
    """Draws by outcome, for the build's report."""

    drawn: int = 0
    kept: int = 0
    unfit: int = 0  # the production did not fit the tables drawn
    rejected: Counter[str] = field(default_factory=Counter)
    duplicates: int = 0


def sample_queries(
    database: SynthDatabase, files: Database, seed: int, count: int, sandbox: SqlSandbox, stats: SamplingStats
) -> list[SampledQuery]:
    """Up to `count` distinct kept queries over one database, the same ones for the same seed and database."""
    rng = derived_rng(seed, "sql", database.db_id)
    kept: list[SampledQuery] = []
    seen: set[str] = set()
    try:
        connection = duckdb.connect(
            str(files.path), read_only=True, config={"autoload_known_extensions": False, "threads": 1}
        )
    except duckdb.Error as error:
        raise SynthesisError(
            f"database {database.db_id} at {files.path} does not load ({error}); delete its folder "
            f"{files.path.parent} and run the command again to rebuild it from the seed"
        ) from error
    with connection:
        sampler = QuerySampler(database, connection, rng)
        for _ in range(count * DRAWS_PER_QUERY):
            if len(kept) >= count:
                break
            stats.drawn += 1
            sql = sampler.sample()
            if sql is None:
                stats.unfit += 1
                continue
            if sql in seen:
                stats.duplicates += 1
                continue
            seen.add(sql)
            judgement = judge(sql, files.path, sandbox)
            if not judgement.kept:
                stats.rejected[judgement.rejection.value] += 1
                continue
            try:
                features, difficulty = sql_features(sql), classify_difficulty(sql)
            except (sqlglot.errors.SqlglotError, ValueError) as error:
                stats.rejected[f"unparsed: {type(error).__name__}"] += 1
                continue
            kept.append(SampledQuery(database.db_id, sql, features, difficulty, len(kept)))
            stats.kept += 1
    return kept
