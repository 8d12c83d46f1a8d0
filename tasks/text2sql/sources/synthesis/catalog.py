"""The compact form a training domain is written in, compiled into `generation.schema` tables.

A domain names its tables and columns by canonical concepts in snake_case ("pet", "birth_date"); the naming
styles of `naming.py` render them as a real schema would spell them. Labels that are not people's names get one
fixed, distinct value per row, composed from word parts, so rows.py's generator can fill them unchanged.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from tasks.text2sql.sources.generation.schema import Column, Role
from tasks.text2sql.sources.seeding import derived_rng


@dataclass(frozen=True)
class TableSpec:
    """One table of a domain: its concept (singular, snake_case), its plural, rows and columns (the key first)."""

    concept: str
    plural: str
    rows: int
    columns: tuple[Column, ...]

    def parents(self) -> tuple[str, ...]:
        """Concepts of the tables this one references (itself excluded)."""
        return tuple(c.references for c in self.columns if c.role is Role.FOREIGN_KEY)


@dataclass(frozen=True)
class DomainSpec:
    """A domain: a subject area whose tables the databases of `schemas.py` are drawn from."""

    name: str
    description: str
    tables: tuple[TableSpec, ...]

    def table(self, concept: str) -> TableSpec:
        return next(t for t in self.tables if t.concept == concept)


@dataclass(frozen=True)
class _Label:
    """A label column whose values are composed per row once the table's size is known."""

    name: str
    phrase: str
    first: tuple[str, ...]
    second: tuple[str, ...]
    # With a prefix the values are codes ("INV-0042") instead of word pairs.
    prefix: str = ""


@dataclass(frozen=True)
class _SelfReference:
    """The id of another row of the same table (a manager, a parent category); NULL for the roots."""

    name: str
    phrase: str


def _words(name: str) -> str:
    return name.replace("_", " ")


def plural_of(noun: str) -> str:
    """English plural of the last word of a snake_case concept."""
    if noun.endswith(("s", "x", "ch", "sh")):
        return noun + "es"
    if noun.endswith("y") and noun[-2:-1] not in tuple("aeiou"):
        return noun[:-1] + "ies"
    return noun + "s"


def ref(parent: str, role: str = "", phrase: str = "", null: float = 0.0) -> Column:
    """A foreign key into `parent`'s key, named after the role it plays (`role`, by default the parent)."""
    name = f"{role or parent}_id"
    words = phrase or _words(role or parent)
    return Column(name, "INTEGER", Role.FOREIGN_KEY, phrase=words, references=parent, null_fraction=null)


def self_ref(role: str, phrase: str = "") -> _SelfReference:
    """A column holding the id of another row of the same table, without a declared foreign key: DuckDB checks a
    self-referencing key row by row while loading, and seeded rows point forward as often as back."""
    return _SelfReference(f"{role}_id", phrase or _words(role))


def person(name: str = "name", phrase: str = "") -> Column:
    return Column(name, "VARCHAR", Role.LABEL, phrase=phrase or _words(name), pool="person")


def named(name: str, first: str, second: str, phrase: str = "") -> _Label:
    """A label composed from two word lists ("Oak" + "Clinic"), each written '|'-separated."""
    parts = tuple(p.strip() for p in first.split("|")), tuple(p.strip() for p in second.split("|"))
    return _Label(name, phrase or _words(name), *parts)


def code(name: str, prefix: str, phrase: str = "") -> _Label:
    """A label that is a code: `prefix`-number, distinct per row."""
    return _Label(name, phrase or _words(name), (), (), prefix=prefix)


def cat(name: str, values: str, phrase: str = "", null: float = 0.0) -> Column:
    """A category; `values` written '|'-separated."""
    return Column(
        name,
        "VARCHAR",
        Role.CATEGORY,
        phrase=phrase or _words(name),
        values=tuple(values.split("|")),
        null_fraction=null,
    )


def num(
    name: str, low: float, high: float, decimals: int = 0, phrase: str = "", additive: bool = True, null: float = 0.0
) -> Column:
    sql_type = "INTEGER" if decimals == 0 else f"DECIMAL(12,{decimals})"
    return Column(
        name,
        sql_type,
        Role.NUMBER,
        phrase=phrase or _words(name),
        low=low,
        high=high,
        decimals=decimals,
        additive=additive,
        null_fraction=null,
    )


def day(name: str, first_year: int, last_year: int, phrase: str = "") -> Column:
    return Column(name, "DATE", Role.DATE, phrase=phrase or _words(name), low=first_year, high=last_year)


def yes(name: str, phrase: str = "") -> Column:
    return Column(name, "BOOLEAN", Role.FLAG, phrase=phrase or _words(name))


def table(concept: str, rows: int, *columns: Column | _Label | _SelfReference, plural: str = "") -> TableSpec:
    """A table spec: an integer key `id`, then `columns`, with labels and self-references resolved for `rows`."""
    resolved = [Column("id", "INTEGER", Role.ID)]
    for column in columns:
        if isinstance(column, _Label):
            resolved.append(
                Column(
                    column.name,
                    "VARCHAR",
                    Role.LABEL,
                    phrase=column.phrase,
                    values=_label_values(concept, column, rows),
                )
            )
        elif isinstance(column, _SelfReference):
            resolved.append(
                Column(
                    column.name,
                    "INTEGER",
                    Role.NUMBER,
                    phrase=column.phrase,
                    low=1,
                    high=rows,
                    references=concept,
                    additive=False,
                    null_fraction=0.15,
                )
            )
        else:
            resolved.append(column)
    return TableSpec(concept, plural or plural_of(concept), rows, tuple(resolved))


def _label_values(concept: str, label: _Label, rows: int) -> tuple[str, ...]:
    """Distinct values while the word parts allow, as names of things are; beyond that they repeat, as headlines and
    menu items do in real data."""
    rng = derived_rng("labels", concept, label.name)
    if label.prefix:
        return tuple(f"{label.prefix}-{n}" for n in rng.sample(range(1000, 10000), rows))
    pairs = [_compose(a, b) for a, b in itertools.product(label.first, label.second)]
    return tuple(rng.sample(pairs, rows) if len(pairs) >= rows else rng.choices(pairs, k=rows))


def _compose(first: str, second: str) -> str:
    """'Oak' + 'Clinic' is 'Oak Clinic'; a second part that is one lower-case word or starts with a hyphen is a
    suffix ('Amoxi' + 'cillin', 'core' + '-service')."""
    if not second:
        return first
    suffix = second[0] == "-" or (second[0].islower() and " " not in second)
    return first + second if suffix else f"{first} {second}"
