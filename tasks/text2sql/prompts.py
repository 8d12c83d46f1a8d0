"""Rendering an example into a prompt, and a completion back into one SQL statement."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb
import sqlglot
from sqlglot import exp

from tasks.text2sql.dataset import Example
from tasks.text2sql.declared_keys import DeclaredKeys

INSTRUCTION = (
    "Write one DuckDB SQL query that answers the question. Use only the tables and columns of the schema. "
    "End the query with a semicolon."
)


def _quote(name: str) -> str:
    return name if name.isidentifier() and name.islower() else '"' + name.replace('"', '""') + '"'


@functools.lru_cache(maxsize=256)
def schema_ddl(db_path: Path) -> tuple[tuple[str, str], ...]:
    """(table name, CREATE TABLE statement) for every table of a database, one column a line.

    Rendered from the catalog rather than DuckDB's stored one-line DDL, which is hard for a model to read; keys are
    the database's constraints, or those a converted release declares without enforcing them (`declared_keys`).
    """
    with duckdb.connect(str(db_path), read_only=True, config={"autoload_known_extensions": False}) as con:
        columns = con.execute(
            "SELECT table_name, column_name, data_type FROM duckdb_columns() WHERE NOT internal "
            "ORDER BY table_oid, column_index"
        ).fetchall()
        constraints = con.execute(
            "SELECT table_name, constraint_type, constraint_column_names, referenced_table, referenced_column_names "
            "FROM duckdb_constraints() WHERE constraint_type IN ('PRIMARY KEY', 'FOREIGN KEY') "
            "ORDER BY table_oid, constraint_index"
        ).fetchall()
        comments = con.execute("SELECT table_name, comment FROM duckdb_tables() WHERE NOT internal").fetchall()
    lines: dict[str, list[str]] = {}
    for table, column, data_type in columns:
        lines.setdefault(table, []).append(f"{_quote(column)} {data_type}")
    for table, comment in comments:
        declared = DeclaredKeys.of_comment(comment)
        if declared is not None and table in lines:
            if declared.primary_key:
                constraints.append((table, "PRIMARY KEY", declared.primary_key, None, ()))
            constraints += [
                (table, "FOREIGN KEY", key.columns, key.references, key.referenced_columns)
                for key in declared.foreign_keys
            ]
    for table, kind, names, referenced, referenced_names in constraints:
        keys = ", ".join(_quote(n) for n in names)
        if kind == "PRIMARY KEY":
            lines[table].append(f"PRIMARY KEY ({keys})")
        else:
            targets = ", ".join(_quote(n) for n in referenced_names)
            lines[table].append(f"FOREIGN KEY ({keys}) REFERENCES {_quote(referenced)}({targets})")
    return tuple(
        (table, f"CREATE TABLE {_quote(table)} (\n  " + ",\n  ".join(body) + "\n);") for table, body in lines.items()
    )


def tables_used(sql: str) -> set[str]:
    """Lower-cased names of the tables a query reads (CTE names excluded)."""
    try:
        tree = sqlglot.parse_one(sql, read="duckdb")
    except sqlglot.errors.ParseError:
        return set()
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    return {t.name.lower() for t in tree.find_all(exp.Table)} - ctes


@dataclass(frozen=True)
class FewShot:
    """A solved example and the database it runs on, shown before the question."""

    example: Example
    db_path: Path


def schema_block(db_path: Path, only: set[str] | None = None) -> str:
    """The CREATE TABLE statements of a database, or of the tables in `only` (lowercased names)."""
    return "\n".join(ddl for name, ddl in schema_ddl(db_path) if only is None or name.lower() in only)


def render_prompt(
    example: Example, db_path: Path, few_shot: Sequence[FewShot] = (), tables: set[str] | None = None
) -> str:
    """A plain-text prompt for a base or instruction model; the answer follows the final 'SQL:'.

    Few-shot blocks show only the tables their own query uses, to keep prompts short; the question's block shows the
    whole schema, or only `tables` (lowercased names) when given.
    """
    parts = [INSTRUCTION, ""]
    for shot in few_shot:
        parts += [
            "Schema:",
            schema_block(shot.db_path, tables_used(shot.example.gold_sql)),
            f"Question: {shot.example.question}",
            f"SQL: {shot.example.gold_sql};",
            "",
        ]
    parts += ["Schema:", schema_block(db_path, tables), f"Question: {example.question}"]
    if example.evidence:
        parts.append(f"Hint: {example.evidence}")
    parts.append("SQL:")
    return "\n".join(parts)


@dataclass(frozen=True)
class ParsedCompletion:
    """The SQL found in a completion, and how cleanly the completion delivered it."""

    sql: str
    # The statement ended with ';' (or the completion ended) and nothing but whitespace or a fence followed.
    clean_stop: bool
    # Text after the first statement (another statement, prose, a next "Question:"...).
    trailing: str


# Where a base model starts its next few-shot block; without a semicolon a blank line ends the query too.
_NEXT_BLOCK = re.compile(r"\n(?:Question|Schema|Hint|SQL):", re.IGNORECASE)
_NEXT_BLOCK_OR_BLANK_LINE = re.compile(r"\n\s*\n|\n(?:Question|Schema|Hint|SQL):", re.IGNORECASE)
_FENCE = re.compile(r"```(?:sql|duckdb)?\s*\n?(.*?)(?:```|$)", re.DOTALL | re.IGNORECASE)


def _first_statement_end(text: str) -> int:
    """Index of the first ';' outside quotes and comments, or -1."""
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in "'\"":
            close = text.find(ch, i + 1)
            while close != -1 and close + 1 < n and text[close + 1] == ch:  # doubled quote escapes itself
                close = text.find(ch, close + 2)
            if close == -1:
                return -1
            i = close + 1
            continue
        if text.startswith("--", i):
            newline = text.find("\n", i)
            i = n if newline == -1 else newline + 1
            continue
        if text.startswith("/*", i):
            close = text.find("*/", i + 2)
            i = n if close == -1 else close + 2
            continue
        if ch == ";":
            return i
        i += 1
    return -1


def parse_completion(completion: str) -> ParsedCompletion:
    """Strip code fences and cut at the first statement end; a base model's continuation rambles on."""
    text = completion
    fenced = _FENCE.search(text)
    if fenced:
        text = fenced.group(1)
    text = text.strip()
    if text[:4].lower() == "sql:":
        text = text[4:].lstrip()
    end = _first_statement_end(text)
    next_block = _NEXT_BLOCK.search(text, 0, end) if end != -1 else _NEXT_BLOCK_OR_BLANK_LINE.search(text)
    if next_block:
        sql, trailing = text[: next_block.start()].strip(), text[next_block.start() :].strip()
    elif end == -1:
        sql, trailing = text.strip(), ""
    else:
        sql, trailing = text[:end].strip(), text[end + 1 :].strip()
    outside_fence = completion[fenced.end() :].strip() if fenced else ""
    trailing = (trailing + "\n" + outside_fence).strip()
    return ParsedCompletion(sql=sql, clean_stop=bool(sql) and not trailing, trailing=trailing)
