"""Question/SQL pairs over a generated database, drawn from query shapes of every Spider difficulty.

Each shape picks tables and columns from the domain's description and values from the database itself,
so filters hit real rows; each has several phrasings, and conditions have their own, so two questions of
one shape rarely read alike.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import duckdb

from tasks.text2sql.generation.phrasing import (
    Condition,
    category_condition,
    choose,
    date_condition,
    filterable_columns,
    flag_condition,
    nice_number,
    number_condition,
    sql_literal,
)
from tasks.text2sql.generation.schema import Column, Domain, Role, Table


@dataclass(frozen=True)
class Candidate:
    question: str
    sql: str
    # A query whose rows must all differ, or the gold's order (or its LIMIT cut) is ambiguous.
    tie_check_sql: str | None = None


@dataclass
class Scope:
    """What shapes draw from: the domain, its primary database, and the run's random generator."""

    domain: Domain
    con: duckdb.DuckDBPyConnection
    rng: random.Random
    _values: dict[tuple[str, str], list[object]] = field(default_factory=dict)

    def values(self, table: Table, column: Column) -> list[object]:
        key = (table.name, column.name)
        if key not in self._values:
            rows = self.con.execute(
                f"SELECT DISTINCT {column.name} FROM {table.name} WHERE {column.name} IS NOT NULL "
                f"ORDER BY {column.name}"
            ).fetchall()
            self._values[key] = [r[0] for r in rows]
        return self._values[key]

    def value(self, table: Table, column: Column) -> object:
        return choose(self.rng, self.values(table, column))

    def threshold(self, table: Table, column: Column) -> float | int:
        values = self.values(table, column)
        quantile = values[int(len(values) * self.rng.uniform(0.2, 0.8))]
        return nice_number(quantile, column.decimals)

    def year(self, table: Table, column: Column) -> int:
        values = self.values(table, column)
        return values[int(len(values) * self.rng.uniform(0.2, 0.8))].year

    def condition(self, table: Table, alias: str = "", exclude: tuple[Column, ...] = ()) -> Condition | None:
        columns = [c for c in filterable_columns(table) if c not in exclude]
        if not columns:
            return None
        column = choose(self.rng, columns)
        if column.role is Role.CATEGORY:
            return category_condition(table, column, str(self.value(table, column)), self.rng, alias)
        if column.role is Role.NUMBER:
            above = self.rng.random() < 0.6 or (not column.below_phrases and self.rng.random() < 0.5)
            return number_condition(table, column, self.threshold(table, column), above, self.rng, alias)
        if column.role is Role.DATE:
            return date_condition(table, column, self.year(table, column), self.rng, alias)
        return flag_condition(table, column, self.rng, alias)

    def labelled_tables(self) -> list[Table]:
        return [t for t in self.domain.tables if t.label is not None]

    def pick_table(self, *roles: Role) -> Table | None:
        """A labelled table that has at least one column of each role."""
        fits = [t for t in self.labelled_tables() if all(t.by_role(r) for r in roles)]
        return choose(self.rng, fits) if fits else None

    def parent_child(self, parent_needs: tuple[Role, ...] = (), child_needs: tuple[Role, ...] = ()):
        """A (parent, child, foreign key) triple with a labelled parent."""
        pairs = [
            (parent, child, key)
            for parent in self.labelled_tables()
            if all(parent.by_role(r) for r in parent_needs)
            for child, key in self.domain.children_of(parent)
            if all(child.by_role(r) for r in child_needs)
        ]
        return choose(self.rng, pairs) if pairs else None


def _names(table: Table) -> str:
    """'names' / 'titles': the plural of the label's phrase."""
    phrase = table.label.phrase
    return phrase + ("es" if phrase.endswith(("s", "sh", "ch")) else "s")


def _noun(child: Table, key: Column) -> str:
    """What a child's row calls its parent: the key's own phrase ('home team') or the parent's noun."""
    return key.phrase or key.references.rstrip("s")


# --- easy -----------------------------------------------------------------------------------------------


def list_where(s: Scope) -> Candidate | None:
    t = s.pick_table()
    cond = t and s.condition(t)
    if cond is None:
        return None
    q = choose(
        s.rng,
        (
            f"List the {_names(t)} of {t.plural} {cond.rel}.",
            f"Which {t.plural} {cond.verb}?",
            f"Show the {t.label.phrase} of every {t.singular} {cond.rel}.",
            f"I need the {_names(t)} of all {t.plural} {cond.rel}.",
            f"Find the {t.plural} {cond.rel} and give their {_names(t)}.",
            f"What are the {_names(t)} of the {t.plural} {cond.rel}?",
        ),
    )
    return Candidate(q, f"SELECT {t.label.name} FROM {t.name} WHERE {cond.sql}")


def count_where(s: Scope) -> Candidate | None:
    t = s.pick_table()
    cond = t and s.condition(t)
    if cond is None:
        return None
    q = choose(
        s.rng,
        (
            f"How many {t.plural} {cond.verb}?",
            f"Count the {t.plural} {cond.rel}.",
            f"What is the number of {t.plural} {cond.rel}?",
            f"How many {t.plural} {cond.rel} are there?",
            f"Tell me how many {t.plural} {cond.verb}.",
        ),
    )
    return Candidate(q, f"SELECT COUNT(*) FROM {t.name} WHERE {cond.sql}")


def count_all(s: Scope) -> Candidate | None:
    t = choose(s.rng, s.domain.tables)
    q = choose(
        s.rng,
        (
            f"How many {t.plural} are there?",
            f"Count all {t.plural}.",
            f"What is the total number of {t.plural}?",
            f"How many {t.plural} are recorded?",
        ),
    )
    return Candidate(q, f"SELECT COUNT(*) FROM {t.name}")


def distinct_values(s: Scope) -> Candidate | None:
    t = s.pick_table(Role.CATEGORY)
    if t is None:
        return None
    c = choose(s.rng, t.by_role(Role.CATEGORY))
    q = choose(
        s.rng,
        (
            f"What different {c.phrase} values do {t.plural} have?",
            f"List the distinct {c.phrase} values of {t.plural}.",
            f"Which {c.phrase} values appear among the {t.plural}?",
            f"Show each {c.phrase} that at least one {t.singular} has, without repeats.",
        ),
    )
    return Candidate(q, f"SELECT DISTINCT {c.name} FROM {t.name}")


def attribute_of(s: Scope) -> Candidate | None:
    t = s.pick_table(Role.NUMBER)
    if t is None:
        return None
    c = choose(s.rng, t.by_role(Role.NUMBER) + t.by_role(Role.CATEGORY) + t.by_role(Role.DATE))
    name = str(s.value(t, t.label))
    q = choose(
        s.rng,
        (
            f"What is the {c.phrase} of {name}?",
            f"Give me the {c.phrase} of the {t.singular} {name}.",
            f"Tell me the {c.phrase} for the {t.singular} called {name}.",
            f"What {c.phrase} does {name} have?",
        ),
    )
    return Candidate(q, f"SELECT {c.name} FROM {t.name} WHERE {t.label.name} = {sql_literal(name)}")


def everything_about(s: Scope) -> Candidate | None:
    t = s.pick_table()
    if t is None:
        return None
    name = str(s.value(t, t.label))
    q = choose(
        s.rng,
        (
            f"Show all information about the {t.singular} {name}.",
            f"Give me every column for {name} in the {t.plural} table.",
            f"What do we know about the {t.singular} named {name}?",
        ),
    )
    return Candidate(q, f"SELECT * FROM {t.name} WHERE {t.label.name} = {sql_literal(name)}")


# --- medium ---------------------------------------------------------------------------------------------


def group_count(s: Scope) -> Candidate | None:
    t = s.pick_table(Role.CATEGORY)
    if t is None:
        return None
    c = choose(s.rng, t.by_role(Role.CATEGORY))
    q = choose(
        s.rng,
        (
            f"How many {t.plural} are there for each {c.phrase}?",
            f"Count the {t.plural} in each {c.phrase}.",
            f"For every {c.phrase}, how many {t.plural} are there?",
            f"Break down the number of {t.plural} by {c.phrase}.",
            f"Show each {c.phrase} with the number of {t.plural} that have it.",
        ),
    )
    return Candidate(q, f"SELECT {c.name}, COUNT(*) FROM {t.name} GROUP BY {c.name}")


AGGREGATES = {
    "AVG": ("average", "mean"),
    "MAX": ("maximum", "highest", "largest"),
    "MIN": ("minimum", "lowest", "smallest"),
    "SUM": ("total",),
}


def group_aggregate(s: Scope) -> Candidate | None:
    t = s.pick_table(Role.CATEGORY, Role.NUMBER)
    if t is None:
        return None
    c, n = choose(s.rng, t.by_role(Role.CATEGORY)), choose(s.rng, t.by_role(Role.NUMBER))
    fn, word = _aggregate(s, n)
    q = choose(
        s.rng,
        (
            f"What is the {word} {n.phrase} of {t.plural} for each {c.phrase}?",
            f"Show the {word} {n.phrase} per {c.phrase} across all {t.plural}.",
            f"For each {c.phrase}, give the {word} {n.phrase} of its {t.plural}.",
            f"List every {c.phrase} together with the {word} {n.phrase} of the {t.plural} in it.",
        ),
    )
    return Candidate(q, f"SELECT {c.name}, {fn}({n.name}) FROM {t.name} GROUP BY {c.name}")


def _aggregate(s: Scope, column: Column) -> tuple[str, str]:
    """An aggregate function that makes sense for the column, and a word for it."""
    functions = [f for f in AGGREGATES if f != "SUM" or column.additive]
    fn = choose(s.rng, functions)
    return fn, choose(s.rng, AGGREGATES[fn])


def aggregate_where(s: Scope) -> Candidate | None:
    t = s.pick_table(Role.NUMBER)
    if t is None:
        return None
    n = choose(s.rng, t.by_role(Role.NUMBER))
    cond = s.condition(t, exclude=(n,))
    if cond is None:
        return None
    fn, word = _aggregate(s, n)
    q = choose(
        s.rng,
        (
            f"What is the {word} {n.phrase} of {t.plural} {cond.rel}?",
            f"Find the {word} {n.phrase} among {t.plural} {cond.rel}.",
            f"Among {t.plural} {cond.rel}, what is the {word} {n.phrase}?",
        ),
    )
    return Candidate(q, f"SELECT {fn}({n.name}) FROM {t.name} WHERE {cond.sql}")


def top_k(s: Scope) -> Candidate | None:
    t = s.pick_table(Role.NUMBER)
    if t is None:
        return None
    n = choose(s.rng, t.by_role(Role.NUMBER))
    k = choose(s.rng, (1, 1, 3, 5, 10))
    highest = s.rng.random() < 0.6
    most = choose(s.rng, ("highest", "largest") if highest else ("lowest", "smallest"))
    direction = "DESC" if highest else "ASC"
    if k == 1:
        q = choose(
            s.rng,
            (
                f"Which {t.singular} has the {most} {n.phrase}?",
                f"Name the {t.singular} with the {most} {n.phrase}.",
                f"What is the {t.label.phrase} of the {t.singular} whose {n.phrase} is the {most}?",
            ),
        )
    else:
        q = choose(
            s.rng,
            (
                f"Which {k} {t.plural} have the {most} {n.phrase}?",
                f"List the {_names(t)} of the top {k} {t.plural} by {n.phrase}"
                + ("." if highest else ", starting from the lowest."),
                f"Give me the {k} {t.plural} with the {most} {n.phrase}.",
            ),
        )
    where = f"WHERE {n.name} IS NOT NULL " if n.null_fraction else ""
    order = f"ORDER BY {n.name} {direction}"
    return Candidate(
        q,
        f"SELECT {t.label.name} FROM {t.name} {where}{order} LIMIT {k}",
        tie_check_sql=f"SELECT {n.name} FROM {t.name} {where}{order} LIMIT {k + 1}",
    )


def ordered_list(s: Scope) -> Candidate | None:
    t = s.pick_table(Role.NUMBER)
    if t is None:
        return None
    n = choose(s.rng, t.by_role(Role.NUMBER))
    cond = s.condition(t, exclude=(n,))
    if cond is None:
        return None
    desc = s.rng.random() < 0.5
    order_words = "from highest to lowest" if desc else "from lowest to highest"
    q = choose(
        s.rng,
        (
            f"List the {t.plural} {cond.rel} with their {n.phrase}, {order_words}.",
            f"Show the {_names(t)} and {n.phrase} of {t.plural} {cond.rel}, sorted by {n.phrase} {order_words}.",
            f"Sort the {t.plural} {cond.rel} by {n.phrase} ({'descending' if desc else 'ascending'}) and show "
            f"each one's {t.label.phrase} and {n.phrase}.",
        ),
    )
    order = f"ORDER BY {n.name} {'DESC' if desc else 'ASC'}"
    return Candidate(
        q,
        f"SELECT {t.label.name}, {n.name} FROM {t.name} WHERE {cond.sql} {order}",
        tie_check_sql=f"SELECT {n.name} FROM {t.name} WHERE {cond.sql}",
    )


def two_conditions(s: Scope) -> Candidate | None:
    t = s.pick_table()
    first = t and s.condition(t)
    if first is None:
        return None
    second = s.condition(t)
    if second is None or second.sql == first.sql:
        return None
    both = s.rng.random() < 0.65
    joiner, sql_op = ("and", "AND") if both else ("or", "OR")
    q = choose(
        s.rng,
        (
            f"Which {t.plural} {first.verb} {joiner} {second.verb}?",
            f"List the {_names(t)} of {t.plural} that {first.verb} {joiner} {second.verb}.",
            f"Find {t.plural} {first.rel} {joiner} {second.rel}."
            if both
            else f"Show {t.plural} that either {first.verb} or {second.verb}.",
        ),
    )
    return Candidate(q, f"SELECT {t.label.name} FROM {t.name} WHERE {first.sql} {sql_op} {second.sql}")


def most_common(s: Scope) -> Candidate | None:
    t = s.pick_table(Role.CATEGORY)
    if t is None:
        return None
    c = choose(s.rng, t.by_role(Role.CATEGORY))
    q = choose(
        s.rng,
        (
            f"Which {c.phrase} has the most {t.plural}?",
            f"What is the most common {c.phrase} among {t.plural}?",
            f"Which {c.phrase} appears most often in the {t.plural} table?",
        ),
    )
    body = f"FROM {t.name} GROUP BY {c.name} ORDER BY COUNT(*) DESC"
    return Candidate(q, f"SELECT {c.name} {body} LIMIT 1", tie_check_sql=f"SELECT COUNT(*) {body} LIMIT 2")


def count_distinct(s: Scope) -> Candidate | None:
    t = s.pick_table(Role.CATEGORY)
    if t is None:
        return None
    c = choose(s.rng, t.by_role(Role.CATEGORY))
    q = choose(
        s.rng,
        (
            f"How many different {c.phrase} values are there among {t.plural}?",
            f"Count the distinct {c.phrase} values of {t.plural}.",
            f"In how many distinct {c.phrase} values do the {t.plural} fall?",
        ),
    )
    return Candidate(q, f"SELECT COUNT(DISTINCT {c.name}) FROM {t.name}")


def between(s: Scope) -> Candidate | None:
    t = s.pick_table(Role.NUMBER)
    if t is None:
        return None
    n = choose(s.rng, t.by_role(Role.NUMBER))
    low, high = sorted((s.threshold(t, n), s.threshold(t, n)))
    if low == high:
        return None
    q = choose(
        s.rng,
        (
            f"Which {t.plural} have a {n.phrase} between {low} and {high}?",
            f"List the {_names(t)} of {t.plural} whose {n.phrase} is from {low} to {high}, inclusive.",
            f"Find {t.plural} with {n.phrase} in the range {low} to {high}.",
        ),
    )
    return Candidate(q, f"SELECT {t.label.name} FROM {t.name} WHERE {n.name} BETWEEN {low} AND {high}")


def child_of_named_parent(s: Scope) -> Candidate | None:
    pair = s.parent_child()
    if pair is None:
        return None
    parent, child, key = pair
    if child.label is None:
        return None
    name = str(s.value(parent, parent.label))
    noun = _noun(child, key)
    q = choose(
        s.rng,
        (
            f"List the {_names(child)} of all {child.plural} whose {noun} is {name}.",
            f"Which {child.plural} have {name} as their {noun}?",
            f"Show the {child.plural} of the {parent.singular} {name}.",
            f"Give the {_names(child)} of {child.plural} linked to the {parent.singular} named {name}.",
        ),
    )
    return Candidate(
        q,
        f"SELECT c.{child.label.name} FROM {child.name} AS c JOIN {parent.name} AS p "
        f"ON c.{key.name} = p.{parent.primary_key.name} WHERE p.{parent.label.name} = {sql_literal(name)}",
    )


# --- hard -----------------------------------------------------------------------------------------------


def above_average(s: Scope) -> Candidate | None:
    t = s.pick_table(Role.NUMBER)
    if t is None:
        return None
    n = choose(s.rng, t.by_role(Role.NUMBER))
    above = s.rng.random() < 0.6
    word = "above" if above else "below"
    q = choose(
        s.rng,
        (
            f"Which {t.plural} have a {n.phrase} {word} the average?",
            f"List the {_names(t)} of {t.plural} whose {n.phrase} is {'higher' if above else 'lower'} than the "
            f"average {n.phrase} of all {t.plural}.",
            f"Find every {t.singular} with a {n.phrase} {word} average.",
        ),
    )
    op = ">" if above else "<"
    return Candidate(q, f"SELECT {t.label.name} FROM {t.name} WHERE {n.name} {op} (SELECT AVG({n.name}) FROM {t.name})")


def extreme_by_subquery(s: Scope) -> Candidate | None:
    t = s.pick_table(Role.NUMBER)
    if t is None:
        return None
    n = choose(s.rng, t.by_role(Role.NUMBER))
    fn, word = choose(s.rng, (("MAX", "highest"), ("MIN", "lowest")))
    q = choose(
        s.rng,
        (
            f"Which {t.singular} has the {word} {n.phrase}? Include ties.",
            f"List every {t.singular} whose {n.phrase} equals the {word} {n.phrase} of all {t.plural}.",
            f"Who or what has the {word} {n.phrase} among {t.plural}? List all of them if tied.",
        ),
    )
    return Candidate(q, f"SELECT {t.label.name} FROM {t.name} WHERE {n.name} = (SELECT {fn}({n.name}) FROM {t.name})")


def parents_with_many_children(s: Scope) -> Candidate | None:
    pair = s.parent_child()
    if pair is None:
        return None
    parent, child, key = pair
    counts = [
        r[0] for r in s.con.execute(f"SELECT COUNT(*) FROM {child.name} GROUP BY {key.name} ORDER BY 1").fetchall()
    ]
    k = nice_number(counts[int(len(counts) * s.rng.uniform(0.4, 0.9))], 0)
    q = choose(
        s.rng,
        (
            f"Which {parent.plural} have more than {k} {child.plural}? Show each one's {parent.label.phrase} and "
            f"its number of {child.plural}.",
            f"For {parent.plural} with over {k} {child.plural}, list the {parent.label.phrase} and the "
            f"{child.singular} count.",
            f"Give the {_names(parent)} of {parent.plural} that have more than {k} {child.plural}, with how many "
            "each has.",
        ),
    )
    return Candidate(
        q,
        f"SELECT p.{parent.label.name}, COUNT(*) FROM {parent.name} AS p JOIN {child.name} AS c "
        f"ON c.{key.name} = p.{parent.primary_key.name} GROUP BY p.{parent.primary_key.name}, "
        f"p.{parent.label.name} HAVING COUNT(*) > {k}",
    )


def parents_without_children(s: Scope) -> Candidate | None:
    pair = s.parent_child()
    if pair is None:
        return None
    parent, child, key = pair
    q = choose(
        s.rng,
        (
            f"Which {parent.plural} have no {child.plural}?",
            f"List the {_names(parent)} of {parent.plural} that do not appear in any {child.singular}.",
            f"Find {parent.plural} without a single {child.singular}.",
            f"Show the {parent.plural} never referenced by a {child.singular} as its {_noun(child, key)}.",
        ),
    )
    return Candidate(
        q,
        f"SELECT {parent.label.name} FROM {parent.name} WHERE {parent.primary_key.name} NOT IN "
        f"(SELECT {key.name} FROM {child.name} WHERE {key.name} IS NOT NULL)",
    )


def parents_with_matching_child(s: Scope) -> Candidate | None:
    pair = s.parent_child()
    if pair is None:
        return None
    parent, child, key = pair
    cond = s.condition(child)
    if cond is None:
        return None
    q = choose(
        s.rng,
        (
            f"Which {parent.plural} have at least one {child.singular} {cond.rel}?",
            f"List the {_names(parent)} of {parent.plural} with some {child.singular} {cond.rel}.",
            f"Find {parent.plural} that have {child.plural} {cond.rel}.",
        ),
    )
    return Candidate(
        q,
        f"SELECT {parent.label.name} FROM {parent.name} WHERE {parent.primary_key.name} IN "
        f"(SELECT {key.name} FROM {child.name} WHERE {cond.sql})",
    )


def aggregate_per_parent(s: Scope) -> Candidate | None:
    pair = s.parent_child(child_needs=(Role.NUMBER,))
    if pair is None:
        return None
    parent, child, key = pair
    n = choose(s.rng, child.by_role(Role.NUMBER))
    fn, word = _aggregate(s, n)
    q = choose(
        s.rng,
        (
            f"What is the {word} {n.phrase} of {child.plural} for each {parent.singular}? Show the "
            f"{parent.singular}'s {parent.label.phrase}.",
            f"For every {parent.singular}, list its {parent.label.phrase} and the {word} {n.phrase} of its "
            f"{child.plural}.",
            f"Show each {parent.singular} {parent.label.phrase} with the {word} {n.phrase} across its {child.plural}.",
        ),
    )
    return Candidate(
        q,
        f"SELECT p.{parent.label.name}, {fn}(c.{n.name}) FROM {parent.name} AS p JOIN {child.name} AS c "
        f"ON c.{key.name} = p.{parent.primary_key.name} GROUP BY p.{parent.primary_key.name}, p.{parent.label.name}",
    )


def groups_with_high_average(s: Scope) -> Candidate | None:
    t = s.pick_table(Role.CATEGORY, Role.NUMBER)
    if t is None:
        return None
    c, n = choose(s.rng, t.by_role(Role.CATEGORY)), choose(s.rng, t.by_role(Role.NUMBER))
    averages = sorted(
        r[0]
        for r in s.con.execute(
            f"SELECT AVG({n.name}) FROM {t.name} GROUP BY {c.name} HAVING AVG({n.name}) IS NOT NULL"
        ).fetchall()
    )
    if len(averages) < 2:
        return None
    threshold = nice_number(averages[int(len(averages) * s.rng.uniform(0.2, 0.7))], n.decimals)
    q = choose(
        s.rng,
        (
            f"Which {c.phrase} values have an average {n.phrase} above {threshold} among their {t.plural}?",
            f"List each {c.phrase} whose {t.plural} average more than {threshold} in {n.phrase}.",
            f"For which {c.phrase} is the mean {n.phrase} of {t.plural} greater than {threshold}?",
        ),
    )
    return Candidate(q, f"SELECT {c.name} FROM {t.name} GROUP BY {c.name} HAVING AVG({n.name}) > {threshold}")


def top_children_of_filtered_parents(s: Scope) -> Candidate | None:
    pair = s.parent_child(parent_needs=(Role.CATEGORY,), child_needs=(Role.NUMBER,))
    if pair is None:
        return None
    parent, child, key = pair
    if child.label is None:
        return None
    cond = s.condition(parent, alias="p")
    if cond is None:
        return None
    n = choose(s.rng, child.by_role(Role.NUMBER))
    k = choose(s.rng, (1, 3, 5))
    q = choose(
        s.rng,
        (
            f"Among {child.plural} of {parent.plural} {cond.rel}, which {k} have the highest {n.phrase}?"
            if k > 1
            else f"Among {child.plural} of {parent.plural} {cond.rel}, which one has the highest {n.phrase}?",
            f"List the {_names(child)} of the {k} {child.plural} with the highest {n.phrase} whose "
            f"{_noun(child, key)} is one of the {parent.plural} {cond.rel}.",
        ),
    )
    body = (
        f"FROM {child.name} AS c JOIN {parent.name} AS p ON c.{key.name} = p.{parent.primary_key.name} "
        f"WHERE {cond.sql} AND c.{n.name} IS NOT NULL ORDER BY c.{n.name} DESC"
    )
    return Candidate(
        q,
        f"SELECT c.{child.label.name} {body} LIMIT {k}",
        tie_check_sql=f"SELECT c.{n.name} {body} LIMIT {k + 1}",
    )


# --- extra ----------------------------------------------------------------------------------------------


def categories_with_both(s: Scope) -> Candidate | None:
    t = s.pick_table(Role.CATEGORY)
    if t is None:
        return None
    c = choose(s.rng, t.by_role(Role.CATEGORY))
    first = s.condition(t, exclude=(c,))
    second = s.condition(t, exclude=(c,))
    if first is None or second is None or first.sql == second.sql:
        return None
    q = choose(
        s.rng,
        (
            f"Which {c.phrase} values have both {t.plural} {first.rel} and {t.plural} {second.rel}?",
            f"Find the {c.phrase} values shared by {t.plural} {first.rel} and by {t.plural} {second.rel}.",
        ),
    )
    return Candidate(
        q,
        f"SELECT {c.name} FROM {t.name} WHERE {first.sql} INTERSECT SELECT {c.name} FROM {t.name} WHERE {second.sql}",
    )


def either_condition_union(s: Scope) -> Candidate | None:
    t = s.pick_table()
    first = t and s.condition(t)
    second = t and s.condition(t)
    if first is None or second is None or first.sql == second.sql:
        return None
    q = choose(
        s.rng,
        (
            f"Give the distinct {_names(t)} of {t.plural} {first.rel}, together with those of {t.plural} {second.rel}.",
            f"Combine the {t.plural} {first.rel} with the {t.plural} {second.rel} and list their {_names(t)} "
            "without duplicates.",
        ),
    )
    return Candidate(
        q,
        f"SELECT {t.label.name} FROM {t.name} WHERE {first.sql} UNION SELECT {t.label.name} FROM {t.name} "
        f"WHERE {second.sql}",
    )


def parents_except_matching_child(s: Scope) -> Candidate | None:
    pair = s.parent_child()
    if pair is None:
        return None
    parent, child, key = pair
    cond = s.condition(child, alias="c")
    if cond is None:
        return None
    q = choose(
        s.rng,
        (
            f"Which {parent.plural} never had a {child.singular} {cond.rel}?",
            f"List the {_names(parent)} of {parent.plural} except those with a {child.singular} {cond.rel}.",
            f"Find the {parent.plural} that have no {child.plural} {cond.rel}.",
        ),
    )
    return Candidate(
        q,
        f"SELECT {parent.label.name} FROM {parent.name} EXCEPT SELECT p.{parent.label.name} FROM {parent.name} AS p "
        f"JOIN {child.name} AS c ON c.{key.name} = p.{parent.primary_key.name} WHERE {cond.sql}",
    )


def through_bridge(s: Scope) -> Candidate | None:
    """A -< B >- C: rows of A linked through B to rows of C that meet a condition (three tables)."""
    triples = [
        (a, b, key_a, c, key_c)
        for a in s.labelled_tables()
        for b, key_a in s.domain.children_of(a)
        for key_c in b.by_role(Role.FOREIGN_KEY)
        if key_c is not key_a
        for c in [s.domain.table(key_c.references)]
        if c is not a
    ]
    if not triples:
        return None
    a, b, key_a, c, key_c = choose(s.rng, triples)
    cond = s.condition(c, alias="z")
    if cond is None:
        return None
    q = choose(
        s.rng,
        (
            f"Find the {_names(a)} of {a.plural} with at least one {b.singular} involving a {c.singular} {cond.rel}.",
            f"Which {a.plural} have {b.plural} involving {c.plural} {cond.rel}?",
            f"List the distinct {a.plural} connected through {b.plural} to {c.plural} {cond.rel}.",
        ),
    )
    return Candidate(
        q,
        f"SELECT DISTINCT x.{a.label.name} FROM {a.name} AS x JOIN {b.name} AS y ON y.{key_a.name} = "
        f"x.{a.primary_key.name} JOIN {c.name} AS z ON y.{key_c.name} = z.{c.primary_key.name} WHERE {cond.sql}",
    )


def busier_than_average(s: Scope) -> Candidate | None:
    pair = s.parent_child()
    if pair is None:
        return None
    parent, child, key = pair
    q = choose(
        s.rng,
        (
            f"Which {parent.plural} have more {child.plural} than the average {parent.singular} with any "
            f"{child.plural}?",
            f"List the {_names(parent)} of {parent.plural} whose number of {child.plural} is above the average "
            f"count per {parent.singular} (counting only {parent.plural} that have some).",
        ),
    )
    return Candidate(
        q,
        f"SELECT p.{parent.label.name} FROM {parent.name} AS p JOIN {child.name} AS c ON c.{key.name} = "
        f"p.{parent.primary_key.name} GROUP BY p.{parent.primary_key.name}, p.{parent.label.name} "
        f"HAVING COUNT(*) > (SELECT COUNT(*) * 1.0 / COUNT(DISTINCT {key.name}) FROM {child.name})",
    )


def parent_with_most_children(s: Scope) -> Candidate | None:
    pair = s.parent_child(parent_needs=(Role.CATEGORY,))
    if pair is None:
        pair = s.parent_child()
    if pair is None:
        return None
    parent, child, key = pair
    q = choose(
        s.rng,
        (
            f"Which {parent.singular} has the most {child.plural}?",
            f"Name the {parent.singular} with the largest number of {child.plural}.",
            f"What is the {parent.label.phrase} of the {parent.singular} that has the most {child.plural}?",
        ),
    )
    body = (
        f"FROM {parent.name} AS p JOIN {child.name} AS c ON c.{key.name} = p.{parent.primary_key.name} "
        f"GROUP BY p.{parent.primary_key.name}, p.{parent.label.name} ORDER BY COUNT(*) DESC"
    )
    return Candidate(q, f"SELECT p.{parent.label.name} {body} LIMIT 1", tie_check_sql=f"SELECT COUNT(*) {body} LIMIT 2")


Shape = Callable[[Scope], Candidate | None]

# Weights tilt the draw toward the shapes that have many distinct instances.
SHAPES: tuple[tuple[Shape, float], ...] = (
    (list_where, 3),
    (count_where, 2.5),
    (count_all, 0.3),
    (distinct_values, 0.5),
    (attribute_of, 2),
    (everything_about, 0.7),
    (group_count, 0.7),
    (group_aggregate, 1.5),
    (aggregate_where, 2.5),
    (top_k, 2),
    (ordered_list, 1.5),
    (two_conditions, 3),
    (most_common, 0.6),
    (count_distinct, 0.4),
    (between, 1.5),
    (child_of_named_parent, 2),
    (above_average, 1),
    (extreme_by_subquery, 1),
    (parents_with_many_children, 1.2),
    (parents_without_children, 0.5),
    (parents_with_matching_child, 2),
    (aggregate_per_parent, 1.2),
    (groups_with_high_average, 1.2),
    (top_children_of_filtered_parents, 1.5),
    (categories_with_both, 1.5),
    (either_condition_union, 1.5),
    (parents_except_matching_child, 1.5),
    (through_bridge, 2.5),
    (busier_than_average, 0.6),
    (parent_with_most_children, 0.8),
)


def draw_candidate(scope: Scope) -> Candidate | None:
    shapes, weights = zip(*SHAPES, strict=True)
    shape = scope.rng.choices(shapes, weights)[0]
    return shape(scope)
