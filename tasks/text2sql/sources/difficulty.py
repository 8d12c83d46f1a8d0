"""Spider's hardness levels (easy/medium/hard/extra) computed from a query's components with sqlglot."""

from __future__ import annotations

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from tasks.text2sql.dataset import Difficulty
from tasks.text2sql.errors import DatasetError

# Spider's AGG_OPS; DuckDB-only aggregates that our repairs add (ANY_VALUE, ARG_MAX) are not among them.
_SPIDER_AGGREGATES = (exp.Count, exp.Sum, exp.Avg, exp.Max, exp.Min)
_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv)


def classify_difficulty(sql: str) -> Difficulty:
    """Spider's hardness of one DuckDB query; raises DatasetError naming the SQL when it does not parse.

    See `classify_expression` for the rule.
    """
    try:
        statements = [s for s in sqlglot.parse(sql, read="duckdb") if s is not None]
    except SqlglotError as error:
        raise DatasetError(f"cannot classify unparseable SQL {sql!r}: {error}") from error
    if len(statements) != 1:
        raise DatasetError(f"cannot classify SQL {sql!r}: expected one statement, got {len(statements)}")
    return classify_expression(statements[0])


def classify_expression(query: exp.Expr) -> Difficulty:
    """Spider's hardness of a parsed query, following `eval_hardness` of Spider's evaluation.py.

    Spider counts three things on the top-level query (for a set operation, its first SELECT):

    - component1: one each for WHERE, GROUP BY, ORDER BY and LIMIT, one per table joined beyond the
      first, one per OR and one per LIKE among the conditions of JOIN ON, WHERE and HAVING.
    - component2: one for a UNION/INTERSECT/EXCEPT, plus one per subquery in those conditions.
    - others: one each when there is more than one aggregate, more than one selected column, more
      than one WHERE condition, more than one GROUP BY column.

    Then: easy when c1 <= 1, others == 0, c2 == 0; medium when (others <= 2, c1 <= 1, c2 == 0) or
    (c1 <= 2, others < 2, c2 == 0); hard when (others > 2, c1 <= 2, c2 == 0) or (2 < c1 <= 3,
    others <= 2, c2 == 0) or (c1 <= 1, others == 0, c2 <= 1); extra otherwise.

    Spider's aggregate count has quirks that its published labels carry, so they are kept here: it
    counts aggregates in SELECT and ORDER BY, counts every negated WHERE or HAVING condition
    (NOT IN, NOT LIKE, NOT BETWEEN) as an aggregate, counts every AND/OR joining HAVING conditions
    as an aggregate, and does not count the aggregates inside HAVING conditions. Raises DatasetError
    when the statement is not a query.
    """
    component2 = 0
    select = query
    while isinstance(select, exp.SetOperation | exp.Subquery):
        if isinstance(select, exp.SetOperation):
            component2 = 1
        select = select.this
    if not isinstance(select, exp.Select):
        raise DatasetError(f"cannot classify {query.sql()!r}: not a SELECT query")

    where = select.args.get("where")
    having = select.args.get("having")
    group = select.args.get("group")
    order = select.args.get("order")
    joins = select.args.get("joins") or []
    where_conditions, where_connectors = _split_condition(where.this if where else None)
    having_conditions, having_connectors = _split_condition(having.this if having else None)
    conditions = [*where_conditions, *having_conditions]
    connectors = [*where_connectors, *having_connectors]
    for join in joins:
        join_conditions, join_connectors = _split_condition(join.args.get("on"))
        conditions += join_conditions
        connectors += join_connectors

    component1 = sum(part is not None for part in (where, group, order, select.args.get("limit")))
    component1 += len(joins) + sum(isinstance(c, exp.Or) for c in connectors)
    component1 += sum(isinstance(_unnegated(c), exp.Like | exp.ILike) for c in conditions)
    component2 += sum(_top_level_subqueries(c) for c in conditions)

    aggregates = sum(_is_aggregate(e) for e in select.expressions)
    aggregates += sum(_is_negated(c) for c in [*where_conditions, *having_conditions])
    aggregates += len(having_connectors)
    for ordered in order.expressions if order else []:
        term = ordered.this
        operands = [term.left, term.right] if isinstance(term, _ARITHMETIC) else [term]
        aggregates += sum(_is_aggregate(o) for o in operands)
    group_columns = group.expressions if group else []
    others = sum((aggregates > 1, len(select.expressions) > 1, len(where_conditions) > 1, len(group_columns) > 1))

    if component1 <= 1 and others == 0 and component2 == 0:
        return Difficulty.EASY
    if (others <= 2 and component1 <= 1 and component2 == 0) or (component1 <= 2 and others < 2 and component2 == 0):
        return Difficulty.MEDIUM
    if (
        (others > 2 and component1 <= 2 and component2 == 0)
        or (2 < component1 <= 3 and others <= 2 and component2 == 0)
        or (component1 <= 1 and others == 0 and component2 <= 1)
    ):
        return Difficulty.HARD
    return Difficulty.EXTRA


def _split_condition(condition: exp.Expr | None) -> tuple[list[exp.Expr], list[exp.Expr]]:
    """The conditions joined by AND/OR (Spider's cond_units) and the AND/OR nodes joining them."""
    if condition is None:
        return [], []
    if isinstance(condition, exp.Paren):
        return _split_condition(condition.this)
    if isinstance(condition, exp.And | exp.Or):
        left, left_connectors = _split_condition(condition.left)
        right, right_connectors = _split_condition(condition.right)
        return left + right, [*left_connectors, condition, *right_connectors]
    return [condition], []


def _unnegated(condition: exp.Expr) -> exp.Expr:
    """The predicate under a NOT or an ESCAPE clause."""
    return condition.this if isinstance(condition, exp.Not | exp.Escape) else condition


def _is_negated(condition: exp.Expr) -> bool:
    """Whether Spider's parser sets not_op: a NOT right before the operator (IS NOT NULL is not one)."""
    if isinstance(condition, exp.Not):
        return not isinstance(condition.this, exp.Is)
    return bool(condition.args.get("negate"))


def _is_aggregate(expression: exp.Expr) -> bool:
    return isinstance(expression.unalias(), _SPIDER_AGGREGATES)


def _top_level_subqueries(condition: exp.Expr) -> int:
    """Subqueries directly inside a condition, not those nested in another subquery."""
    count = 0
    for query in condition.find_all(exp.Select, exp.SetOperation):
        node = query.parent
        while node is not condition and not isinstance(node, exp.Select | exp.SetOperation):
            node = node.parent
        count += node is condition
    return count
