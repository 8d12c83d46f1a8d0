"""A domain as the generators use it: tables, columns and how their values are drawn, every default resolved.

The question generators read the same description, so every column carries the words a person would use for it
("hire date", "salary") alongside its SQL name. `loader.py` builds these from the domain files.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

# The label pool that is not words but codes: two letters and a number ("KQ4821"), drawn per row.
FLIGHT_NUMBERS = "flight"


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
    # CATEGORY: the values to draw from; LABEL: fixed names, one row each (otherwise drawn from `pool`).
    values: tuple[str, ...] = ()
    # LABEL without fixed values: the pool that names are drawn from per row ("person", "product", FLIGHT_NUMBERS)
    # and its word lists, one word drawn from each.
    pool: str = ""
    parts: tuple[tuple[str, ...], ...] = ()
    low: float = 0.0
    high: float = 0.0
    decimals: int = 0
    # FOREIGN_KEY: the referenced table (its ID column); a NUMBER that names its own table holds another row's id.
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
    """One table: its nouns, how many rows it has and its columns, the key first."""

    name: str
    singular: str
    plural: str
    columns: tuple[Column, ...]
    rows: int

    @property
    def label(self) -> Column | None:
        return next((c for c in self.columns if c.role is Role.LABEL), None)

    @property
    def primary_key(self) -> Column:
        return next(c for c in self.columns if c.role is Role.ID)

    def by_role(self, role: Role) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.role is role)

    def parents(self) -> tuple[str, ...]:
        """Names of the tables this one has a foreign key into."""
        return tuple(c.references for c in self.by_role(Role.FOREIGN_KEY))


@dataclass(frozen=True)
class Domain:
    """A database schema: the unit that splits keep apart (train databases never appear in test).

    A synthesized domain is the template its databases are drawn from; its `db_id` is the domain's name.
    """

    db_id: str
    description: str
    tables: tuple[Table, ...]

    def table(self, name: str) -> Table:
        return next(t for t in self.tables if t.name == name)

    def children_of(self, parent: Table) -> tuple[tuple[Table, Column], ...]:
        """Tables with a foreign key into `parent`, with that key column."""
        return tuple((t, c) for t in self.tables for c in t.by_role(Role.FOREIGN_KEY) if c.references == parent.name)
