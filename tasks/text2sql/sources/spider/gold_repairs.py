"""Transpiling a gold query from SQLite to DuckDB with sqlglot, and repairing it where the two engines disagree:
double-quoted strings, text compared with numbers, LIKE's case, integer division and bare columns.
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp
from sqlglot.errors import ErrorLevel, SqlglotError, UnsupportedError

from tasks.text2sql.sources.spider.sqlite_import import Schema

# The repairs, by the name LoadReport.repairs counts them under.
REPAIR_DOUBLE_QUOTED_STRING = "double_quoted_string"
REPAIR_TEXT_COMPARISON = "text_comparison"
REPAIR_CASE_INSENSITIVE_LIKE = "case_insensitive_like"
REPAIR_INTEGER_DIVISION = "integer_division"
REPAIR_BARE_COLUMN = "bare_column"


class GoldRejectedError(Exception):
    """A gold query that cannot be carried over to DuckDB; the loader reports it as a GoldFailure."""

    def __init__(self, category: str, message: str, duckdb_sql: str | None = None) -> None:
        super().__init__(message)
        self.category = category
        self.message = message
        self.duckdb_sql = duckdb_sql


def transpile(sqlite_sql: str, schema: Schema) -> tuple[exp.Expr, set[str]]:
    """The repaired DuckDB tree of a SQLite query and the names of the repairs that changed it."""
    try:
        statements = [s for s in sqlglot.parse(sqlite_sql, read="sqlite") if s is not None]
    except SqlglotError as error:
        raise GoldRejectedError("parse", str(error)) from error
    if len(statements) != 1:
        raise GoldRejectedError("parse", f"expected one statement, got {len(statements)}")
    tree = statements[0]
    applied = set()
    if _unquote_string_literals(tree, schema, sqlite_sql):
        applied.add(REPAIR_DOUBLE_QUOTED_STRING)
    if _quote_numbers_compared_to_text(tree, schema):
        applied.add(REPAIR_TEXT_COMPARISON)
    if _make_like_case_insensitive(tree, schema):
        applied.add(REPAIR_CASE_INSENSITIVE_LIKE)
    if _truncate_integer_division(tree, schema):
        applied.add(REPAIR_INTEGER_DIVISION)
    if _wrap_bare_columns(tree):
        applied.add(REPAIR_BARE_COLUMN)
    return tree, applied


def generate(tree: exp.Expr) -> str:
    try:
        return tree.sql(dialect="duckdb", unsupported_level=ErrorLevel.RAISE)
    except UnsupportedError as error:
        raise GoldRejectedError("transpile", str(error)) from error


def _unquote_string_literals(tree: exp.Expr, schema: Schema, sqlite_sql: str) -> bool:
    """SQLite reads a double-quoted name that resolves to nothing as a string; DuckDB as a column.

    Names count as resolving when they are a table, an alias, or a column of a table the query
    reads, anywhere in the query (SQLite looks only in scope, which rarely differs).
    """
    tables = {table.name.lower() for table in tree.find_all(exp.Table)}
    known = tables | {c for table in tables for c in schema.columns.get(table, {})}
    known |= {alias.name.lower() for alias in tree.find_all(exp.TableAlias)}
    known |= {alias.alias.lower() for alias in tree.find_all(exp.Alias)}
    changed = False
    for column in list(tree.find_all(exp.Column)):
        identifier = column.this
        if (
            not column.table
            and isinstance(identifier, exp.Identifier)
            and identifier.quoted
            and identifier.name.lower() not in known
            # Backticks and brackets also quote names, but SQLite never reads them as strings.
            and '"' + identifier.name.replace('"', '""') + '"' in sqlite_sql
        ):
            column.replace(exp.Literal.string(identifier.name))
            changed = True
    return changed


def _quote_numbers_compared_to_text(tree: exp.Expr, schema: Schema) -> bool:
    """SQLite compares a TEXT column with a number as text; DuckDB refuses to compare them."""
    changed = False
    for node in list(tree.find_all(exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.In, exp.Between)):
        if isinstance(node, exp.In | exp.Between):
            column = node.this
            others = node.expressions if isinstance(node, exp.In) else [node.args["low"], node.args["high"]]
        else:
            column, other = (node.left, node.right) if isinstance(node.left, exp.Column) else (node.right, node.left)
            others = [other]
        if not isinstance(column, exp.Column) or _column_type(column, schema) != "VARCHAR":
            continue
        for other in others:
            text = _number_literal_text(other)
            if text is not None:
                other.replace(exp.Literal.string(text))
                changed = True
    return changed


def _number_literal_text(node: exp.Expr) -> str | None:
    """The text SQLite makes of a numeric literal: 10 -> '10', 1.50 -> '1.5'."""
    sign = ""
    if isinstance(node, exp.Neg):
        sign, node = "-", node.this
    if not isinstance(node, exp.Literal) or node.is_string:
        return None
    return sign + (str(int(node.this)) if node.is_int else repr(float(node.this)))


def _make_like_case_insensitive(tree: exp.Expr, schema: Schema) -> bool:
    """SQLite's LIKE ignores ASCII case and reads numbers as text; DuckDB's LIKE does neither."""
    changed = False
    for like in list(tree.find_all(exp.Like)):
        subject, pattern = like.this, like.expression
        if isinstance(subject, exp.Column) and _column_type(subject, schema) not in (None, "VARCHAR"):
            subject.replace(exp.cast(subject.copy(), exp.DType.VARCHAR))
            changed = True
        caseless = pattern.is_string and not any(c.isascii() and c.isalpha() for c in pattern.name)
        if not caseless:
            like.replace(exp.ILike(this=like.this, expression=pattern, negate=like.args.get("negate")))
            changed = True
    return changed


def _truncate_integer_division(tree: exp.Expr, schema: Schema) -> bool:
    """SQLite divides two integers to an integer (truncating); DuckDB's `/` always gives a float.

    sqlglot only truncates when it knows both operands are integers, which it does not for columns,
    so integer-ness is inferred here from the converted schema: integer literals and BIGINT columns,
    COUNT, LENGTH, CAST AS INT, and +, -, *, %, SUM, MIN, MAX, ABS, CASE/IIF and scalar subqueries
    of integers. Anything else (functions, columns of derived tables) counts as not integer.
    """
    changed = False
    # Innermost first, so that an outer division sees the inner one already made integer.
    for div in reversed(list(tree.find_all(exp.Div))):
        if not (_is_integer(div.left, schema) and _is_integer(div.right, schema)):
            continue
        divisor = div.right
        if not (isinstance(divisor, exp.Literal) and divisor.is_int and int(divisor.this) != 0):
            # SQLite gives NULL for a division by zero; DuckDB's `//` raises.
            divisor = exp.Nullif(this=divisor.copy(), expression=exp.Literal.number(0))
        quotient: exp.Expr = exp.IntDiv(this=div.left.copy(), expression=divisor)
        if isinstance(div.parent, exp.Binary):
            quotient = exp.Paren(this=quotient)
        div.replace(quotient)
        changed = True
    return changed


def _is_integer(node: exp.Expr, schema: Schema) -> bool:
    if isinstance(node, exp.Literal):
        return node.is_int
    if isinstance(node, exp.Paren | exp.Neg | exp.Sum | exp.Max | exp.Min | exp.Abs):
        return _is_integer(node.this, schema)
    if isinstance(node, exp.Add | exp.Sub | exp.Mul | exp.Mod):
        return _is_integer(node.left, schema) and _is_integer(node.right, schema)
    if isinstance(node, exp.Greatest | exp.Least):
        return all(_is_integer(arg, schema) for arg in [node.this, *node.expressions])
    if isinstance(node, exp.IntDiv | exp.Count | exp.Length):
        return True
    if isinstance(node, exp.Cast):
        return node.to.is_type(*exp.DataType.INTEGER_TYPES)
    if isinstance(node, exp.If):
        branches = [node.args.get("true"), node.args.get("false")]
        return all(b is None or _is_integer(b, schema) for b in branches)
    if isinstance(node, exp.Case):
        branches = [branch.args.get("true") for branch in node.args.get("ifs") or []]
        return all(_is_integer(b, schema) for b in [*branches, node.args.get("default")] if b is not None)
    if isinstance(node, exp.Column):
        return _column_type(node, schema) == "BIGINT"
    if isinstance(node, exp.Subquery) and isinstance(node.this, exp.Select) and len(node.this.expressions) == 1:
        return _is_integer(node.this.expressions[0].unalias(), schema)
    return False


def _wrap_bare_columns(tree: exp.Expr) -> bool:
    """SQLite lets an aggregate query name columns it neither groups nor aggregates; DuckDB refuses.

    SQLite takes such a "bare" column from the row holding the MIN/MAX when the query has one
    (ARG_MIN_NULL/ARG_MAX_NULL here), else from an arbitrary row of the group (ANY_VALUE here).
    """
    changed = False
    for select in list(tree.find_all(exp.Select)):
        group = select.args.get("group")
        parts = [*select.expressions, select.args.get("having"), select.args.get("order")]
        parts = [part for part in parts if part is not None]
        aggregates = [node for part in parts for node in _own_nodes(part, exp.AggFunc)]
        if group is None and not aggregates:
            continue
        aliases = {e.alias.lower() for e in select.expressions if isinstance(e, exp.Alias)}
        keys = _group_keys(select)
        extremes = [a for a in aggregates if isinstance(a, exp.Max | exp.Min)]
        for part in parts:
            for column in _own_nodes(part, exp.Column):
                if _is_grouped(column, keys, aliases):
                    continue
                wrapped: exp.Expr = exp.AnyValue(this=column.copy())
                if extremes:
                    function = "ARG_MAX_NULL" if isinstance(extremes[0], exp.Max) else "ARG_MIN_NULL"
                    wrapped = exp.Anonymous(this=function, expressions=[column.copy(), extremes[0].this.copy()])
                if column.parent is select:
                    wrapped = exp.alias_(wrapped, column.this.copy())
                column.replace(wrapped)
                changed = True
    return changed


def _own_nodes(root: exp.Expr, kind: type[exp.Expr]) -> list[exp.Expr]:
    """Nodes of a kind in one SELECT's expression, outside nested queries, windows and aggregates."""
    found = []
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, kind):
            found.append(node)
        elif not isinstance(node, exp.Query | exp.Window | exp.AggFunc):
            stack.extend(node.iter_expressions())
    return found


def _group_keys(select: exp.Select) -> list[exp.Expr]:
    """GROUP BY expressions, and the selected expressions that ordinals (GROUP BY 1) and aliases name."""
    group = select.args.get("group")
    aliased = {e.alias.lower(): e.this for e in select.expressions if isinstance(e, exp.Alias)}
    keys = []
    for key in group.expressions if group else []:
        keys.append(key)
        if isinstance(key, exp.Literal) and key.is_int and 0 < int(key.this) <= len(select.expressions):
            keys.append(select.expressions[int(key.this) - 1].unalias())
        elif isinstance(key, exp.Column) and not key.table and key.name.lower() in aliased:
            keys.append(aliased[key.name.lower()])
    return keys


def _is_grouped(column: exp.Column, keys: list[exp.Expr], aliases: set[str]) -> bool:
    """Whether a column names a select alias, a GROUP BY column, or lies in a grouped expression."""
    if not column.table and column.name.lower() in aliases:
        return True
    for key in keys:
        if isinstance(key, exp.Column):
            same_table = not key.table or not column.table or key.table.lower() == column.table.lower()
            if same_table and key.name.lower() == column.name.lower():
                return True
            continue
        node: exp.Expr | None = column.parent
        while node is not None and not isinstance(node, exp.Select):
            if node == key:
                return True
            node = node.parent
    return False


def _column_type(column: exp.Column, schema: Schema) -> str | None:
    """The DuckDB type of a column reference, resolved through the tables of the enclosing SELECTs."""
    name, qualifier = column.name, column.table.lower()
    select = column.find_ancestor(exp.Select)
    while select is not None:
        tables = _tables_by_alias(select)
        if qualifier and qualifier in tables:
            table = tables[qualifier]
            return None if table is None else schema.type_of(table, name)
        if not qualifier:
            types = {schema.type_of(table, name) for table in tables.values() if table is not None} - {None}
            if types:
                return types.pop() if len(types) == 1 else None
        select = select.find_ancestor(exp.Select)
    return None


def _tables_by_alias(select: exp.Select) -> dict[str, str | None]:
    """Table names by the name the SELECT gives them; None for a derived table, whose types are unknown."""
    sources = [select.args.get("from_"), *(select.args.get("joins") or [])]
    tables = [source.this for source in sources if source is not None]
    return {table.alias_or_name.lower(): table.name if isinstance(table, exp.Table) else None for table in tables}
