"""Whether a predicted query's result equals the gold one, with the semantics of the field.

- Rows are compared as multisets; order matters only when the gold query's outermost level orders.
- Columns may come in any order (the prediction's columns are matched to the gold's by a permutation),
  but their number must agree.
- Numbers compare with a relative tolerance (six significant digits), whatever their type (int, float,
  DECIMAL); booleans compare as 0/1; dates and timestamps as ISO text; NULL equals NULL, as it does in
  Spider's and BIRD's evaluation.
- Over several databases (test-suite accuracy), a prediction is correct only if it matches on every one,
  and at least one gold result must be non-empty: an empty result matching an empty result proves nothing.
"""

from __future__ import annotations

import datetime as dt
import functools
import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

import sqlglot
from sqlglot import exp

from tasks.text2sql.sql.sandbox import ExecutionResult

Cell = object
Row = tuple[Cell, ...]


def normalize_cell(value: object) -> Cell:
    """A hashable value that is equal for results a person would call equal."""
    kind = type(value)
    if kind is str or value is None:
        return value
    if kind is int and -1_000_000 < value < 1_000_000:
        return float(value)  # six significant digits hold it exactly: no rounding to do
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float | Decimal):
        number = float(value)
        if number != number:  # NaN equals NaN here, as a result cell
            return "NaN"
        return float(f"{number:.6g}")
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    return str(value)


def normalize_rows(rows: Sequence[Sequence[object]]) -> list[Row]:
    return [tuple(map(normalize_cell, row)) for row in rows]


class Comparable:
    """An execution result prepared for comparison; normalised rows and counts are computed once, on demand.

    Gold results are compared with many predictions, so the scorer keeps their Comparable.
    """

    def __init__(self, result: ExecutionResult) -> None:
        self.result = result
        self.usable = result.ok and not result.truncated
        self.width = len(result.columns)
        self.size = len(result.rows)

    @functools.cached_property
    def rows(self) -> list[Row]:
        return normalize_rows(self.result.rows)

    @functools.cached_property
    def counter(self) -> Counter[Row]:
        return Counter(self.rows)

    @functools.cached_property
    def column_counters(self) -> list[Counter[Cell]]:
        return [Counter(row[j] for row in self.rows) for j in range(self.width)]


def comparable(result: ExecutionResult | Comparable) -> Comparable:
    return result if isinstance(result, Comparable) else Comparable(result)


@functools.lru_cache(maxsize=65_536)
def gold_is_ordered(sql: str) -> bool:
    """True when the query's outermost level has ORDER BY, so row order is part of the answer."""
    try:
        tree = sqlglot.parse_one(sql, read="duckdb")
    except sqlglot.errors.ParseError:
        return False
    return isinstance(tree, exp.Query) and tree.args.get("order") is not None


def results_match(gold: ExecutionResult | Comparable, predicted: ExecutionResult | Comparable, ordered: bool) -> bool:
    """Whether one predicted result equals one gold result under some permutation of the predicted columns.

    Failed or truncated results never match.
    """
    gold, predicted = comparable(gold), comparable(predicted)
    # Cheap checks first: most wrong answers differ in shape, and normalising large results is not free.
    if not (gold.usable and predicted.usable) or gold.width != predicted.width or gold.size != predicted.size:
        return False
    if gold.size == 0:
        return True
    # Equal as they came, equal once normalised: a right answer usually costs one comparison in C.
    if predicted.result.rows == gold.result.rows:
        return True
    # Most matches keep the gold's column order: one comparison, no per-column counts.
    if (predicted.rows == gold.rows) if ordered else _same_counts(predicted.counter, gold.counter):
        return True
    width = gold.width
    if width == 1:
        return False
    candidates = [
        [i for i in range(width) if _same_counts(predicted.column_counters[i], gold.column_counters[j])]
        for j in range(width)
    ]
    for permutation in itertools.product(*candidates):
        if len(set(permutation)) != width or permutation == tuple(range(width)):
            continue
        permuted = [tuple(row[i] for i in permutation) for row in predicted.rows]
        if (permuted == gold.rows) if ordered else _same_counts(Counter(permuted), gold.counter):
            return True
    return False


def _same_counts(a: Counter, b: Counter) -> bool:
    """Counter equality at dict speed: these counters hold no zero counts, so equal counts mean equal dicts
    (Counter's own == walks both in Python to treat a missing key as zero)."""
    return dict.__eq__(a, b)


@dataclass(frozen=True)
class MatchOutcome:
    correct: bool
    # How many databases agreed, out of how many were compared.
    matched: int
    compared: int


def match_on_databases(
    gold: Sequence[ExecutionResult | Comparable], predicted: Sequence[ExecutionResult | Comparable], ordered: bool
) -> MatchOutcome:
    """Test-suite matching: correct only if it matches on all databases, one of them with a non-empty gold."""
    if len(gold) != len(predicted) or not gold:
        raise ValueError(f"need one predicted result per gold result, got {len(predicted)} for {len(gold)}")
    gold = [comparable(g) for g in gold]
    matched = sum(results_match(g, p, ordered) for g, p in zip(gold, predicted, strict=True))
    evidence = any(g.usable and g.size for g in gold)
    return MatchOutcome(correct=evidence and matched == len(gold), matched=matched, compared=len(gold))


def result_overlap(gold: ExecutionResult | Comparable, predicted: ExecutionResult | Comparable) -> float:
    """Partial credit in [0, 1]: F1 of the row multisets under the best column permutation.

    When the column counts differ it falls back to half the F1 of the multisets of cell values, so selecting
    one column too many still earns something, but less than the right shape.
    """
    gold, predicted = comparable(gold), comparable(predicted)
    if not gold.result.ok or not predicted.result.ok or not gold.size or not predicted.size:
        return 0.0
    if gold.width != predicted.width:
        cells_gold = Counter(v for row in gold.rows for v in row)
        cells_predicted = Counter(v for row in predicted.rows for v in row)
        return 0.5 * _f1(cells_gold, cells_predicted)
    best = 0.0
    # Every permutation, not only value-consistent ones: partial results rarely have equal column multisets.
    for permutation in itertools.islice(itertools.permutations(range(gold.width)), 24):
        permuted = Counter(tuple(row[i] for i in permutation) for row in predicted.rows)
        best = max(best, _f1(gold.counter, permuted))
    return best


def _f1(gold: Counter, predicted: Counter) -> float:
    common = sum((gold & predicted).values())
    if common == 0:
        return 0.0
    precision = common / sum(predicted.values())
    recall = common / sum(gold.values())
    return 2 * precision * recall / (precision + recall)
