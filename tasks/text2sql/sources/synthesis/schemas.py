"""The databases of the synthesized data: for each domain, its full schema and subsets of it, each spelled in a
naming style of its own, as `domains.schema.Domain`s that rows.py fills.

Everything here is a pure function of the seed.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from dataclasses import dataclass

from tasks.text2sql.sources.domains.loader import Family, load_family
from tasks.text2sql.sources.domains.schema import Column, Domain, Role, Table
from tasks.text2sql.sources.seeding import derived_rng
from tasks.text2sql.sources.synthesis.naming import NamingStyle, is_plain_identifier

# One database per domain has the domain's full schema; the others are subsets of it.
DATABASES_PER_DOMAIN = 3
MIN_TABLES = 2


@dataclass(frozen=True)
class SynthDatabase:
    """One database: its schema in its naming style, and what the names of its opaque columns hide."""

    db_id: str
    domain: str
    description: str
    schema: Domain
    style: NamingStyle
    # (table, column) of the columns whose names do not say what they hold.
    opaque: frozenset[tuple[str, str]]

    def meaning(self, table: Table, column: Column) -> str:
        """What a column holds, in words: "the pet's weight in kilograms"."""
        return f"the {table.singular}'s {column.phrase}"


def _ancestors(spec: Domain, concept: str) -> set[str]:
    """The table and every table it references, directly or through others."""
    seen = {concept}
    frontier = [concept]
    while frontier:
        for parent in spec.table(frontier.pop()).parents():
            if parent not in seen:
                seen.add(parent)
                frontier.append(parent)
    return seen


def _subset(spec: Domain, size: int, rng: random.Random) -> list[Table]:
    """At least `size` connected tables of the domain, closed under references (no child without its parent)."""
    chosen = _ancestors(spec, rng.choice(spec.tables).name)
    while len(chosen) < size:
        neighbours = [
            t.name
            for t in spec.tables
            if t.name not in chosen
            and (chosen & set(t.parents()) or any(t.name in spec.table(c).parents() for c in chosen))
        ]
        chosen |= _ancestors(spec, rng.choice(neighbours))
    return [t for t in spec.tables if t.name in chosen]


def _render(spec: Domain, tables: list[Table], db_id: str, style: NamingStyle, rng: random.Random) -> SynthDatabase:
    """The tables of a domain (named by concept) spelled in `style`, as the schema of database `db_id`."""
    referenced = {parent for t in tables for parent in t.parents()}
    table_names = {t.name: _table_name(style, t, t.name in referenced) for t in tables}
    key_names = {t.name: _safe(style.key_name(t.name), t.name) for t in tables}
    rendered: list[Table] = []
    opaque: set[tuple[str, str]] = set()
    for spec_table in tables:
        name = table_names[spec_table.name]
        attributes = [c for c in spec_table.columns if c.role not in (Role.ID, Role.FOREIGN_KEY, Role.LABEL)]
        attributes = [c for c in attributes if not c.references]
        hidden = set(rng.sample([c.name for c in attributes], round(len(attributes) * style.opaque_share)))
        columns: list[Column] = []
        used: set[str] = set()
        for column in spec_table.columns:
            if column.role is Role.ID:
                column_name = key_names[spec_table.name]
                new = dataclasses.replace(column, name=column_name)
            elif column.role is Role.FOREIGN_KEY:
                role = column.name.removesuffix("_id")
                column_name = _safe(style.reference_name(role), spec_table.name)
                new = dataclasses.replace(column, name=column_name, references=table_names[column.references])
            elif column.references:  # a self-reference, which rows.py fills as a number
                role = column.name.removesuffix("_id")
                column_name = _safe(style.reference_name(role), spec_table.name)
                new = dataclasses.replace(column, name=column_name, references=name)
            elif column.name in hidden:
                column_name = style.opaque_name(len([c for c in columns if (name, c.name) in opaque]) + 1)
                new = dataclasses.replace(column, name=column_name)
                opaque.add((name, column_name))
            else:
                column_name = _safe(
                    style.column_name(column.name, spec_table.name, column.role is Role.LABEL), spec_table.name
                )
                new = dataclasses.replace(column, name=column_name)
            if column_name.lower() in used:
                new = dataclasses.replace(new, name=f"{column_name}{len(used)}")
            used.add(new.name.lower())
            columns.append(new)
        rendered.append(
            Table(
                name,
                spec_table.singular,
                spec_table.plural,
                tuple(columns),
                spec_table.rows,
            )
        )
    schema = Domain(db_id, spec.description, tuple(rendered))
    return SynthDatabase(db_id, spec.db_id, spec.description, schema, style, frozenset(opaque))


def _table_name(style: NamingStyle, spec_table: Table, referenced: bool) -> str:
    plural_concept = spec_table.plural.replace(" ", "_")
    name = style.table_name(spec_table.name, plural_concept, referenced)
    if is_plain_identifier(name):
        return name
    # A reserved word ("order"): the plural, then a prefixed form, as schema authors work around it.
    plural = dataclasses.replace(style, plural_tables=True).table_name(spec_table.name, plural_concept, referenced)
    return plural if is_plain_identifier(plural) else f"tbl_{name}"


def _safe(name: str, table_concept: str) -> str:
    """A column name that stands unquoted: a reserved word gets its table's name in front."""
    return name if is_plain_identifier(name) else f"{table_concept}_{name}"


@functools.cache
def synth_databases(seed: int) -> tuple[SynthDatabase, ...]:
    """Every database of the synthesized data, in a fixed order: DATABASES_PER_DOMAIN per domain."""
    databases: list[SynthDatabase] = []
    for spec in load_family(Family.SYNTHESIZED)["train"]:
        for index in range(DATABASES_PER_DOMAIN):
            db_id = f"{spec.db_id}_{index + 1}"
            rng = derived_rng(seed, "schema", db_id)
            if index == 0:
                tables = list(spec.tables)
            else:
                tables = _subset(spec, rng.randint(MIN_TABLES, len(spec.tables) - 1), rng)
            databases.append(_render(spec, tables, db_id, NamingStyle.draw(rng), rng))
    return tuple(databases)
