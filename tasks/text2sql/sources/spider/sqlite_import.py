"""Converting a SQLite database into a DuckDB file: reading it with sqlite3, choosing each column's type from
its declaration and its values, carrying its case-insensitive text columns over (COLLATE NOCASE) and its declared
keys (as table comments: `declared_keys`), writing the DuckDB file, and keeping it in the cache until the SQLite file
changes.
"""

from __future__ import annotations

import sqlite3
from collections import defaultdict
from contextlib import closing
from dataclasses import dataclass, replace
from pathlib import Path

import duckdb
import sqlglot
from pydantic import BaseModel, ValidationError
from sqlglot import exp
from sqlglot.errors import SqlglotError

from tasks.text2sql.declared_keys import DeclaredKeys, ForeignKey
from tasks.text2sql.errors import DatasetError
from tasks.text2sql.sources.spider.cache import write_atomically

# Bump when the conversion changes, so that cached DuckDB files are rebuilt.
CONVERTER_VERSION = 2
# DuckDB 2.0 would otherwise try to download extensions (sqlite, icu…) on first use; we run offline.
DUCKDB_CONFIG = {"autoload_known_extensions": False, "autoinstall_known_extensions": False}
_INSERT_CHUNK_ROWS = 100_000
# SQLite allows 2000 result columns; five probes per column stay under it.
_PROFILE_CHUNK_COLUMNS = 300


@dataclass(frozen=True)
class Schema:
    """Column types of one converted database, by lower-cased table and column name."""

    columns: dict[str, dict[str, str]]

    def type_of(self, table: str, column: str) -> str | None:
        return self.columns.get(table.lower(), {}).get(column.lower())


@dataclass(frozen=True)
class ConvertedDatabase:
    path: Path
    schema: Schema
    # Changes when the source or the converter changes; keys the cached gold checks.
    signature: str
    text_columns: tuple[str, ...]
    blank_as_null_columns: tuple[str, ...]


class _ConversionManifest(BaseModel):
    """What a cached DuckDB file was built from, to tell whether it is still current."""

    converter_version: int
    sqlite_path: str
    sqlite_size: int
    sqlite_mtime_ns: int
    text_columns: tuple[str, ...]
    blank_as_null_columns: tuple[str, ...]


@dataclass(frozen=True)
class _ColumnPlan:
    duckdb_type: str
    # The SQLite expression that reads the column's values as duckdb_type expects them.
    select_sql: str
    text_fallback: bool
    blanks_as_null: bool
    # SQLite compares the column's text ignoring ASCII case (declared COLLATE NOCASE); DuckDB's NOCASE does the same.
    nocase: bool = False

    @property
    def column_type(self) -> str:
        collated = self.nocase and self.duckdb_type == "VARCHAR"
        return f"{self.duckdb_type} COLLATE NOCASE" if collated else self.duckdb_type


def convert_cached(db_id: str, sqlite_path: Path, cache_dir: Path) -> ConvertedDatabase:
    """The DuckDB copy of a SQLite database, rebuilt only when the SQLite file's size or mtime changed."""
    duckdb_path = cache_dir / f"{db_id}.duckdb"
    manifest_path = cache_dir / f"{db_id}.manifest.json"
    stat = sqlite_path.stat()
    expected = (CONVERTER_VERSION, str(sqlite_path), stat.st_size, stat.st_mtime_ns)
    manifest = None
    if duckdb_path.is_file() and manifest_path.is_file():
        try:
            manifest = _ConversionManifest.model_validate_json(manifest_path.read_bytes())
        except (OSError, ValidationError):
            manifest = None
    if manifest is None or expected != (
        manifest.converter_version,
        manifest.sqlite_path,
        manifest.sqlite_size,
        manifest.sqlite_mtime_ns,
    ):
        plans = _convert(db_id, sqlite_path, duckdb_path)
        manifest = _ConversionManifest(
            converter_version=CONVERTER_VERSION,
            sqlite_path=str(sqlite_path),
            sqlite_size=stat.st_size,
            sqlite_mtime_ns=stat.st_mtime_ns,
            text_columns=tuple(name for name, plan in plans.items() if plan.text_fallback),
            blank_as_null_columns=tuple(name for name, plan in plans.items() if plan.blanks_as_null),
        )
        write_atomically(manifest_path, manifest.model_dump_json())
    with closing(duckdb.connect(str(duckdb_path), read_only=True, config=DUCKDB_CONFIG)) as con:
        rows = con.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns WHERE table_schema = 'main'"
        ).fetchall()
    columns: dict[str, dict[str, str]] = defaultdict(dict)
    for table, column, data_type in rows:
        columns[table.lower()][column.lower()] = data_type
    return ConvertedDatabase(
        path=duckdb_path,
        schema=Schema(columns=dict(columns)),
        signature=":".join(str(part) for part in expected),
        text_columns=manifest.text_columns,
        blank_as_null_columns=manifest.blank_as_null_columns,
    )


def _convert(db_id: str, sqlite_path: Path, duckdb_path: Path) -> dict[str, _ColumnPlan]:
    """Copy every table of a SQLite file into a new DuckDB file; the plan of each "db.table.column"."""
    partial = duckdb_path.with_name(duckdb_path.name + ".partial")
    for leftover in (partial, partial.with_name(partial.name + ".wal")):
        leftover.unlink(missing_ok=True)
    plans: dict[str, _ColumnPlan] = {}
    try:
        with (
            closing(sqlite3.connect(sqlite_path.as_uri() + "?mode=ro", uri=True)) as source,
            closing(duckdb.connect(str(partial), config=DUCKDB_CONFIG)) as target,
        ):
            # Spider and BIRD hold some invalid UTF-8; keep the row rather than fail the database.
            source.text_factory = lambda raw: raw.decode("utf-8", errors="replace")
            tables = source.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'"
            ).fetchall()
            for (table,) in tables:
                table_plans = _copy_table(source, target, table)
                plans.update({f"{db_id}.{table}.{column}": plan for column, plan in table_plans.items()})
            target.execute("CHECKPOINT")
    except sqlite3.Error as error:
        partial.unlink(missing_ok=True)
        raise DatasetError(
            f"{sqlite_path}: not a readable SQLite database ({error}); replace it with the release's copy (an "
            "unpacking cut short leaves such files)"
        ) from error
    partial.replace(duckdb_path)
    return plans


def _copy_table(source: sqlite3.Connection, target: duckdb.DuckDBPyConnection, table: str) -> dict[str, _ColumnPlan]:
    declared = [(row[1], row[2]) for row in source.execute(f"PRAGMA table_info({_quote(table)})")]
    # TEXT affinity makes every value text, so those columns need no look at their values.
    profiles = _profile_columns(source, table, [name for name, t in declared if _affinity(t) != "TEXT"])
    nocase = _nocase_columns(source, table)
    plans = {
        name: replace(_plan_column(name, t, profiles.get(name, _ColumnProfile())), nocase=name.lower() in nocase)
        for name, t in declared
    }
    target.execute(
        f"CREATE TABLE {_quote(table)} ("
        + ", ".join(f"{_quote(name)} {plan.column_type}" for name, plan in plans.items())
        + ")"
    )
    insert = f"INSERT INTO {_quote(table)} SELECT " + ", ".join(
        f"UNNEST(${i}::{plan.duckdb_type}[])" for i, plan in enumerate(plans.values(), start=1)
    )
    cursor = source.execute(
        "SELECT " + ", ".join(plan.select_sql for plan in plans.values()) + f" FROM {_quote(table)}"
    )
    while rows := cursor.fetchmany(_INSERT_CHUNK_ROWS):
        target.execute(insert, [list(values) for values in zip(*rows, strict=True)])
    keys = _declared_keys(source, table)
    if keys.primary_key or keys.foreign_keys:
        # COMMENT takes no parameter, only a literal.
        comment = keys.as_comment().replace("'", "''")
        target.execute(f"COMMENT ON TABLE {_quote(table)} IS '{comment}'")
    return plans


def _declared_keys(source: sqlite3.Connection, table: str) -> DeclaredKeys:
    """The primary key and foreign keys the SQLite schema declares for a table."""
    by_id: dict[int, list[tuple]] = defaultdict(list)
    # (id, seq, table, from, to, …); `to` is NULL where the key names the referenced table's primary key.
    for row in source.execute(f"PRAGMA foreign_key_list({_quote(table)})").fetchall():
        by_id[row[0]].append(row)
    foreign_keys = []
    # SQLite numbers a table's foreign keys from the last declared.
    for _, rows in sorted(by_id.items(), reverse=True):
        rows.sort(key=lambda row: row[1])
        referenced = rows[0][2]
        targets = [row[4] for row in rows]
        if any(target is None for target in targets):
            targets = _primary_key_of(source, referenced) or targets
        if all(targets):
            foreign_keys.append(
                ForeignKey(
                    columns=tuple(row[3] for row in rows), references=referenced, referenced_columns=tuple(targets)
                )
            )
    return DeclaredKeys(primary_key=tuple(_primary_key_of(source, table)), foreign_keys=tuple(foreign_keys))


def _primary_key_of(source: sqlite3.Connection, table: str) -> list[str]:
    """The columns of a table's primary key, in key order (table_info's `pk` is each one's position, 0 for none)."""
    columns = source.execute(f"PRAGMA table_info({_quote(table)})").fetchall()
    return [row[1] for row in sorted(columns, key=lambda row: row[5]) if row[5] > 0]


def _nocase_columns(source: sqlite3.Connection, table: str) -> set[str]:
    """Lower-cased names of the columns the table's CREATE statement declares COLLATE NOCASE.

    SQLite has no pragma for a column's collation, so it is read from the statement; one sqlglot cannot parse keeps
    SQLite's default (binary) collation for every column.
    """
    row = source.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()
    try:
        create = sqlglot.parse_one(row[0], read="sqlite") if row and row[0] else None
    except SqlglotError:
        return set()
    if create is None:
        return set()
    return {
        column.name.lower()
        for column in create.find_all(exp.ColumnDef)
        for constraint in column.constraints
        if isinstance(constraint.kind, exp.CollateColumnConstraint) and constraint.kind.this.name.upper() == "NOCASE"
    }


@dataclass(frozen=True)
class _ColumnProfile:
    """Which SQLite storage classes a column's values use."""

    has_integer: bool = False
    has_real: bool = False
    # Text other than blanks.
    has_text: bool = False
    has_blank_text: bool = False
    has_blob: bool = False


def _profile_columns(source: sqlite3.Connection, table: str, names: list[str]) -> dict[str, _ColumnProfile]:
    probes = (
        "typeof({c}) = 'integer'",
        "typeof({c}) = 'real'",
        "typeof({c}) = 'text' AND trim({c}) <> ''",
        "typeof({c}) = 'text' AND trim({c}) = ''",
        "typeof({c}) = 'blob'",
    )
    profiles = {}
    for start in range(0, len(names), _PROFILE_CHUNK_COLUMNS):
        chunk = names[start : start + _PROFILE_CHUNK_COLUMNS]
        selects = [f"coalesce(max({p.format(c=_quote(name))}), 0)" for name in chunk for p in probes]
        row = source.execute(f"SELECT {', '.join(selects)} FROM {_quote(table)}").fetchone()
        for i, name in enumerate(chunk):
            profiles[name] = _ColumnProfile(*(bool(v) for v in row[i * len(probes) : (i + 1) * len(probes)]))
    return profiles


def _affinity(declared_type: str) -> str:
    """SQLite's type affinity of a declared column type (section 3.1 of SQLite's datatype page)."""
    upper = declared_type.upper()
    if "INT" in upper:
        return "INTEGER"
    if any(word in upper for word in ("CHAR", "CLOB", "TEXT")):
        return "TEXT"
    if "BLOB" in upper or not upper:
        return "BLOB"
    if any(word in upper for word in ("REAL", "FLOA", "DOUB")):
        return "REAL"
    return "NUMERIC"


def _plan_column(name: str, declared_type: str, profile: _ColumnProfile) -> _ColumnPlan:
    """The DuckDB type of a SQLite column, from its declared type and the values it really holds.

    SQLite types values, not columns, so the values decide where they disagree with the declaration:
    - TEXT affinity (CHAR, VARCHAR, TEXT…): VARCHAR.
    - INTEGER, REAL and NUMERIC affinity (INT…, REAL/FLOAT/DOUBLE, NUMERIC/DECIMAL/DATE/BOOLEAN…):
      BIGINT when every value is an integer (SQLite stores 3.00 in a NUMERIC column as integer 3),
      DOUBLE when some are reals or the affinity is REAL. Blank strings among the numbers become
      NULL; any other text makes the whole column VARCHAR, every value as SQLite's text of it,
      so nothing is lost. Without numbers the declaration decides: NUMERIC/DECIMAL → DOUBLE, and
      DATE/DATETIME and other names → VARCHAR (SQLite keeps dates as text, so they compare as text).
    - BLOB or no declared type: BLOB, BIGINT, DOUBLE or VARCHAR by the values; mixed values → VARCHAR.
    """
    column = _quote(name)
    upper = declared_type.upper()
    affinity = _affinity(declared_type)
    has_number = profile.has_integer or profile.has_real
    has_text = profile.has_text or profile.has_blank_text
    number_type = "DOUBLE" if profile.has_real or affinity == "REAL" else "BIGINT"
    text = _ColumnPlan("VARCHAR", f"CAST({column} AS TEXT)", text_fallback=False, blanks_as_null=False)

    def numbers(duckdb_type: str) -> _ColumnPlan:
        value = f"CAST({column} AS REAL)" if duckdb_type == "DOUBLE" else column
        return _ColumnPlan(
            duckdb_type,
            f"CASE WHEN typeof({column}) IN ('integer', 'real') THEN {value} END",
            text_fallback=False,
            blanks_as_null=profile.has_blank_text,
        )

    if affinity == "TEXT":
        return text
    if affinity == "BLOB":
        if has_number and not (has_text or profile.has_blob):
            return numbers(number_type)
        if not (has_number or has_text):
            duckdb_type = "BLOB" if profile.has_blob or "BLOB" in upper else "VARCHAR"
            return _ColumnPlan(duckdb_type, column, text_fallback=False, blanks_as_null=False)
        return text
    declared = {"INTEGER": "BIGINT", "REAL": "DOUBLE"}.get(affinity, "VARCHAR")
    if affinity == "NUMERIC" and ("NUM" in upper or "DEC" in upper):
        declared = "DOUBLE"
    if profile.has_text or profile.has_blob:
        return replace(text, text_fallback=has_number or declared != "VARCHAR")
    if has_number:
        return numbers(number_type)
    return text if declared == "VARCHAR" else numbers(declared)


def _quote(identifier: str) -> str:
    """A double-quoted identifier, which SQLite and DuckDB both read with its case and spaces."""
    return '"' + identifier.replace('"', '""') + '"'
