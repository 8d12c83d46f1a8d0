"""A grammar of SQL over one synthesized database, sampled at random with literals taken from the data.

Productions (`PRODUCTIONS`) build the query's skeleton; shared pieces fill it: a FROM clause that walks foreign keys
in either direction, predicates on any column of the tables joined (categories, numbers, dates, labels, NULLs,
date arithmetic), aggregates and group keys (a category, a parent's label, a year, a CASE bucket). Thresholds are
quantiles of the expression over the same FROM clause, so a filter keeps part of the rows rather than all or none.
Whether a sampled query is worth keeping is decided afterwards, by executing it (checks.py).
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

import duckdb

from tasks.text2sql.sources.domains.schema import Column, Role, Table
from tasks.text2sql.sources.synthesis.schemas import SynthDatabase


@dataclass(frozen=True)
class Ref:
    """A table as a query names it: bare when it is the only one, by alias otherwise."""

    table: Table
    alias: str = ""

    def __call__(self, column: Column) -> str:
        return f"{self.alias}.{column.name}" if self.alias else column.name

    @property
    def source(self) -> str:
        return f"{self.table.name} AS {self.alias}" if self.alias else self.table.name

    @property
    def key(self) -> str:
        return self(self.table.primary_key)


@dataclass(frozen=True)
class Edge:
    """A foreign key: `column` of `child` holds the key of a `parent` row."""

    child: Table
    column: Column
    parent: Table


@dataclass(frozen=True)
class GroupKey:
    """A GROUP BY: what the SELECT shows, what GROUP BY lists (expressions, never aliases: a table may have a column
    named like the alias), and the columns it reads (a condition on those would be constant within each group)."""

    shown: str
    grouped_by: str
    reads: tuple[str, ...]


@dataclass
class Scope:
    """A FROM clause under construction: the tables joined so far, and whether a join multiplied the base's rows.

    The grain is the table of which each joined row is one row: joins to parents keep it, a join to a child of the
    grain moves it there. Sums and averages are taken over the grain's columns only (a parent's value repeats once
    per child and would be counted that many times), and no join fans out from another table than the grain.
    """

    refs: list[Ref]
    joins: list[str]
    fans_out: bool = False
    grain: Ref | None = None

    def __post_init__(self) -> None:
        self.grain = self.grain or self.refs[0]

    @property
    def base(self) -> Ref:
        return self.refs[0]

    @property
    def sql(self) -> str:
        return " ".join([self.base.source, *self.joins])


def literal(value: object) -> str:
    """A SQL literal of a value as DuckDB returns it."""
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, dt.date):
        return f"DATE '{value.isoformat()}'"
    if isinstance(value, Decimal | float):
        text = f"{value:f}"
        return text.rstrip("0").rstrip(".") if "." in text else text
    return str(value)


class QuerySampler:
    """Samples SQL over one database; every call to `sample` is one draw from the grammar (None when a production
    does not fit the tables it drew)."""

    def __init__(self, database: SynthDatabase, connection: duckdb.DuckDBPyConnection, rng: random.Random) -> None:
        self.database = database
        self.con = connection
        self.rng = rng
        self.tables = database.schema.tables
        self.edges = [
            Edge(t, c, database.schema.table(c.references)) for t in self.tables for c in t.by_role(Role.FOREIGN_KEY)
        ]

    # ----- the productions -------------------------------------------------------------------------------------

    def sample(self) -> str | None:
        names = list(PRODUCTIONS)
        production = self.rng.choices(names, weights=[PRODUCTIONS[n][1] for n in names])[0]
        return PRODUCTIONS[production][0](self)

    def lookup(self) -> str | None:
        """Facts about one named row: "what is the weight of the pet called Bella?"."""
        tables = [t for t in self.tables if t.label is not None]
        if not tables:
            return None
        table = self.rng.choice(tables)
        ref = Ref(table)
        shown = [c for c in table.columns if c.role in (Role.CATEGORY, Role.NUMBER, Role.DATE, Role.FLAG)]
        shown = [c for c in shown if not c.references]
        if not shown:
            return None
        columns = self.rng.sample(shown, min(len(shown), self.rng.choice([1, 1, 2])))
        name = self._value(f"SELECT {table.label.name} AS v FROM {table.name}", "v", self.rng.random())
        if name is None:
            return None
        return (
            f"SELECT {', '.join(ref(c) for c in columns)} FROM {table.name} WHERE {ref(table.label)} = {literal(name)}"
        )

    def listing(self) -> str | None:
        """Rows of a table that pass one or two filters, possibly on joined tables."""
        scope = self._scope(self.rng.choice([0, 0, 1, 1, 2, 3]))
        projection = self._projection(scope.base)
        if scope.fans_out and self.rng.random() < 0.5:
            projection.append(self._plain(scope.refs[-1]))
        conditions = self._conditions(scope, self.rng.choice([1, 1, 2]))
        if not conditions:
            return None
        distinct = "DISTINCT " if scope.fans_out else ""
        return f"SELECT {distinct}{', '.join(p for p in projection if p)} FROM {scope.sql} WHERE {conditions}"

    def aggregate(self) -> str | None:
        """One aggregate over the rows that pass zero to two filters."""
        scope = self._scope(self.rng.choice([0, 1, 1, 2]))
        measure = self._aggregate(scope)
        conditions = self._conditions(scope, self.rng.choice([0, 1, 1, 2]))
        return f"SELECT {measure} FROM {scope.sql}" + (f" WHERE {conditions}" if conditions else "")

    def grouped(self) -> str | None:
        """An aggregate per group, optionally filtered before (WHERE) and after (HAVING), or the top groups."""
        scope = self._scope(self.rng.choice([0, 1, 1, 2]))
        key = self._group_key(scope)
        if key is None:
            return None
        shown, grouped_by = key.shown, key.grouped_by
        measure = self._aggregate(scope)
        where = self._conditions(scope, self.rng.choice([0, 0, 1]))
        sql = f"SELECT {shown}, {measure} FROM {scope.sql}" + (f" WHERE {where}" if where else "")
        sql += f" GROUP BY {grouped_by}"
        ending = self.rng.choice(["", "having", "top", "having_top"])
        if "having" in ending:
            threshold = self._quantile_of_groups(scope, where, grouped_by, measure)
            if threshold is None:
                return None
            sql += f" HAVING {measure} {'>' if self.rng.random() < 0.7 else '<'} {literal(threshold)}"
        if "top" in ending:
            sql += f" ORDER BY {measure} {self.rng.choice(['DESC', 'DESC', 'ASC'])} LIMIT {self.rng.randint(1, 5)}"
        return sql

    def top(self) -> str | None:
        """The rows with the largest or smallest value of a column or of date arithmetic."""
        scope = self._scope(self.rng.choice([0, 0, 1, 2]))
        candidates = [(ref, c) for ref in scope.refs for c in ref.table.columns if c.role in (Role.NUMBER, Role.DATE)]
        candidates = [(ref, c) for ref, c in candidates if not c.references]
        if not candidates:
            return None
        ref, column = self.rng.choice(candidates)
        order = ref(column)
        projection = self._projection(scope.base)
        dates = self._date_pair(scope)
        if dates is not None and self.rng.random() < 0.3:
            order = f"date_diff('day', {dates[0]}, {dates[1]})"
            projection.append(f"{order} AS days")
        elif order not in projection and (scope.fans_out or self.rng.random() < 0.6):
            # DISTINCT needs the ORDER BY column among those selected.
            projection.append(order)
        conditions = self._conditions(scope, self.rng.choice([0, 1, 1]))
        distinct = "DISTINCT " if scope.fans_out else ""
        direction = self.rng.choice(["DESC", "ASC"])
        where = f" WHERE {conditions}" if conditions else ""
        return (
            f"SELECT {distinct}{', '.join(projection)} FROM {scope.sql}{where} "
            f"ORDER BY {order} {direction} LIMIT {self.rng.randint(1, 5)}"
        )

    def nested(self) -> str | None:
        """Rows of a parent chosen through a subquery: [NOT] IN, [NOT] EXISTS, a scalar or a grouped subquery."""
        edges = [e for e in self.edges if e.parent.label is not None]
        form = self.rng.choice(["in", "not_in", "exists", "not_exists", "scalar", "in_having", "in_nested"])
        if form == "scalar":
            return self._scalar_subquery()
        if not edges:
            return None
        edge = self.rng.choice(edges)
        if form in ("exists", "not_exists"):
            outer, inner = Ref(edge.parent, "T1"), Ref(edge.child, "T2")
        else:
            outer, inner = Ref(edge.parent), Ref(edge.child)
        inner_scope = Scope([inner], [])
        inner_condition = self._conditions(inner_scope, 0 if form == "not_in" and self.rng.random() < 0.5 else 1)
        if form == "in_having":
            counts = self._value(
                f"SELECT COUNT(*) AS n FROM {edge.child.name} GROUP BY {edge.column.name}", "n", self.rng.random()
            )
            if counts is None:
                return None
            subquery = (
                f"SELECT {edge.column.name} FROM {edge.child.name} "
                f"GROUP BY {edge.column.name} HAVING COUNT(*) > {literal(counts)}"
            )
            predicate = f"{outer.key} IN ({subquery})"
        elif form == "in_nested":
            second = [e for e in self.edges if e.child is edge.child and e.parent is not edge.parent]
            if not second:
                return None
            other = self.rng.choice(second)
            condition = self._conditions(Scope([Ref(other.parent)], []), 1)
            if not condition:
                return None
            innermost = f"SELECT {other.parent.primary_key.name} FROM {other.parent.name} WHERE {condition}"
            predicate = (
                f"{outer.key} IN (SELECT {edge.column.name} FROM {edge.child.name} "
                f"WHERE {other.column.name} IN ({innermost}))"
            )
        elif form in ("in", "not_in"):
            if form == "in" and not inner_condition:
                return None
            where = [f"{inner(edge.column)} IS NOT NULL"] if edge.column.null_fraction else []
            where += [inner_condition] if inner_condition else []
            subquery = f"SELECT {inner(edge.column)} FROM {inner.source}" + (
                f" WHERE {' AND '.join(where)}" if where else ""
            )
            predicate = f"{outer.key} {'NOT IN' if form == 'not_in' else 'IN'} ({subquery})"
        else:
            link = f"{inner(edge.column)} = {outer.key}"
            body = f"SELECT 1 FROM {inner.source} WHERE {link}" + (f" AND {inner_condition}" if inner_condition else "")
            predicate = f"{'NOT EXISTS' if form == 'not_exists' else 'EXISTS'} ({body})"
        extra = self._conditions(Scope([outer], []), self.rng.choice([0, 0, 1]))
        where = predicate + (f" AND {extra}" if extra else "")
        return f"SELECT {', '.join(self._projection(outer))} FROM {outer.source} WHERE {where}"

    def set_operation(self) -> str | None:
        """The same column of one table through two filters, combined by UNION, INTERSECT or EXCEPT."""
        tables = [t for t in self.tables if t.label is not None]
        if not tables:
            return None
        target = self.rng.choice(tables)
        sides = []
        for _ in range(2):
            scope = self._scope_from(target, self.rng.choice([0, 1]))
            condition = self._conditions(scope, 1)
            if not condition:
                return None
            sides.append(f"SELECT {scope.base(target.label)} FROM {scope.sql} WHERE {condition}")
        if sides[0] == sides[1]:
            return None
        return f" {self.rng.choice(['UNION', 'INTERSECT', 'EXCEPT'])} ".join(sides)

    def self_join(self) -> str | None:
        """A table joined with itself: through a self-reference (a manager), or rows sharing a value."""
        referencing = [
            (t, c) for t in self.tables for c in t.columns if c.references == t.name and c.role is Role.NUMBER
        ]
        if referencing and self.rng.random() < 0.6:
            table, column = self.rng.choice(referencing)
            low, high = Ref(table, "T1"), Ref(table, "T2")
            join = f"{table.name} AS T1 JOIN {table.name} AS T2 ON {low(column)} = {high.key}"
            label = table.label
            if label is None:
                return None
            form = self.rng.choice(["pairs", "compare", "count"])
            if form == "count":
                limit = self.rng.randint(1, 5)
                return (
                    f"SELECT {high(label)}, COUNT(*) FROM {join} GROUP BY {high.key}, {high(label)} "
                    f"ORDER BY COUNT(*) DESC LIMIT {limit}"
                )
            if form == "compare":
                numbers = [c for c in table.by_role(Role.NUMBER) if not c.references]
                choices = numbers + list(table.by_role(Role.DATE))
                if not choices:
                    return None
                other = self.rng.choice(choices)
                return f"SELECT {low(label)} FROM {join} WHERE {low(other)} {self.rng.choice(['>', '<'])} {high(other)}"
            condition = self._conditions(Scope([high], []), 1)
            if not condition:
                return None
            return f"SELECT {low(label)}, {high(label)} FROM {join} WHERE {condition}"
        tables = [t for t in self.tables if t.label is not None and t.by_role(Role.CATEGORY)]
        if not tables:
            return None
        table = self.rng.choice(tables)
        shared = self.rng.choice(table.by_role(Role.CATEGORY))
        one, other = Ref(table, "T1"), Ref(table, "T2")
        anchor = self._value(f"SELECT {table.label.name} AS v FROM {table.name}", "v", self.rng.random())
        if anchor is None:
            return None
        sql = (
            f"SELECT DISTINCT {other(table.label)} FROM {table.name} AS T1 JOIN {table.name} AS T2 "
            f"ON {one(shared)} = {other(shared)} AND {one.key} <> {other.key} "
            f"WHERE {one(table.label)} = {literal(anchor)}"
        )
        extra = self._conditions(Scope([other], []), self.rng.choice([0, 1]))
        return sql + (f" AND {extra}" if extra else "")

    def case_expression(self) -> str | None:
        """CASE: a count per group of the rows meeting a condition, or rows counted in two buckets of a number."""
        scope = self._scope(self.rng.choice([0, 1]))
        if self.rng.random() < 0.5:
            key = self._group_key(scope, allow_case=False)
            condition = self._condition(scope)
            if key is None or condition is None or any(column in condition for column in key.reads):
                return None  # a condition on what is constant within a group counts all of it or none
            return (
                f"SELECT {key.shown}, SUM(CASE WHEN {condition} THEN 1 ELSE 0 END) FROM {scope.sql} "
                f"GROUP BY {key.grouped_by}"
            )
        bucket = self._bucket(scope)
        if bucket is None:
            return None
        where = self._conditions(scope, self.rng.choice([0, 1]))
        return (
            f"SELECT {bucket[0]} AS band, COUNT(*) FROM {scope.sql}"
            + (f" WHERE {where}" if where else "")
            + f" GROUP BY {bucket[0]}"
        )

    def date_arithmetic(self) -> str | None:
        """Dates taken apart and subtracted: counts per year or month, average durations, rows in a window."""
        scope = self._scope(self.rng.choice([0, 1, 1, 2]))
        dated = [(ref, c) for ref in scope.refs for c in ref.table.by_role(Role.DATE)]
        if not dated:
            return None
        ref, column = self.rng.choice(dated)
        form = self.rng.choice(["per_year", "per_month", "duration", "window"])
        where = self._conditions(scope, self.rng.choice([0, 1]))
        where_sql = f" WHERE {where}" if where else ""
        if form == "per_year":
            part = f"EXTRACT(YEAR FROM {ref(column)})"
            return f"SELECT {part} AS year, COUNT(*) FROM {scope.sql}{where_sql} GROUP BY {part} ORDER BY {part}"
        if form == "per_month":
            year = self._value(f"SELECT EXTRACT(YEAR FROM {ref(column)}) AS y FROM {scope.sql}", "y", self.rng.random())
            if year is None:
                return None
            condition = f"EXTRACT(YEAR FROM {ref(column)}) = {year}" + (f" AND {where}" if where else "")
            month = f"EXTRACT(MONTH FROM {ref(column)})"
            return (
                f"SELECT {month} AS month, COUNT(*) FROM {scope.sql} WHERE {condition} "
                f"GROUP BY {month} ORDER BY {month}"
            )
        if form == "duration":
            pair = self._date_pair(scope)
            if pair is None:
                return None
            key = self._group_key(scope, allow_case=False)
            if key is None:
                return None
            return (
                f"SELECT {key.shown}, AVG(date_diff('day', {pair[0]}, {pair[1]})) FROM {scope.sql}{where_sql} "
                f"GROUP BY {key.grouped_by}"
            )
        end = self._value(f"SELECT {ref(column)} AS d FROM {scope.sql}", "d", self.rng.uniform(0.3, 1.0))
        if end is None:
            return None
        days = self.rng.choice([7, 14, 30, 60, 90, 180, 365])
        measure = self._aggregate(scope)
        window = f"{ref(column)} BETWEEN {literal(end)} - INTERVAL {days} DAY AND {literal(end)}"
        return f"SELECT {measure} FROM {scope.sql} WHERE {window}" + (f" AND {where}" if where else "")

    # ----- shared pieces -------------------------------------------------------------------------------------------

    def _scope(self, hops: int) -> Scope:
        return self._scope_from(self.rng.choice(self.tables), hops)

    def _scope_from(self, base: Table, hops: int) -> Scope:
        """A FROM clause from `base`, joined along `hops` foreign keys in either direction (each table once)."""
        if hops == 0 or not self.edges:
            return Scope([Ref(base)], [])
        scope = Scope([Ref(base, "T1")], [])
        for _ in range(hops):
            joined = {ref.table.name for ref in scope.refs}
            steps = [
                (ref, edge, edge.parent if ref.table is edge.child else edge.child)
                for ref in scope.refs
                for edge in self.edges
                if (ref.table is edge.child and edge.parent.name not in joined)
                or (ref is scope.grain and ref.table is edge.parent and edge.child.name not in joined)
            ]
            if not steps:
                break
            ref, edge, table = self.rng.choice(steps)
            new = Ref(table, f"T{len(scope.refs) + 1}")
            child, parent = (ref, new) if ref.table is edge.child else (new, ref)
            scope.refs.append(new)
            scope.joins.append(f"JOIN {new.source} ON {child(edge.column)} = {parent.key}")
            if table is edge.child:
                scope.fans_out = True
                scope.grain = new
        if len(scope.refs) == 1:
            return Scope([Ref(base)], [])
        return scope

    def _projection(self, ref: Ref) -> list[str]:
        """What a listing shows of a table: its label (or another column), sometimes one more column."""
        label = ref.table.label
        columns = [c for c in ref.table.columns if c.role in (Role.CATEGORY, Role.NUMBER, Role.DATE, Role.LABEL)]
        columns = [c for c in columns if not c.references and c is not label]
        first = label if label is not None else (self.rng.choice(columns) if columns else ref.table.primary_key)
        shown = [ref(first)]
        if columns and self.rng.random() < 0.35:
            extra = ref(self.rng.choice(columns))
            if extra not in shown:
                shown.append(extra)
        return shown

    def _plain(self, ref: Ref) -> str:
        label = ref.table.label
        return ref(label) if label is not None else ref(ref.table.primary_key)

    def _conditions(self, scope: Scope, count: int) -> str:
        """Up to `count` predicates joined by AND (sometimes OR); empty when none could be formed."""
        predicates: list[str] = []
        for _ in range(count):
            predicate = self._condition(scope)
            if predicate is not None and predicate not in predicates:
                predicates.append(predicate)
        if len(predicates) == 2 and self.rng.random() < 0.25:
            return f"({predicates[0]} OR {predicates[1]})"
        return " AND ".join(predicates)

    def _condition(self, scope: Scope) -> str | None:
        """One predicate on a column of a table in scope, its literal drawn from the data."""
        ref = self.rng.choice(scope.refs)
        columns = [c for c in ref.table.columns if c.role not in (Role.ID, Role.FOREIGN_KEY) and not c.references]
        if not columns:
            return None
        column = self.rng.choice(columns)
        target = ref(column)
        nullable = column.null_fraction > 0
        if nullable and self.rng.random() < 0.2:
            return f"{target} IS {self.rng.choice(['NULL', 'NOT NULL'])}"
        q = self.rng.uniform(0.15, 0.85)
        if column.role is Role.FLAG:
            return f"{target} = {self.rng.choice(['TRUE', 'FALSE'])}"
        if column.role is Role.CATEGORY:
            values = self._distinct(ref.table, column)
            if len(values) < 2:
                return None
            form = self.rng.random()
            if form < 0.6:
                return f"{target} = {literal(self.rng.choice(values))}"
            if form < 0.8:
                return f"{target} <> {literal(self.rng.choice(values))}"
            chosen = sorted(self.rng.sample(values, 2))
            return f"{target} IN ({', '.join(map(literal, chosen))})"
        if column.role is Role.LABEL:
            value = self._value(f"SELECT {column.name} AS v FROM {ref.table.name}", "v", self.rng.random())
            if value is None:
                return None
            words = [w for w in value.replace("-", " ").split() if len(w) >= 4 and w.isalpha()]
            if words and self.rng.random() < 0.4:
                return f"{target} LIKE {literal('%' + self.rng.choice(words) + '%')}"
            return f"{target} = {literal(value)}"
        if column.role is Role.NUMBER:
            value = self._value(f"SELECT {target} AS v FROM {scope.sql}", "v", q)
            if value is None:
                return None
            form = self.rng.random()
            if form < 0.8:
                return f"{target} {self.rng.choice(['>', '<', '>=', '<='])} {literal(value)}"
            upper = self._value(f"SELECT {target} AS v FROM {scope.sql}", "v", min(0.95, q + 0.3))
            if upper is None or upper <= value:
                return None
            return f"{target} BETWEEN {literal(value)} AND {literal(upper)}"
        return self._date_condition(scope, ref, column, q)

    def _date_condition(self, scope: Scope, ref: Ref, column: Column, q: float) -> str | None:
        target = ref(column)
        form = self.rng.random()
        if form < 0.3:
            year = self._value(f"SELECT EXTRACT(YEAR FROM {target}) AS y FROM {scope.sql}", "y", q)
            return None if year is None else f"EXTRACT(YEAR FROM {target}) = {year}"
        if form < 0.45:
            pair = self._date_pair(scope)
            if pair is not None:
                days = self._value(f"SELECT date_diff('day', {pair[0]}, {pair[1]}) AS d FROM {scope.sql}", "d", q)
                if days is not None:
                    return f"date_diff('day', {pair[0]}, {pair[1]}) {self.rng.choice(['>', '<'])} {days}"
        value = self._value(f"SELECT {target} AS v FROM {scope.sql}", "v", q)
        if value is None:
            return None
        if form < 0.6:
            days = self.rng.choice([30, 90, 180, 365])
            return f"{target} BETWEEN {literal(value)} - INTERVAL {days} DAY AND {literal(value)}"
        return f"{target} {self.rng.choice(['>', '<', '>=', '<='])} {literal(value)}"

    def _date_pair(self, scope: Scope) -> tuple[str, str] | None:
        """Two date columns in scope, earlier first (judged by their medians), for date_diff."""
        dates = [ref(c) for ref in scope.refs for c in ref.table.by_role(Role.DATE)]
        if len(dates) < 2:
            return None
        first, second = self.rng.sample(dates, 2)
        median = self._value(f"SELECT date_diff('day', {first}, {second}) AS d FROM {scope.sql}", "d", 0.5)
        if median is None:
            return None
        return (first, second) if median >= 0 else (second, first)

    def _aggregate(self, scope: Scope) -> str:
        """COUNT(*), COUNT(DISTINCT …), SUM/AVG of a number, MIN/MAX of a number or a date."""
        grain = scope.grain
        numbers = [(grain, c) for c in grain.table.by_role(Role.NUMBER) if not c.references]
        dates = [(r, c) for r in scope.refs for c in r.table.by_role(Role.DATE)]
        form = self.rng.random()
        if form < 0.3 or not (numbers or dates):
            return "COUNT(*)"
        others = [r for r in scope.refs if r is not grain]
        if form < 0.4 and others:
            return f"COUNT(DISTINCT {self.rng.choice(others).key})"
        if numbers and (form < 0.8 or not dates):
            ref, column = self.rng.choice(numbers)
            functions = ["AVG", "MIN", "MAX"] + (["SUM", "SUM"] if column.additive else [])
            return f"{self.rng.choice(functions)}({ref(column)})"
        ref, column = self.rng.choice(dates)
        return f"{self.rng.choice(['MIN', 'MAX'])}({ref(column)})"

    def _group_key(self, scope: Scope, allow_case: bool = True) -> GroupKey | None:
        """A category, a joined table's label (grouped by its key too, as names repeat), a year, a flag or a band."""
        categories = [(r, c) for r in scope.refs for c in r.table.by_role(Role.CATEGORY)]
        labelled = [r for r in scope.refs[1:] if r.table.label is not None]
        dates = [(r, c) for r in scope.refs for c in r.table.by_role(Role.DATE)]
        flags = [(r, c) for r in scope.refs for c in r.table.by_role(Role.FLAG)]
        kinds = ["category"] * 2 * bool(categories) + ["label"] * bool(labelled) + ["year"] * bool(dates)
        kinds += ["flag"] * bool(flags) + ["band"] * allow_case
        if not kinds:
            return None
        kind = self.rng.choice(kinds)
        if kind == "label":
            ref = self.rng.choice(labelled)
            label = ref(ref.table.label)
            # Every column of the row grouped on is constant within its group.
            return GroupKey(label, f"{ref.key}, {label}", tuple(ref(c) for c in ref.table.columns))
        if kind == "year":
            ref, column = self.rng.choice(dates)
            part = f"EXTRACT(YEAR FROM {ref(column)})"
            return GroupKey(f"{part} AS year", part, (ref(column),))
        if kind == "band":
            band = self._bucket(scope)
            return None if band is None else GroupKey(f"{band[0]} AS band", band[0], (band[1],))
        ref, column = self.rng.choice(categories if kind == "category" else flags)
        return GroupKey(ref(column), ref(column), (ref(column),))

    def _bucket(self, scope: Scope) -> tuple[str, str] | None:
        """A CASE that splits a number at quantiles into two or three named bands, and the column it reads."""
        numbers = [(r, c) for r in scope.refs for c in r.table.by_role(Role.NUMBER) if not c.references]
        if not numbers:
            return None
        ref, column = self.rng.choice(numbers)
        target = ref(column)
        low = self._value(f"SELECT {target} AS v FROM {scope.sql}", "v", 0.33)
        high = self._value(f"SELECT {target} AS v FROM {scope.sql}", "v", 0.67)
        if low is None or high is None or high <= low:
            return None
        if self.rng.random() < 0.5:
            case = (
                f"CASE WHEN {target} < {literal(low)} THEN 'low' "
                f"WHEN {target} < {literal(high)} THEN 'medium' ELSE 'high' END"
            )
        else:
            case = f"CASE WHEN {target} >= {literal(high)} THEN 'high' ELSE 'not high' END"
        return case, target

    def _scalar_subquery(self) -> str | None:
        tables = [t for t in self.tables if [c for c in t.by_role(Role.NUMBER) if not c.references]]
        if not tables:
            return None
        table = self.rng.choice(tables)
        column = self.rng.choice([c for c in table.by_role(Role.NUMBER) if not c.references])
        ref = Ref(table)
        inner_condition = self._conditions(Scope([ref], []), self.rng.choice([0, 1]))
        inner = f"SELECT AVG({column.name}) FROM {table.name}" + (
            f" WHERE {inner_condition}" if inner_condition else ""
        )
        projection = self._projection(ref)
        if column.name not in projection and self.rng.random() < 0.5:
            projection.append(column.name)
        return (
            f"SELECT {', '.join(projection)} FROM {table.name} "
            f"WHERE {column.name} {self.rng.choice(['>', '<'])} ({inner})"
        )

    def _quantile_of_groups(self, scope: Scope, where: str, grouped_by: str, measure: str) -> object | None:
        per_group = f"SELECT {measure} AS m FROM {scope.sql}" + (f" WHERE {where}" if where else "")
        per_group += f" GROUP BY {grouped_by}"
        return self._value(per_group, "m", self.rng.uniform(0.2, 0.8))

    def _value(self, sql: str, column: str, quantile: float) -> object | None:
        """The `quantile` of `column` over the rows of `sql` (an actual value, not interpolated); None when empty."""
        try:
            row = self.con.execute(
                f"SELECT quantile_disc({column}, {quantile:.3f}) FROM ({sql}) WHERE {column} IS NOT NULL"
            ).fetchone()
        except duckdb.Error:
            return None
        return None if row is None else row[0]

    def _distinct(self, table: Table, column: Column) -> list:
        rows = self.con.execute(
            f"SELECT DISTINCT {column.name} FROM {table.name} WHERE {column.name} IS NOT NULL ORDER BY 1 LIMIT 500"
        ).fetchall()
        return [row[0] for row in rows]


# name -> (production, weight): the weights set how often each shape is drawn.
PRODUCTIONS: dict[str, tuple[Callable[[QuerySampler], str | None], float]] = {
    "lookup": (QuerySampler.lookup, 1.5),
    "listing": (QuerySampler.listing, 3),
    "aggregate": (QuerySampler.aggregate, 2),
    "grouped": (QuerySampler.grouped, 3),
    "top": (QuerySampler.top, 2),
    "nested": (QuerySampler.nested, 4),
    "set_operation": (QuerySampler.set_operation, 1.5),
    "self_join": (QuerySampler.self_join, 1.5),
    "case_expression": (QuerySampler.case_expression, 1.5),
    "date_arithmetic": (QuerySampler.date_arithmetic, 2),
}
