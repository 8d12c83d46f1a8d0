"""Whether a sampled query is worth a question: executed on the database, it must give a non-trivial answer that
does not depend on how ties are broken.

A query is kept when all of these hold (the first that fails names the rejection):

- it runs (read-only, within the sandbox's limits) and returns 1 to `MAX_ROWS` rows;
- not every cell is NULL, and the answer is not a lone 0 or NULL (a count of nothing);
- it is not the whole table: a query that neither aggregates nor groups returns fewer rows than its first table has;
- the answer is not in the question: a one-column answer is not just the literals the query filters on;
- every condition matters: dropping any conjunct of a WHERE or HAVING (or either side of an OR) changes the result,
  so the question cannot mention a filter that does nothing;
- every join matters: dropping a joined table that nothing but its join condition mentions changes the result;
- every operand of a set operation matters: the result differs from its left operand, and for UNION and INTERSECT
  from its right operand too;
- ordering is determined: where the outermost query orders, no two different rows among those returned (and the
  first row past a LIMIT) share the ordering key, so the answer does not depend on how ties are broken;
- a LIMIT cuts: without it there would be more rows.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import sqlglot
from sqlglot import exp

from tasks.text2sql.sql.matching import gold_is_ordered, results_match
from tasks.text2sql.sql.sandbox import ExecutionResult, QueryRunner

MAX_ROWS = 200


class Rejection(StrEnum):
    ERROR = "error"
    EMPTY = "empty"
    TOO_MANY_ROWS = "too_many_rows"
    ALL_NULL = "all_null"
    NOTHING_COUNTED = "nothing_counted"
    WHOLE_TABLE = "whole_table"
    ANSWER_IN_QUESTION = "answer_in_question"
    IDLE_CONDITION = "idle_condition"
    IDLE_JOIN = "idle_join"
    IDLE_OPERAND = "idle_operand"
    TIE = "tie"
    IDLE_LIMIT = "idle_limit"


@dataclass(frozen=True)
class Judgement:
    """The verdict on one query; `result` is its execution on the database judged."""

    result: ExecutionResult
    rejection: Rejection | None = None
    detail: str = ""

    @property
    def kept(self) -> bool:
        return self.rejection is None


def judge(sql: str, db_path: Path, runner: QueryRunner) -> Judgement:
    """Execute `sql` on `db_path` and apply the rules above."""
    result = runner.execute(db_path, sql, max_rows=MAX_ROWS)
    if not result.ok:
        return Judgement(result, Rejection.ERROR, result.error or "")
    if result.truncated:
        return Judgement(result, Rejection.TOO_MANY_ROWS)
    if not result.rows:
        return Judgement(result, Rejection.EMPTY)
    if all(cell is None for row in result.rows for cell in row):
        return Judgement(result, Rejection.ALL_NULL)
    if len(result.rows) == 1 and len(result.rows[0]) == 1 and result.rows[0][0] in (0, None):
        return Judgement(result, Rejection.NOTHING_COUNTED)
    tree = sqlglot.parse_one(sql, read="duckdb")
    # Ties first: a result that depends on how ties were broken cannot be compared with anything.
    for rule in (_whole_table, _answer_in_question, _tie, _idle_condition, _idle_join, _idle_operand):
        rejection = rule(tree, result, db_path, runner)
        if rejection is not None:
            return Judgement(result, *rejection)
    return Judgement(result)


Rule = tuple[Rejection, str] | None


def _whole_table(tree: exp.Expr, result: ExecutionResult, db_path: Path, runner: QueryRunner) -> Rule:
    if not isinstance(tree, exp.Select) or tree.args.get("group") or tree.find(exp.AggFunc):
        return None
    first = tree.args["from_"].this
    if not isinstance(first, exp.Table):
        return None
    count = runner.execute(db_path, f"SELECT COUNT(*) FROM {first.sql(dialect='duckdb')}")
    if count.ok and count.rows and count.rows[0][0] == len(result.rows):
        return Rejection.WHOLE_TABLE, first.name
    return None


def _answer_in_question(tree: exp.Expr, result: ExecutionResult, db_path: Path, runner: QueryRunner) -> Rule:
    if len(result.columns) != 1:
        return None
    literals = {literal.this for literal in tree.find_all(exp.Literal) if literal.is_string}
    if all(isinstance(row[0], str) and row[0] in literals for row in result.rows):
        return Rejection.ANSWER_IN_QUESTION, str(result.rows[0][0])
    return None


def _outer_selects(tree: exp.Expr) -> list[exp.Select]:
    """The SELECTs whose conditions shape the answer: the query, or each operand of a set operation."""
    if isinstance(tree, exp.SetOperation):
        return [*_outer_selects(tree.left), *_outer_selects(tree.right)]
    if isinstance(tree, exp.Subquery):
        return _outer_selects(tree.this)
    return [tree] if isinstance(tree, exp.Select) else []


def _conjuncts(condition: exp.Expr) -> list[exp.Expr]:
    condition = condition.unnest()
    if isinstance(condition, exp.And):
        return [*_conjuncts(condition.left), *_conjuncts(condition.right)]
    return [condition]


def _ablations(tree: exp.Expr) -> list[tuple[str, exp.Expr]]:
    """(what was dropped, the query without it) for every conjunct and every side of an OR, in WHERE and HAVING."""
    ablated: list[tuple[str, exp.Expr]] = []
    for index, select in enumerate(_outer_selects(tree)):
        for clause in ("where", "having"):
            node = select.args.get(clause)
            if node is None:
                continue
            conjuncts = _conjuncts(node.this)
            replacements: list[tuple[str, list[exp.Expr]]] = []
            for i, conjunct in enumerate(conjuncts):
                rest = conjuncts[:i] + conjuncts[i + 1 :]
                replacements.append((conjunct.sql(dialect="duckdb"), rest))
                if isinstance(conjunct.unnest(), exp.Or):
                    disjunction = conjunct.unnest()
                    for kept, dropped in ((disjunction.left, disjunction.right), (disjunction.right, disjunction.left)):
                        replacements.append((dropped.sql(dialect="duckdb"), [*rest[:i], kept, *rest[i:]]))
            for dropped, remaining in replacements:
                copy = tree.copy()
                target = _outer_selects(copy)[index]
                if remaining:
                    target.set(
                        clause,
                        exp.Where(this=exp.and_(*remaining))
                        if clause == "where"
                        else exp.Having(this=exp.and_(*remaining)),
                    )
                else:
                    target.set(clause, None)
                ablated.append((dropped, copy))
    return ablated


def _idle_condition(tree: exp.Expr, result: ExecutionResult, db_path: Path, runner: QueryRunner) -> Rule:
    ordered = gold_is_ordered(tree.sql(dialect="duckdb"))
    for dropped, ablated in _ablations(tree):
        without = runner.execute(db_path, ablated.sql(dialect="duckdb"), max_rows=MAX_ROWS + 1)
        if without.ok and results_match(result, without, ordered):
            return Rejection.IDLE_CONDITION, dropped
    return None


def _idle_join(tree: exp.Expr, result: ExecutionResult, db_path: Path, runner: QueryRunner) -> Rule:
    ordered = gold_is_ordered(tree.sql(dialect="duckdb"))
    for index, select in enumerate(_outer_selects(tree)):
        for position, join in enumerate(select.args.get("joins") or []):
            alias = join.this.alias_or_name
            outside = [
                column for column in select.find_all(exp.Column) if column.table == alias and not _inside(column, join)
            ]
            if outside:
                continue
            copy = tree.copy()
            target = _outer_selects(copy)[index]
            target.args["joins"].pop(position)
            without = runner.execute(db_path, copy.sql(dialect="duckdb"), max_rows=MAX_ROWS + 1)
            if without.ok and results_match(result, without, ordered):
                return Rejection.IDLE_JOIN, join.this.name
    return None


def _inside(node: exp.Expr, ancestor: exp.Expr) -> bool:
    while node is not None:
        if node is ancestor:
            return True
        node = node.parent
    return False


def _idle_operand(tree: exp.Expr, result: ExecutionResult, db_path: Path, runner: QueryRunner) -> Rule:
    if not isinstance(tree, exp.SetOperation):
        return None
    operands = [("left", tree.left)]
    if not isinstance(tree, exp.Except):
        operands.append(("right", tree.right))
    for side, operand in operands:
        alone = runner.execute(db_path, operand.sql(dialect="duckdb"), max_rows=MAX_ROWS + 1)
        # A set operation removes duplicates; so does the comparison, by comparing the distinct rows.
        if alone.ok and set(alone.rows) == set(result.rows):
            return Rejection.IDLE_OPERAND, side
    return None


def _tie(tree: exp.Expr, result: ExecutionResult, db_path: Path, runner: QueryRunner) -> Rule:
    """Rows that differ yet share the ordering key, among those returned and the first one past the LIMIT."""
    if not isinstance(tree, exp.Select) or tree.args.get("order") is None:
        return None
    keys = [ordered.this for ordered in tree.args["order"].expressions]
    probe = tree.copy()
    width = len(tree.expressions)
    if tree.args.get("distinct"):
        # Under DISTINCT the keys are selected already; find them by alias or by expression.
        names = [e.alias_or_name for e in tree.expressions]
        texts = [e.unalias().sql() for e in tree.expressions]
        positions = []
        for key in keys:
            text = key.sql()
            if isinstance(key, exp.Column) and not key.table and key.name in names:
                positions.append(names.index(key.name))
            elif text in texts:
                positions.append(texts.index(text))
            else:
                return Rejection.TIE, f"cannot locate ordering key {text} among the selected columns"
    else:
        positions = list(range(width, width + len(keys)))
        for i, key in enumerate(keys):
            probe.select(key.copy().as_(f"tie_key_{i}"), copy=False)
    limit = tree.args.get("limit")
    if limit is not None:
        probe.set("limit", exp.Limit(expression=exp.Literal.number(int(limit.expression.name) + 1)))
    probed = runner.execute(db_path, probe.sql(dialect="duckdb"), max_rows=MAX_ROWS + 1)
    if not probed.ok:
        return Rejection.TIE, f"the tie probe failed: {probed.error}"
    if limit is not None and len(probed.rows) <= int(limit.expression.name):
        return Rejection.IDLE_LIMIT, f"only {len(probed.rows)} rows"
    rows_by_key: dict[tuple, set[tuple]] = defaultdict(set)
    for row in probed.rows:
        rows_by_key[tuple(row[p] for p in positions)].add(tuple(row[:width]))
    tied = [key for key, rows in rows_by_key.items() if len(rows) > 1]
    return (Rejection.TIE, f"rows tie at {tied[0]}") if tied else None
