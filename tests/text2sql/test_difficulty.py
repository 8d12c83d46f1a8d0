"""Spider's hardness levels, on queries of Spider's concert_singer database."""

from __future__ import annotations

import pytest

from tasks.text2sql.dataset import Difficulty
from tasks.text2sql.errors import DatasetError
from tasks.text2sql.sources.difficulty import classify_difficulty


@pytest.mark.parametrize(
    ("sql", "difficulty"),
    [
        ("SELECT count(*) FROM singer", Difficulty.EASY),
        ("SELECT name FROM singer WHERE age > 20", Difficulty.EASY),
        # Two selected columns and an ORDER BY.
        ("SELECT name, country, age FROM singer ORDER BY age DESC", Difficulty.MEDIUM),
        # Several aggregates and several columns, one WHERE.
        ("SELECT avg(age), min(age), max(age) FROM singer WHERE country = 'France'", Difficulty.MEDIUM),
        # A JOIN and a GROUP BY.
        (
            "SELECT T2.name, count(*) FROM concert AS T1 JOIN stadium AS T2 "
            "ON T1.stadium_id = T2.stadium_id GROUP BY T1.stadium_id",
            Difficulty.MEDIUM,
        ),
        # One nested query.
        ("SELECT name FROM stadium WHERE stadium_id NOT IN (SELECT stadium_id FROM concert)", Difficulty.HARD),
        # One set operation.
        (
            "SELECT country FROM singer WHERE age > 40 INTERSECT SELECT country FROM singer WHERE age < 30",
            Difficulty.HARD,
        ),
        # WHERE, GROUP BY, ORDER BY, LIMIT and a JOIN.
        (
            "SELECT T2.name, T2.capacity FROM concert AS T1 JOIN stadium AS T2 ON T1.stadium_id = T2.stadium_id "
            "WHERE T1.year >= 2014 GROUP BY T2.stadium_id ORDER BY count(*) DESC LIMIT 1",
            Difficulty.EXTRA,
        ),
    ],
)
def test_spider_hardness(sql: str, difficulty: Difficulty) -> None:
    assert classify_difficulty(sql) == difficulty


def test_negated_condition_counts_as_an_aggregate_as_in_spider() -> None:
    assert classify_difficulty("SELECT count(*) FROM singer WHERE country IN ('France')") == Difficulty.EASY
    assert classify_difficulty("SELECT count(*) FROM singer WHERE country NOT IN ('France')") == Difficulty.MEDIUM


def test_ilike_counts_as_like() -> None:
    assert classify_difficulty("SELECT name FROM singer WHERE name ILIKE '%a%'") == Difficulty.MEDIUM


def test_unparseable_sql_is_named() -> None:
    with pytest.raises(DatasetError, match="SELEC name FRM singer"):
        classify_difficulty("SELEC name FRM singer")


def test_statement_that_is_not_a_query_is_refused() -> None:
    with pytest.raises(DatasetError, match="not a SELECT query"):
        classify_difficulty("DELETE FROM singer")
