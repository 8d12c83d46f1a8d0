"""Declarative description of a generated database: tables, columns and how their values are drawn.

The question generator reads the same description, so every column carries the words a person would
use for it ("hire date", "salary") alongside its SQL name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Role(StrEnum):
    """What a column is for, which decides how rows fill it and which questions can use it."""

    ID = "id"  # integer primary key 1..n
    FOREIGN_KEY = "foreign_key"  # id of a row in another table
    LABEL = "label"  # what a person calls a row: a name, a title, a code
    CATEGORY = "category"  # one of a small set of values
    NUMBER = "number"  # a measured quantity
    DATE = "date"
    FLAG = "flag"  # a boolean


@dataclass(frozen=True)
class Column:
    """One column, its SQL type, its words, and its value distribution."""

    name: str
    sql_type: str
    role: Role
    phrase: str = ""
    # CATEGORY: the values to draw from; LABEL: fixed names, one row each (otherwise a name pool is used).
    values: tuple[str, ...] = ()
    # LABEL without fixed values: the pool that makes names ("person", or a key of pools.NAME_PARTS).
    pool: str = ""
    low: float = 0.0
    high: float = 0.0
    decimals: int = 0
    # FOREIGN_KEY: the referenced table (its ID column).
    references: str = ""
    # Optional phrasings of a filter on this column, with {v} for the value,
    # e.g. "work in the {v} department" or "earn more than {v}".
    equals_phrases: tuple[str, ...] = ()
    above_phrases: tuple[str, ...] = ()
    below_phrases: tuple[str, ...] = ()
    # Fraction of NULLs, so questions and matching meet missing values.
    null_fraction: float = 0.0
    # NUMBER: whether a total makes sense (prices, quantities) or not (years, ratings, rates).
    additive: bool = True


@dataclass(frozen=True)
class Table:
    """One table: its nouns and columns; `rows` is ignored when the label has fixed values."""

    name: str
    singular: str
    plural: str
    columns: tuple[Column, ...]
    rows: int = 0

    @property
    def label(self) -> Column | None:
        return next((c for c in self.columns if c.role is Role.LABEL), None)

    @property
    def primary_key(self) -> Column:
        return next(c for c in self.columns if c.role is Role.ID)

    def by_role(self, role: Role) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.role is role)

    @property
    def row_count(self) -> int:
        label = self.label
        return len(label.values) if label is not None and label.values else self.rows


@dataclass(frozen=True)
class Domain:
    """A database schema: the unit that splits keep apart (train databases never appear in test)."""

    db_id: str
    description: str
    tables: tuple[Table, ...]
    extra_pools: dict[str, tuple[tuple[str, ...], ...]] = field(default_factory=dict)

    def table(self, name: str) -> Table:
        return next(t for t in self.tables if t.name == name)

    def children_of(self, parent: Table) -> tuple[tuple[Table, Column], ...]:
        """Tables with a foreign key into `parent`, with that key column."""
        return tuple((t, c) for t in self.tables for c in t.by_role(Role.FOREIGN_KEY) if c.references == parent.name)


def pk(name: str = "id") -> Column:
    return Column(name, "INTEGER", Role.ID)


def fk(name: str, references: str, phrase: str = "") -> Column:
    return Column(name, "INTEGER", Role.FOREIGN_KEY, phrase=phrase, references=references)


def label(name: str, phrase: str, pool: str = "", values: tuple[str, ...] = ()) -> Column:
    return Column(name, "VARCHAR", Role.LABEL, phrase=phrase, pool=pool, values=values)


def category(
    name: str,
    phrase: str,
    values: tuple[str, ...],
    equals_phrases: tuple[str, ...] = (),
    null_fraction: float = 0.0,
) -> Column:
    return Column(
        name,
        "VARCHAR",
        Role.CATEGORY,
        phrase=phrase,
        values=values,
        equals_phrases=equals_phrases,
        null_fraction=null_fraction,
    )


def number(
    name: str,
    phrase: str,
    low: float,
    high: float,
    decimals: int = 0,
    above_phrases: tuple[str, ...] = (),
    below_phrases: tuple[str, ...] = (),
    null_fraction: float = 0.0,
    additive: bool = True,
) -> Column:
    sql_type = "INTEGER" if decimals == 0 else f"DECIMAL(12,{decimals})"
    return Column(
        name,
        sql_type,
        Role.NUMBER,
        phrase=phrase,
        low=low,
        high=high,
        decimals=decimals,
        above_phrases=above_phrases,
        below_phrases=below_phrases,
        null_fraction=null_fraction,
        additive=additive,
    )


def date(name: str, phrase: str, first_year: int, last_year: int) -> Column:
    return Column(name, "DATE", Role.DATE, phrase=phrase, low=first_year, high=last_year)


def flag(name: str, phrase: str, equals_phrases: tuple[str, ...] = ()) -> Column:
    return Column(name, "BOOLEAN", Role.FLAG, phrase=phrase, equals_phrases=equals_phrases)
