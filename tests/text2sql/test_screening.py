"""Screening untrusted SQL on its text alone, before anything runs: no database is needed to refuse a statement."""

from __future__ import annotations

from collections.abc import Iterator

import duckdb
import pytest

from tasks.text2sql.sql.screening import RefusedSqlError, screen


@pytest.fixture
def bare() -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection to an empty in-memory database: screening only parses with it."""
    with duckdb.connect(":memory:") as connection:
        yield connection


@pytest.mark.parametrize(
    ("sql", "blocked", "reason"),
    [
        ("SELECT 1; SELECT 2", True, "only one query"),
        ("DELETE FROM orders", True, "only a single read-only query"),
        ("SELECT * FROM read_csv('/etc/passwd')", True, "reads files"),
        ("SELECT getenv('HOME')", True, "outside this database"),
        ("SELECT repeat('x', 1000000000)", True, "unbounded size"),
        ("x" * 101, True, "exceeds the limit of 100"),
        ("SELEC 1", False, "syntax error"),
        ("SELECT '\ud800'", False, "not valid Unicode"),
    ],
)
def test_a_refusal_says_why_and_whether_the_statement_is_forbidden_or_not_sql(
    bare: duckdb.DuckDBPyConnection, sql: str, blocked: bool, reason: str
) -> None:
    with pytest.raises(RefusedSqlError, match=reason) as refused:
        screen(bare, sql, max_sql_chars=100)
    assert refused.value.blocked is blocked


def test_what_screening_passes_is_the_parsed_query_that_runs(bare: duckdb.DuckDBPyConnection) -> None:
    statement = screen(bare, "SELECT * FROM range(3) AS t(n) WHERE n > 0", max_sql_chars=100)
    assert statement.type is duckdb.StatementType.SELECT
    # A table function is allowed right after FROM, where it streams rows instead of building one value.
    assert bare.execute(statement).fetchall() == [(1,), (2,)]
