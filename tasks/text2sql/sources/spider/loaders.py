"""Loading a Spider or BIRD folder into a Text2SqlDataset, with a LoadReport of what was kept, left out and changed."""

from __future__ import annotations

from collections import Counter, defaultdict
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from tasks.text2sql.dataset import Database, Example, Text2SqlDataset
from tasks.text2sql.errors import DatasetError
from tasks.text2sql.sources.difficulty import classify_expression
from tasks.text2sql.sources.spider.cache import default_cache_dir, exclusive
from tasks.text2sql.sources.spider.gold_checks import GoldCheckCache, check_gold
from tasks.text2sql.sources.spider.gold_repairs import GoldRejectedError, generate, transpile
from tasks.text2sql.sources.spider.layout import SplitFiles, bird_layout, spider_layout
from tasks.text2sql.sources.spider.records import (
    BirdRecord,
    RawExample,
    SpiderRecord,
    read_records,
    read_tables_file,
    sqlite_path,
)
from tasks.text2sql.sources.spider.sqlite_import import DUCKDB_CONFIG, ConvertedDatabase, convert_cached


@dataclass(frozen=True)
class GoldFailure:
    """A gold query that could not be carried over to DuckDB, and why."""

    example_id: str
    db_id: str
    # "parse", "transpile", "timeout" or "duckdb <exception class>", e.g. "duckdb BinderException".
    category: str
    message: str
    sqlite_sql: str
    # None when it failed before there was DuckDB SQL.
    duckdb_sql: str | None


@dataclass(frozen=True)
class LoadReport:
    """What loading kept, left out and changed."""

    # Examples kept per split.
    counts: dict[str, int]
    # Gold queries left out of the splits.
    failures: tuple[GoldFailure, ...]
    # Gold queries each repair changed, by repair name (the REPAIR_* constants).
    repairs: dict[str, int]
    # "db.table.column" of numeric columns holding non-numeric text, loaded as VARCHAR.
    text_columns: tuple[str, ...] = ()
    # "db.table.column" of numeric columns whose blank strings were loaded as NULL.
    blank_as_null_columns: tuple[str, ...] = ()
    # The source's own difficulty label by example id (BIRD: simple/moderate/challenging).
    source_difficulty: dict[str, str] = field(default_factory=dict)


def load_spider(root: Path, cache_dir: Path | None = None) -> tuple[Text2SqlDataset, LoadReport]:
    """Load a Spider folder: tables.json, train_spider.json (+ train_others.json), dev.json, test.json.

    Splits "train", "dev" and "test" are those whose files exist; databases are read from
    database/<db_id>/<db_id>.sqlite, then test_database/. Raises DatasetError naming the file when
    the folder is malformed.
    """
    root, splits = spider_layout(root)
    raw, sqlite_paths = _read_splits(splits, SpiderRecord)
    if not raw:
        raise DatasetError(f"{root}: no Spider split file (train_spider.json, dev.json or test.json) holds a question")
    return _build("spider", raw, sqlite_paths, cache_dir or default_cache_dir("spider", root))


def load_bird(root: Path, cache_dir: Path | None = None) -> tuple[Text2SqlDataset, LoadReport]:
    """Load a BIRD folder: <split>/<split>.json with <split>_tables.json and <split>_databases/.

    The split folders "train" and "dev" may also lie flat in root (BIRD's dev release unpacks so).
    Evidence is kept on each example, BIRD's own difficulty label in LoadReport.source_difficulty.
    Raises DatasetError naming the file when the folder is malformed.
    """
    root, splits = bird_layout(root)
    raw, sqlite_paths = _read_splits(splits, BirdRecord)
    if not raw:
        raise DatasetError(f"{root}: no BIRD split file (train/train.json, dev/dev.json or dev.json) holds a question")
    return _build("bird", raw, sqlite_paths, cache_dir or default_cache_dir("bird", root))


def _read_splits(
    splits: tuple[SplitFiles, ...], record_type: type[SpiderRecord] | type[BirdRecord]
) -> tuple[list[RawExample], dict[str, Path]]:
    """The examples of the splits whose record files exist, and the SQLite file of each db_id they name.

    Raises:
        DatasetError: a file is malformed, a db_id is not described or has no database, or an id repeats.
    """
    raw: list[RawExample] = []
    sqlite_paths: dict[str, Path] = {}
    for files in splits:
        existing = [path for path in files.records if path.is_file()]
        tables = read_tables_file(files.tables)
        records = [(path, record) for path in existing for record in read_records(path, record_type)]
        seen: set[str] = set()
        for index, (path, record) in enumerate(records):
            sqlite_paths[record.db_id] = sqlite_path(record.db_id, path, tables, files.database_dirs)
            example = record.raw(files.split, index)
            if example.id in seen:
                raise DatasetError(f"{path}: entry {index} repeats the id of an earlier one ({example.id})")
            seen.add(example.id)
            raw.append(example)
    return raw, sqlite_paths


def _build(
    name: str, raw: list[RawExample], sqlite_paths: dict[str, Path], cache_dir: Path
) -> tuple[Text2SqlDataset, LoadReport]:
    cache_dir.mkdir(parents=True, exist_ok=True)
    # A study's trials open the same release at once; they take turns, so each database is converted once.
    with exclusive(cache_dir):
        return _build_locked(name, raw, sqlite_paths, cache_dir)


def _build_locked(
    name: str, raw: list[RawExample], sqlite_paths: dict[str, Path], cache_dir: Path
) -> tuple[Text2SqlDataset, LoadReport]:
    converted = {db_id: convert_cached(db_id, sqlite_paths[db_id], cache_dir) for db_id in sorted(sqlite_paths)}
    earlier_checks = GoldCheckCache.read(cache_dir / "gold_checks.json")
    # Written back with only this load's verdicts, so that the file does not grow with stale ones.
    checks = GoldCheckCache()
    kept: dict[str, Example] = {}
    failures: list[GoldFailure] = []
    repairs: Counter[str] = Counter()
    by_db: dict[str, list[RawExample]] = defaultdict(list)
    for example in raw:
        by_db[example.db_id].append(example)
    for db_id, examples in by_db.items():
        database = converted[db_id]
        with closing(duckdb.connect(str(database.path), read_only=True, config=DUCKDB_CONFIG)) as con:
            for example in examples:
                try:
                    kept[example.id], applied = _carry_over(example, database, con, earlier_checks, checks)
                except GoldRejectedError as rejected:
                    failures.append(
                        GoldFailure(
                            example_id=example.id,
                            db_id=db_id,
                            category=rejected.category,
                            message=rejected.message,
                            sqlite_sql=example.sqlite_sql,
                            duckdb_sql=rejected.duckdb_sql,
                        )
                    )
                    continue
                repairs.update(applied)
    checks.write(cache_dir / "gold_checks.json")

    splits: dict[str, list[Example]] = {split: [] for split in dict.fromkeys(e.split for e in raw)}
    for example in raw:
        if example.id in kept:
            splits[example.split].append(kept[example.id])
    text_columns = tuple(c for db in converted.values() for c in db.text_columns)
    blank_as_null_columns = tuple(c for db in converted.values() for c in db.blank_as_null_columns)
    report = LoadReport(
        counts={split: len(examples) for split, examples in splits.items()},
        failures=tuple(failures),
        repairs=dict(repairs),
        text_columns=text_columns,
        blank_as_null_columns=blank_as_null_columns,
        source_difficulty={e.id: e.source_difficulty for e in raw if e.source_difficulty is not None},
    )
    dataset = Text2SqlDataset(
        name=name,
        splits={split: tuple(examples) for split, examples in splits.items()},
        databases={db_id: Database(db_id=db_id, path=db.path) for db_id, db in converted.items()},
        notes=_notes(name, report),
    )
    return dataset, report


def _carry_over(
    example: RawExample,
    database: ConvertedDatabase,
    con: duckdb.DuckDBPyConnection,
    earlier_checks: GoldCheckCache,
    checks: GoldCheckCache,
) -> tuple[Example, set[str]]:
    """The example with DuckDB gold SQL that ran, and the repairs it took; raises GoldRejectedError."""
    tree, applied = transpile(example.sqlite_sql, database.schema)
    sql = generate(tree)
    check_gold(con, sql, database.signature, earlier_checks, checks)
    carried = Example(
        id=example.id,
        db_id=example.db_id,
        question=example.question,
        gold_sql=sql,
        difficulty=classify_expression(tree),
        evidence=example.evidence,
    )
    return carried, applied


def _notes(name: str, report: LoadReport) -> tuple[str, ...]:
    """One line per failure category, and one per kind of column the data forced to change."""
    by_category: dict[str, list[GoldFailure]] = defaultdict(list)
    for failure in report.failures:
        by_category[failure.category].append(failure)
    notes = []
    for category, failures in sorted(by_category.items()):
        first_line = failures[0].message.partition("\n")[0][:200]
        notes.append(
            f"{name}: {len(failures)} gold queries left out ({category}), "
            f"e.g. {failures[0].example_id}: {first_line}; all in LoadReport.failures"
        )
    if report.text_columns:
        notes.append(
            f"{name}: {len(report.text_columns)} numeric columns hold non-numeric text and were loaded "
            f"as VARCHAR: {', '.join(report.text_columns[:10])}"
        )
    if report.blank_as_null_columns:
        notes.append(
            f"{name}: blank strings in {len(report.blank_as_null_columns)} numeric columns were loaded "
            f"as NULL: {', '.join(report.blank_as_null_columns[:10])}"
        )
    return tuple(notes)
