"""Question/SQL pairs over a generated database, from templates of every Spider difficulty.

A template is data: draws that pick tables and columns from the domain's description and values from the
database itself, so filters hit real rows; several phrasings; and the SQL. Phrasings and SQL are format
strings over what was drawn, and conditions have phrasings of their own, so two questions of one template
rarely read alike.

Some forms are kept for the held-out splits alone, so dev and test measure transfer to questions whose shape
training never showed: whole template families (`held_out=True`) and, for the other families, phrasings of their
own (`held_out_phrasings`). A question of either is of an unseen form.
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import duckdb

from tasks.text2sql.dataset import QuestionForm
from tasks.text2sql.sources.domains.schema import Column, Domain, Role, Table
from tasks.text2sql.sources.generation.phrasing import (
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

# In a held-out split, the chance that a family with phrasings of its own asks in one of them.
HELD_OUT_PHRASING_SHARE = 0.4


@dataclass(frozen=True)
class Candidate:
    question: str
    sql: str
    form: QuestionForm
    # A query whose rows must all differ, or the gold's order (or its LIMIT cut) is ambiguous.
    tie_check_sql: str | None = None


@dataclass
class Scope:
    """What templates draw from: the domain, its primary database, the run's random generator, and whether the
    questions are for a held-out split (which alone may ask in the forms kept from training)."""

    domain: Domain
    con: duckdb.DuckDBPyConnection
    rng: random.Random
    held_out: bool
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


def _noun(key: Column) -> str:
    """What a child's row calls its parent: the key's phrase ('home team', 'customer')."""
    return key.phrase


# Words no attribute holds, written as format specs: "{t:names}", "{key:noun}", "{name:literal}".
_SPECS: dict[str, Callable[[Any], str]] = {"names": _names, "noun": _noun, "literal": sql_literal}


class _Filler(string.Formatter):
    def format_field(self, value: Any, format_spec: str) -> str:
        if format_spec in _SPECS:
            return _SPECS[format_spec](value)
        return super().format_field(value, format_spec)


_FILLER = _Filler()

# What a template has drawn so far, by the names its format strings use.
Slots = dict[str, Any]
# One step of a template's draw: more slots from the scope and the slots so far, or None when nothing fits.
Draw = Callable[[Scope, Slots], Slots | None]


@dataclass(frozen=True)
class Template:
    """A question shape as data: what it draws, the ways to ask it, and the SQL that answers it.

    Phrasings and SQL are `str.format` strings over the drawn slots (`{t.plural}`, `{cond.sql}`), plus the
    format specs of `_SPECS`.
    """

    name: str
    weight: float  # relative chance of being drawn
    draws: tuple[Draw, ...]  # run in order, each seeing the slots of those before
    phrasings: tuple[str, ...]
    sql: str
    # A query whose rows must all differ, or the gold's order (or its LIMIT cut) is ambiguous.
    tie_check_sql: str | None = None
    # Read instead of `phrasings` when a draw sets the slot `alternate`: a single row, "or" for "and".
    alternate: tuple[str, ...] = ()
    # Ways to ask that only held-out splits use: training never reads a question in one of them.
    held_out_phrasings: tuple[str, ...] = ()
    # A family only held-out splits draw: training never reads a question of it in any phrasing.
    held_out: bool = False

    @property
    def all_phrasings(self) -> tuple[str, ...]:
        return (*self.phrasings, *self.alternate, *self.held_out_phrasings)


def instantiate(template: Template, scope: Scope) -> Candidate | None:
    """One question of the template with its SQL, or None when the database has nothing that fits."""
    slots: Slots = {}
    for draw in template.draws:
        drawn = draw(scope, slots)
        if drawn is None:
            return None
        slots |= drawn
    phrasings, unseen = template.phrasings, template.held_out
    if slots.get("alternate"):
        phrasings = template.alternate
    elif scope.held_out and template.held_out_phrasings and scope.rng.random() < HELD_OUT_PHRASING_SHARE:
        phrasings, unseen = template.held_out_phrasings, True
    phrasing = choose(scope.rng, phrasings)
    tie_check_sql = template.tie_check_sql and _FILLER.format(template.tie_check_sql, **slots)
    form = QuestionForm.UNSEEN if unseen else QuestionForm.SEEN
    return Candidate(_FILLER.format(phrasing, **slots), _FILLER.format(template.sql, **slots), form, tie_check_sql)


# --- draws ----------------------------------------------------------------------------------------------


def _table(*roles: Role) -> Draw:
    """`t`: a labelled table with a column of each role."""

    def draw(s: Scope, slots: Slots) -> Slots | None:
        t = s.pick_table(*roles)
        return None if t is None else {"t": t}

    return draw


def _any_table(s: Scope, slots: Slots) -> Slots:
    """`t`: any table, labelled or not."""
    return {"t": choose(s.rng, s.domain.tables)}


def _column(slot: str, *roles: Role, of: str = "t") -> Draw:
    """A column of the table in slot `of` with one of the roles."""

    def draw(s: Scope, slots: Slots) -> Slots:
        return {slot: choose(s.rng, [c for role in roles for c in slots[of].by_role(role)])}

    return draw


def _name(of: str = "t") -> Draw:
    """`name`: the label of one row of the table in slot `of`."""

    def draw(s: Scope, slots: Slots) -> Slots:
        table = slots[of]
        return {"name": str(s.value(table, table.label))}

    return draw


def _condition(
    slot: str = "cond", of: str = "t", alias: str = "", exclude: tuple[str, ...] = (), differs_from: str = ""
) -> Draw:
    """A condition on the table in slot `of`, on none of the columns in slots `exclude`."""

    def draw(s: Scope, slots: Slots) -> Slots | None:
        cond = s.condition(slots[of], alias, tuple(slots[e] for e in exclude))
        if cond is None or (differs_from and cond.sql == slots[differs_from].sql):
            return None
        return {slot: cond}

    return draw


def _parent_child(parent_needs: tuple[Role, ...] = (), child_needs: tuple[Role, ...] = ()) -> Draw:
    """`parent`, `child` and the child's foreign `key` into the parent."""

    def draw(s: Scope, slots: Slots) -> Slots | None:
        pair = s.parent_child(parent_needs, child_needs)
        return None if pair is None else dict(zip(("parent", "child", "key"), pair, strict=True))

    return draw


def _labelled(of: str) -> Draw:
    """Nothing new: rejects a table without a label, as templates that name its rows need one."""

    def draw(s: Scope, slots: Slots) -> Slots | None:
        return None if slots[of].label is None else {}

    return draw


def _coin(chance: float, **sides: tuple[object, object]) -> Draw:
    """One draw for all the slots: each takes its first value with the chance, its second otherwise."""

    def draw(s: Scope, slots: Slots) -> Slots:
        side = 0 if s.rng.random() < chance else 1
        return {slot: values[side] for slot, values in sides.items()}

    return draw


def _one_of(**options: tuple[object, ...]) -> Draw:
    """One draw for all the slots: each takes the value at the same drawn position."""

    def draw(s: Scope, slots: Slots) -> Slots:
        return dict(zip(options, choose(s.rng, list(zip(*options.values(), strict=True))), strict=True))

    return draw


def _limit(*ks: int) -> Draw:
    """`k` rows to keep; one row reads differently, so it sets `alternate`."""

    def draw(s: Scope, slots: Slots) -> Slots:
        k = choose(s.rng, ks)
        return {"k": k, "tie_limit": k + 1, "alternate": k == 1}

    return draw


AGGREGATES = {
    "AVG": ("average", "mean"),
    "MAX": ("maximum", "highest", "largest"),
    "MIN": ("minimum", "lowest", "smallest"),
    "SUM": ("total",),
}


def _aggregate(s: Scope, slots: Slots) -> Slots:
    """`fn`: an aggregate function that makes sense for the number column `n`, and a `word` for it."""
    functions = [f for f in AGGREGATES if f != "SUM" or slots["n"].additive]
    fn = choose(s.rng, functions)
    return {"fn": fn, "word": choose(s.rng, AGGREGATES[fn])}


def _ranking(s: Scope, slots: Slots) -> Slots:
    """Highest or lowest first by `n`: the superlative, the SQL direction, and a filter on missing values."""
    highest = s.rng.random() < 0.6
    n = slots["n"]
    return {
        "most": choose(s.rng, ("highest", "largest") if highest else ("lowest", "smallest")),
        "order_note": "" if highest else ", starting from the lowest",
        "direction": "DESC" if highest else "ASC",
        "not_null": f"WHERE {n.name} IS NOT NULL " if n.null_fraction else "",
    }


def _range(s: Scope, slots: Slots) -> Slots | None:
    """`low` and `high`: two thresholds of `n`, rejected when they coincide."""
    t, n = slots["t"], slots["n"]
    low, high = sorted((s.threshold(t, n), s.threshold(t, n)))
    return None if low == high else {"low": low, "high": high}


def _child_count(s: Scope, slots: Slots) -> Slots:
    """`k`: a number of children that only the busier parents exceed."""
    child, key = slots["child"], slots["key"]
    counts = [
        r[0] for r in s.con.execute(f"SELECT COUNT(*) FROM {child.name} GROUP BY {key.name} ORDER BY 1").fetchall()
    ]
    return {"k": nice_number(counts[int(len(counts) * s.rng.uniform(0.4, 0.9))], 0)}


def _group_average(s: Scope, slots: Slots) -> Slots | None:
    """`threshold`: an average of `n` that some groups of `c` exceed and others do not."""
    t, c, n = slots["t"], slots["c"], slots["n"]
    averages = sorted(
        r[0]
        for r in s.con.execute(
            f"SELECT AVG({n.name}) FROM {t.name} GROUP BY {c.name} HAVING AVG({n.name}) IS NOT NULL"
        ).fetchall()
    )
    if len(averages) < 2:
        return None
    return {"threshold": nice_number(averages[int(len(averages) * s.rng.uniform(0.2, 0.7))], n.decimals)}


def _bridge(s: Scope, slots: Slots) -> Slots | None:
    """A -< B >- C: tables `a` and `c` linked through `b`, by its keys `key_a` and `key_c`."""
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
    return dict(zip(("a", "b", "key_a", "c", "key_c"), choose(s.rng, triples), strict=True))


def _parent_child_preferring_categories(s: Scope, slots: Slots) -> Slots | None:
    """Like `_parent_child()`, but a parent with a category column when there is one."""
    pair = s.parent_child(parent_needs=(Role.CATEGORY,)) or s.parent_child()
    return None if pair is None else dict(zip(("parent", "child", "key"), pair, strict=True))


def _group_size(s: Scope, slots: Slots) -> Slots | None:
    """`k`: a number of rows that only the larger groups of `c` exceed."""
    t, c = slots["t"], slots["c"]
    counts = [
        r[0]
        for r in s.con.execute(
            f"SELECT COUNT(*) FROM {t.name} WHERE {c.name} IS NOT NULL GROUP BY {c.name} ORDER BY 1"
        ).fetchall()
    ]
    if len(counts) < 2:
        return None
    return {"k": nice_number(counts[int(len(counts) * s.rng.uniform(0.3, 0.8))], 0)}


def _additive_number(of: str) -> Draw:
    """`n`: a number column of the table in slot `of` whose total means something."""

    def draw(s: Scope, slots: Slots) -> Slots | None:
        columns = [c for c in slots[of].by_role(Role.NUMBER) if c.additive]
        return {"n": choose(s.rng, columns)} if columns else None

    return draw


# --- templates ------------------------------------------------------------------------------------------

# Weights tilt the draw toward the templates that have many distinct instances.
TEMPLATES: tuple[Template, ...] = (
    # easy
    Template(
        "list_where",
        3,
        (_table(), _condition()),
        (
            "List the {t:names} of {t.plural} {cond.rel}.",
            "Which {t.plural} {cond.verb}?",
            "Show the {t.label.phrase} of every {t.singular} {cond.rel}.",
            "I need the {t:names} of all {t.plural} {cond.rel}.",
            "Find the {t.plural} {cond.rel} and give their {t:names}.",
            "What are the {t:names} of the {t.plural} {cond.rel}?",
        ),
        "SELECT {t.label.name} FROM {t.name} WHERE {cond.sql}",
        held_out_phrasings=(
            "Could you pull up the {t:names} for {t.plural} {cond.rel}?",
            "Names only, please: {t.plural} {cond.rel}.",
        ),
    ),
    Template(
        "count_where",
        2.5,
        (_table(), _condition()),
        (
            "How many {t.plural} {cond.verb}?",
            "Count the {t.plural} {cond.rel}.",
            "What is the number of {t.plural} {cond.rel}?",
            "How many {t.plural} {cond.rel} are there?",
            "Tell me how many {t.plural} {cond.verb}.",
        ),
        "SELECT COUNT(*) FROM {t.name} WHERE {cond.sql}",
        held_out_phrasings=(
            "I'd like to know the count of {t.plural} {cond.rel}.",
            "Tally up the {t.plural} {cond.rel}.",
        ),
    ),
    Template(
        "count_all",
        0.3,
        (_any_table,),
        (
            "How many {t.plural} are there?",
            "Count all {t.plural}.",
            "What is the total number of {t.plural}?",
            "How many {t.plural} are recorded?",
        ),
        "SELECT COUNT(*) FROM {t.name}",
        held_out_phrasings=("Altogether, how many {t.plural} does the database hold?",),
    ),
    Template(
        "distinct_values",
        0.5,
        (_table(Role.CATEGORY), _column("c", Role.CATEGORY)),
        (
            "What different {c.phrase} values do {t.plural} have?",
            "List the distinct {c.phrase} values of {t.plural}.",
            "Which {c.phrase} values appear among the {t.plural}?",
            "Show each {c.phrase} that at least one {t.singular} has, without repeats.",
        ),
        "SELECT DISTINCT {c.name} FROM {t.name}",
        held_out_phrasings=("Please enumerate every {c.phrase} occurring among {t.plural}, each only once.",),
    ),
    Template(
        "attribute_of",
        2,
        (_table(Role.NUMBER), _column("c", Role.NUMBER, Role.CATEGORY, Role.DATE), _name()),
        (
            "What is the {c.phrase} of {name}?",
            "Give me the {c.phrase} of the {t.singular} {name}.",
            "Tell me the {c.phrase} for the {t.singular} called {name}.",
            "What {c.phrase} does {name} have?",
        ),
        "SELECT {c.name} FROM {t.name} WHERE {t.label.name} = {name:literal}",
        held_out_phrasings=(
            "Regarding the {t.singular} {name}: what is recorded as the {c.phrase}?",
            "Look up {name} and report the {c.phrase}.",
        ),
    ),
    Template(
        "everything_about",
        0.7,
        (_table(), _name()),
        (
            "Show all information about the {t.singular} {name}.",
            "Give me every column for {name} in the {t.plural} table.",
            "What do we know about the {t.singular} named {name}?",
        ),
        "SELECT * FROM {t.name} WHERE {t.label.name} = {name:literal}",
        held_out_phrasings=("Pull the complete record of the {t.singular} {name}, every field.",),
    ),
    # medium
    Template(
        "group_count",
        0.7,
        (_table(Role.CATEGORY), _column("c", Role.CATEGORY)),
        (
            "How many {t.plural} are there for each {c.phrase}?",
            "Count the {t.plural} in each {c.phrase}.",
            "For every {c.phrase}, how many {t.plural} are there?",
            "Break down the number of {t.plural} by {c.phrase}.",
            "Show each {c.phrase} with the number of {t.plural} that have it.",
        ),
        "SELECT {c.name}, COUNT(*) FROM {t.name} GROUP BY {c.name}",
        held_out_phrasings=(
            "Per {c.phrase}, what is the tally of {t.plural}?",
            "Please tabulate {t.plural} per {c.phrase}, giving a count for each.",
        ),
    ),
    Template(
        "group_aggregate",
        1.5,
        (_table(Role.CATEGORY, Role.NUMBER), _column("c", Role.CATEGORY), _column("n", Role.NUMBER), _aggregate),
        (
            "What is the {word} {n.phrase} of {t.plural} for each {c.phrase}?",
            "Show the {word} {n.phrase} per {c.phrase} across all {t.plural}.",
            "For each {c.phrase}, give the {word} {n.phrase} of its {t.plural}.",
            "List every {c.phrase} together with the {word} {n.phrase} of the {t.plural} in it.",
        ),
        "SELECT {c.name}, {fn}({n.name}) FROM {t.name} GROUP BY {c.name}",
        held_out_phrasings=("Grouped by {c.phrase}: report the {word} {n.phrase} of the {t.plural}.",),
    ),
    Template(
        "aggregate_where",
        2.5,
        (_table(Role.NUMBER), _column("n", Role.NUMBER), _condition(exclude=("n",)), _aggregate),
        (
            "What is the {word} {n.phrase} of {t.plural} {cond.rel}?",
            "Find the {word} {n.phrase} among {t.plural} {cond.rel}.",
            "Among {t.plural} {cond.rel}, what is the {word} {n.phrase}?",
        ),
        "SELECT {fn}({n.name}) FROM {t.name} WHERE {cond.sql}",
        held_out_phrasings=("Considering only {t.plural} {cond.rel}, what comes out as the {word} {n.phrase}?",),
    ),
    Template(
        "top_k",
        2,
        (_table(Role.NUMBER), _column("n", Role.NUMBER), _limit(1, 1, 3, 5, 10), _ranking),
        (
            "Which {k} {t.plural} have the {most} {n.phrase}?",
            "List the {t:names} of the top {k} {t.plural} by {n.phrase}{order_note}.",
            "Give me the {k} {t.plural} with the {most} {n.phrase}.",
        ),
        "SELECT {t.label.name} FROM {t.name} {not_null}ORDER BY {n.name} {direction} LIMIT {k}",
        tie_check_sql="SELECT {n.name} FROM {t.name} {not_null}ORDER BY {n.name} {direction} LIMIT {tie_limit}",
        alternate=(
            "Which {t.singular} has the {most} {n.phrase}?",
            "Name the {t.singular} with the {most} {n.phrase}.",
            "What is the {t.label.phrase} of the {t.singular} whose {n.phrase} is the {most}?",
        ),
        held_out_phrasings=(
            "Rank the {t.plural} by {n.phrase}{order_note} and keep the first {k}: what are their {t:names}?",
        ),
    ),
    Template(
        "ordered_list",
        1.5,
        (
            _table(Role.NUMBER),
            _column("n", Role.NUMBER),
            _condition(exclude=("n",)),
            _coin(
                0.5,
                order_words=("from highest to lowest", "from lowest to highest"),
                sort=("descending", "ascending"),
                direction=("DESC", "ASC"),
            ),
        ),
        (
            "List the {t.plural} {cond.rel} with their {n.phrase}, {order_words}.",
            "Show the {t:names} and {n.phrase} of {t.plural} {cond.rel}, sorted by {n.phrase} {order_words}.",
            "Sort the {t.plural} {cond.rel} by {n.phrase} ({sort}) and show each one's {t.label.phrase} and "
            "{n.phrase}.",
        ),
        "SELECT {t.label.name}, {n.name} FROM {t.name} WHERE {cond.sql} ORDER BY {n.name} {direction}",
        tie_check_sql="SELECT {n.name} FROM {t.name} WHERE {cond.sql}",
        held_out_phrasings=(
            "Please produce each {t.label.phrase} with its {n.phrase} for the {t.plural} {cond.rel}, ordered "
            "{order_words}.",
        ),
    ),
    Template(
        "two_conditions",
        3,
        (
            _table(),
            _condition("first"),
            _condition("second", differs_from="first"),
            _coin(0.65, alternate=(False, True), op=("AND", "OR")),
        ),
        (
            "Which {t.plural} {first.verb} and {second.verb}?",
            "List the {t:names} of {t.plural} that {first.verb} and {second.verb}.",
            "Find {t.plural} {first.rel} and {second.rel}.",
        ),
        "SELECT {t.label.name} FROM {t.name} WHERE {first.sql} {op} {second.sql}",
        alternate=(
            "Which {t.plural} {first.verb} or {second.verb}?",
            "List the {t:names} of {t.plural} that {first.verb} or {second.verb}.",
            "Show {t.plural} that either {first.verb} or {second.verb}.",
        ),
        held_out_phrasings=("Out of all {t.plural}, which ones both {first.verb} and {second.verb}?",),
    ),
    Template(
        "most_common",
        0.6,
        (_table(Role.CATEGORY), _column("c", Role.CATEGORY)),
        (
            "Which {c.phrase} has the most {t.plural}?",
            "What is the most common {c.phrase} among {t.plural}?",
            "Which {c.phrase} appears most often in the {t.plural} table?",
        ),
        "SELECT {c.name} FROM {t.name} GROUP BY {c.name} ORDER BY COUNT(*) DESC LIMIT 1",
        tie_check_sql="SELECT COUNT(*) FROM {t.name} GROUP BY {c.name} ORDER BY COUNT(*) DESC LIMIT 2",
        held_out_phrasings=("Out of all {c.phrase} values, which one turns up most frequently among the {t.plural}?",),
    ),
    Template(
        "count_distinct",
        0.4,
        (_table(Role.CATEGORY), _column("c", Role.CATEGORY)),
        (
            "How many different {c.phrase} values are there among {t.plural}?",
            "Count the distinct {c.phrase} values of {t.plural}.",
            "In how many distinct {c.phrase} values do the {t.plural} fall?",
        ),
        "SELECT COUNT(DISTINCT {c.name}) FROM {t.name}",
        held_out_phrasings=("Please count the separate {c.phrase} values that the {t.plural} cover.",),
    ),
    Template(
        "between",
        1.5,
        (_table(Role.NUMBER), _column("n", Role.NUMBER), _range),
        (
            "Which {t.plural} have a {n.phrase} between {low} and {high}?",
            "List the {t:names} of {t.plural} whose {n.phrase} is from {low} to {high}, inclusive.",
            "Find {t.plural} with {n.phrase} in the range {low} to {high}.",
        ),
        "SELECT {t.label.name} FROM {t.name} WHERE {n.name} BETWEEN {low} AND {high}",
        held_out=True,
    ),
    Template(
        "child_of_named_parent",
        2,
        (_parent_child(), _labelled("child"), _name("parent")),
        (
            "List the {child:names} of all {child.plural} whose {key:noun} is {name}.",
            "Which {child.plural} have {name} as their {key:noun}?",
            "Show the {child.plural} of the {parent.singular} {name}.",
            "Give the {child:names} of {child.plural} linked to the {parent.singular} named {name}.",
        ),
        "SELECT c.{child.label.name} FROM {child.name} AS c JOIN {parent.name} AS p "
        "ON c.{key.name} = p.{parent.primary_key.name} WHERE p.{parent.label.name} = {name:literal}",
        held_out_phrasings=(
            "Regarding the {parent.singular} {name}: which {child.plural} belong to it? Give their {child:names}.",
        ),
    ),
    # hard
    Template(
        "above_average",
        1,
        (
            _table(Role.NUMBER),
            _column("n", Role.NUMBER),
            _coin(0.6, word=("above", "below"), comparative=("higher", "lower"), op=(">", "<")),
        ),
        (
            "Which {t.plural} have a {n.phrase} {word} the average?",
            "List the {t:names} of {t.plural} whose {n.phrase} is {comparative} than the average {n.phrase} of all "
            "{t.plural}.",
            "Find every {t.singular} with a {n.phrase} {word} average.",
        ),
        "SELECT {t.label.name} FROM {t.name} WHERE {n.name} {op} (SELECT AVG({n.name}) FROM {t.name})",
        held_out_phrasings=("Compared with the mean {n.phrase}, which {t.plural} sit {word} it?",),
    ),
    Template(
        "extreme_by_subquery",
        1,
        (_table(Role.NUMBER), _column("n", Role.NUMBER), _one_of(fn=("MAX", "MIN"), word=("highest", "lowest"))),
        (
            "Which {t.singular} has the {word} {n.phrase}? Include ties.",
            "List every {t.singular} whose {n.phrase} equals the {word} {n.phrase} of all {t.plural}.",
            "Who or what has the {word} {n.phrase} among {t.plural}? List all of them if tied.",
        ),
        "SELECT {t.label.name} FROM {t.name} WHERE {n.name} = (SELECT {fn}({n.name}) FROM {t.name})",
        held_out_phrasings=("Please list all {t.plural} tied for the {word} {n.phrase}.",),
    ),
    Template(
        "parents_with_many_children",
        1.2,
        (_parent_child(), _child_count),
        (
            "Which {parent.plural} have more than {k} {child.plural}? Show each one's {parent.label.phrase} and "
            "its number of {child.plural}.",
            "For {parent.plural} with over {k} {child.plural}, list the {parent.label.phrase} and the "
            "{child.singular} count.",
            "Give the {parent:names} of {parent.plural} that have more than {k} {child.plural}, with how many "
            "each has.",
        ),
        "SELECT p.{parent.label.name}, COUNT(*) FROM {parent.name} AS p JOIN {child.name} AS c "
        "ON c.{key.name} = p.{parent.primary_key.name} GROUP BY p.{parent.primary_key.name}, "
        "p.{parent.label.name} HAVING COUNT(*) > {k}",
        held_out_phrasings=(
            "Please report every {parent.singular} counting more than {k} {child.plural}, giving its "
            "{parent.label.phrase} and that count.",
        ),
    ),
    Template(
        "parents_without_children",
        0.5,
        (_parent_child(),),
        (
            "Which {parent.plural} have no {child.plural}?",
            "List the {parent:names} of {parent.plural} that do not appear in any {child.singular}.",
            "Find {parent.plural} without a single {child.singular}.",
            "Show the {parent.plural} never referenced by a {child.singular} as its {key:noun}.",
        ),
        "SELECT {parent.label.name} FROM {parent.name} WHERE {parent.primary_key.name} NOT IN "
        "(SELECT {key.name} FROM {child.name} WHERE {key.name} IS NOT NULL)",
        held_out=True,
    ),
    Template(
        "parents_with_matching_child",
        2,
        (_parent_child(), _condition(of="child")),
        (
            "Which {parent.plural} have at least one {child.singular} {cond.rel}?",
            "List the {parent:names} of {parent.plural} with some {child.singular} {cond.rel}.",
            "Find {parent.plural} that have {child.plural} {cond.rel}.",
        ),
        "SELECT {parent.label.name} FROM {parent.name} WHERE {parent.primary_key.name} IN "
        "(SELECT {key.name} FROM {child.name} WHERE {cond.sql})",
        held_out_phrasings=(
            "Out of all {parent.plural}, which are linked to at least one {child.singular} {cond.rel}?",
        ),
    ),
    Template(
        "aggregate_per_parent",
        1.2,
        (_parent_child(child_needs=(Role.NUMBER,)), _column("n", Role.NUMBER, of="child"), _aggregate),
        (
            "What is the {word} {n.phrase} of {child.plural} for each {parent.singular}? Show the "
            "{parent.singular}'s {parent.label.phrase}.",
            "For every {parent.singular}, list its {parent.label.phrase} and the {word} {n.phrase} of its "
            "{child.plural}.",
            "Show each {parent.singular} {parent.label.phrase} with the {word} {n.phrase} across its {child.plural}.",
        ),
        "SELECT p.{parent.label.name}, {fn}(c.{n.name}) FROM {parent.name} AS p JOIN {child.name} AS c "
        "ON c.{key.name} = p.{parent.primary_key.name} GROUP BY p.{parent.primary_key.name}, p.{parent.label.name}",
        held_out_phrasings=(
            "Per {parent.singular}, report its {parent.label.phrase} and the {word} {n.phrase} over its "
            "{child.plural}.",
        ),
    ),
    Template(
        "groups_with_high_average",
        1.2,
        (_table(Role.CATEGORY, Role.NUMBER), _column("c", Role.CATEGORY), _column("n", Role.NUMBER), _group_average),
        (
            "Which {c.phrase} values have an average {n.phrase} above {threshold} among their {t.plural}?",
            "List each {c.phrase} whose {t.plural} average more than {threshold} in {n.phrase}.",
            "For which {c.phrase} is the mean {n.phrase} of {t.plural} greater than {threshold}?",
        ),
        "SELECT {c.name} FROM {t.name} GROUP BY {c.name} HAVING AVG({n.name}) > {threshold}",
        held_out_phrasings=(
            "Out of all {c.phrase} values, which see their {t.plural} average over {threshold} in {n.phrase}?",
        ),
    ),
    Template(
        "top_children_of_filtered_parents",
        1.5,
        (
            _parent_child(parent_needs=(Role.CATEGORY,), child_needs=(Role.NUMBER,)),
            _labelled("child"),
            _condition(of="parent", alias="p"),
            _column("n", Role.NUMBER, of="child"),
            _limit(1, 3, 5),
        ),
        (
            "Among {child.plural} of {parent.plural} {cond.rel}, which {k} have the highest {n.phrase}?",
            "List the {child:names} of the {k} {child.plural} with the highest {n.phrase} whose {key:noun} is one "
            "of the {parent.plural} {cond.rel}.",
        ),
        "SELECT c.{child.label.name} FROM {child.name} AS c JOIN {parent.name} AS p "
        "ON c.{key.name} = p.{parent.primary_key.name} WHERE {cond.sql} AND c.{n.name} IS NOT NULL "
        "ORDER BY c.{n.name} DESC LIMIT {k}",
        tie_check_sql="SELECT c.{n.name} FROM {child.name} AS c JOIN {parent.name} AS p "
        "ON c.{key.name} = p.{parent.primary_key.name} WHERE {cond.sql} AND c.{n.name} IS NOT NULL "
        "ORDER BY c.{n.name} DESC LIMIT {tie_limit}",
        alternate=(
            "Among {child.plural} of {parent.plural} {cond.rel}, which one has the highest {n.phrase}?",
            "List the {child:names} of the {k} {child.plural} with the highest {n.phrase} whose {key:noun} is one "
            "of the {parent.plural} {cond.rel}.",
        ),
        held_out_phrasings=(
            "Restricting to {parent.plural} {cond.rel}, report the {child:names} of the top {k} {child.plural} by "
            "{n.phrase}.",
        ),
    ),
    # extra
    Template(
        "categories_with_both",
        1.5,
        (
            _table(Role.CATEGORY),
            _column("c", Role.CATEGORY),
            _condition("first", exclude=("c",)),
            _condition("second", exclude=("c",), differs_from="first"),
        ),
        (
            "Which {c.phrase} values have both {t.plural} {first.rel} and {t.plural} {second.rel}?",
            "Find the {c.phrase} values shared by {t.plural} {first.rel} and by {t.plural} {second.rel}.",
        ),
        "SELECT {c.name} FROM {t.name} WHERE {first.sql} INTERSECT SELECT {c.name} FROM {t.name} WHERE {second.sql}",
        held_out=True,
    ),
    Template(
        "either_condition_union",
        1.5,
        (_table(), _condition("first"), _condition("second", differs_from="first")),
        (
            "Give the distinct {t:names} of {t.plural} {first.rel}, together with those of {t.plural} {second.rel}.",
            "Combine the {t.plural} {first.rel} with the {t.plural} {second.rel} and list their {t:names} "
            "without duplicates.",
        ),
        "SELECT {t.label.name} FROM {t.name} WHERE {first.sql} UNION SELECT {t.label.name} FROM {t.name} "
        "WHERE {second.sql}",
        held_out_phrasings=(
            "Please merge the {t:names} of {t.plural} {first.rel} with those of {t.plural} {second.rel}, each once.",
        ),
    ),
    Template(
        "parents_except_matching_child",
        1.5,
        (_parent_child(), _condition(of="child", alias="c")),
        (
            "Which {parent.plural} never had a {child.singular} {cond.rel}?",
            "List the {parent:names} of {parent.plural} except those with a {child.singular} {cond.rel}.",
            "Find the {parent.plural} that have no {child.plural} {cond.rel}.",
        ),
        "SELECT {parent.label.name} FROM {parent.name} EXCEPT SELECT p.{parent.label.name} FROM {parent.name} AS p "
        "JOIN {child.name} AS c ON c.{key.name} = p.{parent.primary_key.name} WHERE {cond.sql}",
        held_out_phrasings=("Out of all {parent.plural}, which have never had any {child.singular} {cond.rel}?",),
    ),
    Template(
        "through_bridge",
        2.5,
        (_bridge, _condition(of="c", alias="z")),
        (
            "Find the {a:names} of {a.plural} with at least one {b.singular} involving a {c.singular} {cond.rel}.",
            "Which {a.plural} have {b.plural} involving {c.plural} {cond.rel}?",
            "List the distinct {a.plural} connected through {b.plural} to {c.plural} {cond.rel}.",
        ),
        "SELECT DISTINCT x.{a.label.name} FROM {a.name} AS x JOIN {b.name} AS y ON y.{key_a.name} = "
        "x.{a.primary_key.name} JOIN {c.name} AS z ON y.{key_c.name} = z.{c.primary_key.name} WHERE {cond.sql}",
        held_out_phrasings=(
            "Please find the {a.plural} reaching a {c.singular} {cond.rel} by way of their {b.plural}.",
        ),
    ),
    Template(
        "busier_than_average",
        0.6,
        (_parent_child(),),
        (
            "Which {parent.plural} have more {child.plural} than the average {parent.singular} with any "
            "{child.plural}?",
            "List the {parent:names} of {parent.plural} whose number of {child.plural} is above the average "
            "count per {parent.singular} (counting only {parent.plural} that have some).",
        ),
        "SELECT p.{parent.label.name} FROM {parent.name} AS p JOIN {child.name} AS c ON c.{key.name} = "
        "p.{parent.primary_key.name} GROUP BY p.{parent.primary_key.name}, p.{parent.label.name} "
        "HAVING COUNT(*) > (SELECT COUNT(*) * 1.0 / COUNT(DISTINCT {key.name}) FROM {child.name})",
        held_out_phrasings=(
            "Out of the {parent.plural} with any {child.plural}, which have an above-average number of them?",
        ),
    ),
    Template(
        "parent_with_most_children",
        0.8,
        (_parent_child_preferring_categories,),
        (
            "Which {parent.singular} has the most {child.plural}?",
            "Name the {parent.singular} with the largest number of {child.plural}.",
            "What is the {parent.label.phrase} of the {parent.singular} that has the most {child.plural}?",
        ),
        "SELECT p.{parent.label.name} FROM {parent.name} AS p JOIN {child.name} AS c "
        "ON c.{key.name} = p.{parent.primary_key.name} GROUP BY p.{parent.primary_key.name}, p.{parent.label.name} "
        "ORDER BY COUNT(*) DESC LIMIT 1",
        tie_check_sql="SELECT COUNT(*) FROM {parent.name} AS p JOIN {child.name} AS c "
        "ON c.{key.name} = p.{parent.primary_key.name} GROUP BY p.{parent.primary_key.name}, p.{parent.label.name} "
        "ORDER BY COUNT(*) DESC LIMIT 2",
        held_out_phrasings=("Out of all {parent.plural}, which one counts the most {child.plural}?",),
    ),
    # Families only the held-out splits ask (beside between, parents_without_children and categories_with_both):
    # SQL shapes and wordings training never shows.
    Template(
        "date_extreme",
        1,
        (_table(Role.DATE), _column("d", Role.DATE), _one_of(fn=("MIN", "MAX"), word=("earliest", "latest"))),
        (
            "What is the {word} {d.phrase} among the {t.plural}?",
            "Find the {word} {d.phrase} of any {t.singular}.",
            "When is the {word} {d.phrase} on record for {t.plural}?",
        ),
        "SELECT {fn}({d.name}) FROM {t.name}",
        held_out=True,
    ),
    Template(
        "value_span",
        1,
        (_table(Role.NUMBER), _column("n", Role.NUMBER)),
        (
            "What are the smallest and the largest {n.phrase} among {t.plural}?",
            "Give the minimum and the maximum {n.phrase} of all {t.plural}.",
            "What range does the {n.phrase} of {t.plural} span, from its lowest to its highest?",
        ),
        "SELECT MIN({n.name}), MAX({n.name}) FROM {t.name}",
        held_out=True,
    ),
    Template(
        "count_per_year",
        1,
        (_table(Role.DATE), _column("d", Role.DATE)),
        (
            "How many {t.plural} are there for each year of {d.phrase}?",
            "Count the {t.plural} by the year of their {d.phrase}.",
            "Year by year, how many {t.plural} have their {d.phrase} in that year?",
        ),
        "SELECT year({d.name}), COUNT(*) FROM {t.name} GROUP BY year({d.name})",
        held_out=True,
    ),
    Template(
        "children_of_named_parent_count",
        1.5,
        (_parent_child(), _name("parent")),
        (
            "For the {key:noun} {name}, how many {child.plural} are on record?",
            "{name} is the {key:noun} of how many {child.plural}?",
            "Give the count of {child.plural} tied to the {parent.singular} {name} as their {key:noun}.",
        ),
        "SELECT COUNT(*) FROM {child.name} AS c JOIN {parent.name} AS p ON c.{key.name} = "
        "p.{parent.primary_key.name} WHERE p.{parent.label.name} = {name:literal}",
        held_out=True,
    ),
    Template(
        "categories_with_many",
        1.2,
        (_table(Role.CATEGORY), _column("c", Role.CATEGORY), _group_size),
        (
            "Which {c.phrase} values have more than {k} {t.plural}?",
            "List each {c.phrase} shared by over {k} {t.plural}.",
            "For which {c.phrase} are there more than {k} {t.plural}?",
        ),
        "SELECT {c.name} FROM {t.name} GROUP BY {c.name} HAVING COUNT(*) > {k}",
        held_out=True,
    ),
    Template(
        "parents_by_children_total",
        1.2,
        (
            _parent_child(child_needs=(Role.NUMBER,)),
            _additive_number("child"),
            _limit(1, 3, 5),
        ),
        (
            "Which {k} {parent.plural} have the highest total {n.phrase} across their {child.plural}?",
            "List the {parent:names} of the {k} {parent.plural} whose {child.plural} add up to the most {n.phrase}.",
        ),
        "SELECT p.{parent.label.name} FROM {parent.name} AS p JOIN {child.name} AS c "
        "ON c.{key.name} = p.{parent.primary_key.name} GROUP BY p.{parent.primary_key.name}, p.{parent.label.name} "
        "HAVING SUM(c.{n.name}) IS NOT NULL ORDER BY SUM(c.{n.name}) DESC LIMIT {k}",
        tie_check_sql="SELECT SUM(c.{n.name}) FROM {parent.name} AS p JOIN {child.name} AS c "
        "ON c.{key.name} = p.{parent.primary_key.name} GROUP BY p.{parent.primary_key.name}, p.{parent.label.name} "
        "HAVING SUM(c.{n.name}) IS NOT NULL ORDER BY SUM(c.{n.name}) DESC LIMIT {tie_limit}",
        alternate=(
            "Which {parent.singular} has the highest total {n.phrase} across its {child.plural}?",
            "Name the {parent.singular} whose {child.plural} add up to the most {n.phrase}.",
        ),
        held_out=True,
    ),
)


SEEN_TEMPLATES = tuple(t for t in TEMPLATES if not t.held_out)


def held_out_patterns() -> list[re.Pattern[str]]:
    """Every way of asking that training must never read, as a pattern a question in it matches whole: each phrasing
    of a held-out family, and each held-out phrasing of the other families (a slot matches any text)."""
    phrasings = [p for t in TEMPLATES for p in (t.all_phrasings if t.held_out else t.held_out_phrasings)]
    return [
        re.compile("".join(re.escape(text) + (".+" if slot is not None else "") for text, slot, _, _ in fields))
        for fields in (list(string.Formatter().parse(p)) for p in phrasings)
    ]


def draw_candidate(scope: Scope) -> Candidate | None:
    """A question of a template drawn by weight: of any family for a held-out split, of a seen one for training."""
    templates = TEMPLATES if scope.held_out else SEEN_TEMPLATES
    template = scope.rng.choices(templates, [t.weight for t in templates])[0]
    return instantiate(template, scope)
