"""Filter conditions as SQL and as the words a person would use for them.

A condition comes in two grammatical forms so templates can place it anywhere:
`verb` follows a subject ("employees [earn more than 50000]"),
`rel` modifies a noun ("employees [whose salary is above 50000]").
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from decimal import Decimal

from tasks.text2sql.sources.domains.schema import Column, Role, Table


@dataclass(frozen=True)
class Condition:
    sql: str
    verb: str
    rel: str


def sql_literal(value: object) -> str:
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return str(value)


def nice_number(value: float | Decimal, decimals: int) -> float | int:
    """Round to two significant figures, as a person would say a threshold."""
    value = float(value)
    if value == 0:
        return 0
    magnitude = 10 ** (len(str(int(abs(value)))) - 2)
    rounded = round(value / magnitude) * magnitude if abs(value) >= 10 else round(value, max(decimals, 1))
    return int(rounded) if decimals == 0 or float(rounded).is_integer() else rounded


def pronoun(table: Table) -> str:
    label = table.label
    return "who" if label is not None and label.pool == "person" else "that"


def choose(rng: random.Random, options: tuple[str, ...] | list[str]) -> str:
    return options[rng.randrange(len(options))]


def column_ref(column: Column, alias: str) -> str:
    return f"{alias}.{column.name}" if alias else column.name


def category_condition(table: Table, column: Column, value: str, rng: random.Random, alias: str = "") -> Condition:
    sql = f"{column_ref(column, alias)} = {sql_literal(value)}"
    if column.equals_phrases and rng.random() < 0.6:
        phrase = choose(rng, column.equals_phrases).format(v=value)
        return Condition(sql, phrase, f"{pronoun(table)} {phrase}")
    verb = choose(rng, (f"have {value} as their {column.phrase}", f"have the {column.phrase} {value}"))
    rel = choose(
        rng,
        (
            f"whose {column.phrase} is {value}",
            f"with {column.phrase} {value}",
            f"with the {column.phrase} '{value}'",
        ),
    )
    return Condition(sql, verb, rel)


def number_condition(
    table: Table, column: Column, threshold: float | int, above: bool, rng: random.Random, alias: str = ""
) -> Condition:
    sql = f"{column_ref(column, alias)} {'>' if above else '<'} {threshold}"
    custom = column.above_phrases if above else column.below_phrases
    if custom and rng.random() < 0.6:
        phrase = choose(rng, custom).format(v=threshold)
        return Condition(sql, phrase, f"{pronoun(table)} {phrase}")
    more, less = ("above", "more than", "greater than", "over"), ("below", "less than", "under", "lower than")
    word = choose(rng, more if above else less)
    verb = choose(rng, (f"have a {column.phrase} {word} {threshold}", f"have {column.phrase} {word} {threshold}"))
    rel = choose(rng, (f"whose {column.phrase} is {word} {threshold}", f"with a {column.phrase} {word} {threshold}"))
    return Condition(sql, verb, rel)


def date_condition(table: Table, column: Column, year: int, rng: random.Random, alias: str = "") -> Condition:
    ref = column_ref(column, alias)
    kind = rng.randrange(3)
    if kind == 0:
        sql, words = f"{ref} > DATE '{year}-12-31'", choose(rng, (f"after {year}", f"later than {year}"))
    elif kind == 1:
        sql, words = f"{ref} < DATE '{year}-01-01'", choose(rng, (f"before {year}", f"earlier than {year}"))
    else:
        sql, words = f"year({ref}) = {year}", f"in {year}"
    verb = f"have a {column.phrase} {words}"
    rel = choose(rng, (f"whose {column.phrase} is {words}", f"with a {column.phrase} {words}"))
    return Condition(sql, verb, rel)


def flag_condition(table: Table, column: Column, rng: random.Random, alias: str = "") -> Condition:
    phrase = choose(rng, column.equals_phrases)
    return Condition(f"{column_ref(column, alias)} = true", phrase, f"{pronoun(table)} {phrase}")


def filterable_columns(table: Table) -> tuple[Column, ...]:
    """Columns a question can filter on with words: categories, numbers, dates, described flags."""
    return tuple(
        c
        for c in table.columns
        if c.role in (Role.CATEGORY, Role.NUMBER, Role.DATE) or (c.role is Role.FLAG and c.equals_phrases)
    )
