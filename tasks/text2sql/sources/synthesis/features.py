"""Which SQL features a query uses, read from its syntax tree (not from the grammar that wrote it), for the build's
yield table and the tests' coverage check."""

from __future__ import annotations

import functools
from enum import StrEnum

import sqlglot
from sqlglot import exp


class Feature(StrEnum):
    JOIN = "join"
    SELF_JOIN = "self_join"
    GROUP_BY = "group_by"
    HAVING = "having"
    IN_SUBQUERY = "in_subquery"
    NOT_IN_SUBQUERY = "not_in_subquery"
    EXISTS = "exists"
    NOT_EXISTS = "not_exists"
    SCALAR_SUBQUERY = "scalar_subquery"
    SET_OPERATION = "set_operation"
    ORDER_LIMIT = "order_limit"
    CASE = "case"
    DATE_ARITHMETIC = "date_arithmetic"
    AGGREGATE = "aggregate"
    # A query with none of the above: a filtered listing.
    PLAIN = "plain"


_DATE_ARITHMETIC = (exp.DateDiff, exp.Extract, exp.Interval, exp.DateAdd, exp.DateSub)
_COMPARISONS = (exp.GT, exp.GTE, exp.LT, exp.LTE, exp.EQ, exp.NEQ)


@functools.lru_cache(maxsize=65_536)
def sql_features(sql: str) -> frozenset[Feature]:
    """The features of one DuckDB query; raises sqlglot's ParseError when it does not parse."""
    tree = sqlglot.parse_one(sql, read="duckdb")
    found: set[Feature] = set()
    if tree.find(exp.Join):
        found.add(Feature.JOIN)
    for select in tree.find_all(exp.Select):
        tables = [t.name.lower() for t in select.find_all(exp.Table) if t.parent_select is select]
        if len(tables) != len(set(tables)):
            found.add(Feature.SELF_JOIN)
    if tree.find(exp.Group):
        found.add(Feature.GROUP_BY)
    if tree.find(exp.Having):
        found.add(Feature.HAVING)
    for node in tree.find_all(exp.In):
        if node.args.get("query") is not None:
            found.add(Feature.NOT_IN_SUBQUERY if isinstance(node.parent, exp.Not) else Feature.IN_SUBQUERY)
    for node in tree.find_all(exp.Exists):
        found.add(Feature.NOT_EXISTS if isinstance(node.parent, exp.Not) else Feature.EXISTS)
    if any(isinstance(s.parent, _COMPARISONS) for s in tree.find_all(exp.Subquery)):
        found.add(Feature.SCALAR_SUBQUERY)
    if isinstance(tree, exp.SetOperation):
        found.add(Feature.SET_OPERATION)
    if tree.args.get("order") is not None and tree.args.get("limit") is not None:
        found.add(Feature.ORDER_LIMIT)
    if tree.find(exp.Case):
        found.add(Feature.CASE)
    if tree.find(*_DATE_ARITHMETIC):
        found.add(Feature.DATE_ARITHMETIC)
    if tree.find(exp.AggFunc):
        found.add(Feature.AGGREGATE)
    return frozenset(found or {Feature.PLAIN})
