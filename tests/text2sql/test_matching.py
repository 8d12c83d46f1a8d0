"""Result matching follows the field's semantics (Spider/BIRD execution accuracy, test-suite accuracy)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from tasks.text2sql.sql.matching import gold_is_ordered, match_on_databases, result_overlap, results_match
from tasks.text2sql.sql.sandbox import ExecutionResult, ExecutionStatus


def result(*rows: tuple, columns: tuple[str, ...] | None = None, truncated: bool = False) -> ExecutionResult:
    width = len(rows[0]) if rows else 1
    return ExecutionResult(
        status=ExecutionStatus.OK,
        columns=columns or tuple(f"c{i}" for i in range(width)),
        rows=tuple(rows),
        truncated=truncated,
    )


FAILED = ExecutionResult(status=ExecutionStatus.ERROR, error="syntax error")


def test_rows_compare_as_multisets_when_gold_does_not_order() -> None:
    assert results_match(result((1,), (2,), (2,)), result((2,), (1,), (2,)), ordered=False)
    assert not results_match(result((1,), (2,), (2,)), result((1,), (1,), (2,)), ordered=False)
    assert not results_match(result((1,), (2,)), result((1,), (2,), (2,)), ordered=False)


def test_order_matters_only_when_gold_orders() -> None:
    assert not results_match(result((1,), (2,)), result((2,), (1,)), ordered=True)
    assert results_match(result((1,), (2,)), result((1,), (2,)), ordered=True)


def test_gold_ordering_is_read_from_the_outermost_query() -> None:
    assert gold_is_ordered("SELECT a FROM t ORDER BY a")
    assert gold_is_ordered("SELECT a FROM t UNION SELECT b FROM u ORDER BY 1")
    assert not gold_is_ordered("SELECT a FROM (SELECT a FROM t ORDER BY a LIMIT 3)")
    assert not gold_is_ordered("SELECT a FROM t")


def test_columns_may_come_in_any_order() -> None:
    gold = result(("Ann", 3), ("Bo", 5))
    assert results_match(gold, result((3, "Ann"), (5, "Bo")), ordered=False)
    assert results_match(gold, result((3, "Ann"), (5, "Bo")), ordered=True)
    # Same column values, but paired wrongly: no permutation makes the rows equal.
    assert not results_match(gold, result(("Ann", 5), ("Bo", 3)), ordered=False)


def test_permutation_is_chosen_when_columns_hold_equal_values() -> None:
    gold = result((1, 1), (1, 2))
    assert results_match(gold, result((1, 1), (2, 1)), ordered=False)


def test_column_counts_must_agree() -> None:
    assert not results_match(
        result(
            ("Ann",),
        ),
        result(
            ("Ann", 3),
        ),
        ordered=False,
    )


def test_numbers_compare_with_a_tolerance_across_types() -> None:
    assert results_match(result((Decimal("12.50"),)), result((12.5,)), ordered=False)
    assert results_match(result((2,)), result((2.0,)), ordered=False)
    assert results_match(result((1 / 3,)), result((0.33333333,)), ordered=False)
    assert not results_match(result((1 / 3,)), result((0.334,)), ordered=False)
    assert results_match(result((True,)), result((1,)), ordered=False)
    # Integers too, on both sides of the six digits an integer can hold exactly.
    assert not results_match(result((999_998,)), result((999_999,)), ordered=False)
    assert results_match(result((999_999,)), result((999_999.0,)), ordered=False)
    assert results_match(result((1_234_567,)), result((1_234_568,)), ordered=False)
    assert not results_match(result((1_234_567,)), result((1_235_567,)), ordered=False)


def test_dates_match_their_iso_text_and_null_matches_null() -> None:
    assert results_match(result((dt.date(2024, 1, 5),)), result(("2024-01-05",)), ordered=False)
    assert results_match(result((None, 1)), result((None, 1)), ordered=False)
    assert not results_match(result((None,)), result((0,)), ordered=False)


def test_strings_are_case_sensitive() -> None:
    assert not results_match(result(("Berlin",)), result(("berlin",)), ordered=False)


def test_failed_or_truncated_results_never_match() -> None:
    assert not results_match(result((1,)), FAILED, ordered=False)
    assert not results_match(FAILED, FAILED, ordered=False)
    assert not results_match(result((1,)), result((1,), truncated=True), ordered=False)


def test_empty_gold_results_never_count_as_a_match() -> None:
    empty = result()
    assert not match_on_databases([empty], [empty], ordered=False).correct
    assert not match_on_databases([empty, empty], [empty, empty], ordered=False).correct
    # Empty on one database is fine when another database shows the answer.
    assert match_on_databases([result((1,)), empty], [result((1,)), empty], ordered=False).correct


def test_test_suite_matching_requires_every_database() -> None:
    gold = [result((1,)), result((7,))]
    outcome = match_on_databases(gold, [result((1,)), result((1,))], ordered=False)
    assert not outcome.correct
    assert (outcome.matched, outcome.compared) == (1, 2)
    assert match_on_databases(gold, [result((1,)), result((7,))], ordered=False).correct
    with pytest.raises(ValueError, match="one predicted result per gold result"):
        match_on_databases(gold, [result((1,))], ordered=False)


def test_overlap_gives_partial_credit() -> None:
    gold = result(("a",), ("b",), ("c",), ("d",))
    assert result_overlap(gold, gold) == pytest.approx(1.0)
    assert result_overlap(gold, result(("a",), ("b",))) == pytest.approx(2 * 0.5 / 1.5)
    assert (
        result_overlap(
            gold,
            result(
                ("x",),
            ),
        )
        == 0.0
    )
    assert result_overlap(gold, FAILED) == 0.0
    wider = result(("a", 1), ("b", 2), ("c", 3), ("d", 4))
    assert 0.0 < result_overlap(gold, wider) <= 0.5
