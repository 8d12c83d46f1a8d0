"""Reward specs validate as data, and each component rewards what it says on real executions."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from tasks.text2sql.dataset import Example, Text2SqlDataset
from tasks.text2sql.errors import RewardSpecError
from tasks.text2sql.reward.rewards import (
    DEFAULT_REWARD_SPEC,
    Executes,
    ExecutionMatch,
    Format,
    LengthPenalty,
    Parses,
    ResultOverlap,
    RewardSpec,
    SchemaLinking,
)
from tasks.text2sql.reward.scoring import Scorer
from tasks.text2sql.sql.sandbox import ExecutionStatus

EVERYTHING = RewardSpec(
    components=(
        ExecutionMatch(weight=1.0),
        ResultOverlap(weight=0.3),
        Parses(weight=0.05),
        Executes(weight=0.05),
        Format(weight=0.1),
        LengthPenalty(weight=0.2, free_chars=200, scale_chars=100),
        SchemaLinking(weight=0.1),
    )
)


def first(bundled: Text2SqlDataset, predicate) -> Example:
    return next(e for e in bundled.split("train") if predicate(e))


def test_a_spec_round_trips_through_json() -> None:
    assert RewardSpec.parse(EVERYTHING.to_json()) == EVERYTHING
    assert RewardSpec.parse(json.loads(EVERYTHING.to_json())) == EVERYTHING


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ({"components": [{"kind": "execution_match", "weight": 50}]}, "components.0.execution_match.weight"),
        ({"components": [{"kind": "vibes"}]}, "components.0"),
        ({"components": []}, "components"),
        ({"components": [{"kind": "format"}, {"kind": "format"}]}, "repeated: ['format']"),
        ({"components": [{"kind": "length_penalty", "scale_chars": 0}]}, "length_penalty.scale_chars"),
        ({"components": [{"kind": "format", "colour": "red"}]}, "format.colour"),
        ({"components": [{"kind": "execution_match", "databases": "some"}]}, "execution_match.databases"),
    ],
)
def test_invalid_specs_name_the_bad_field(spec: dict, named: str) -> None:
    with pytest.raises(RewardSpecError) as error:
        RewardSpec.parse(spec)
    assert named in str(error.value)
    assert "execution_match" in str(error.value)  # the message lists the kinds that exist


def test_invalid_json_is_reported_as_such() -> None:
    with pytest.raises(RewardSpecError, match="not valid JSON"):
        RewardSpec.parse("{components: ")


def test_gold_sql_earns_every_positive_component(bundled: Text2SqlDataset, scorer: Scorer) -> None:
    example = bundled.split("train")[0]
    score = scorer.score(example, f"{example.gold_sql};", EVERYTHING)
    assert score.correct
    assert score.components == pytest.approx(
        {
            "execution_match": 1.0,
            "result_overlap": 0.3,
            "parses": 0.05,
            "executes": 0.05,
            "format": 0.1,
            "length_penalty": 0.0,
            "schema_linking": 0.1,
        }
    )
    assert score.reward == pytest.approx(1.6)


def test_rambling_after_the_answer_loses_only_the_format_reward(bundled: Text2SqlDataset, scorer: Scorer) -> None:
    example = bundled.split("train")[0]
    score = scorer.score(example, f"{example.gold_sql};\nQuestion: and another?", DEFAULT_REWARD_SPEC)
    assert score.correct
    assert score.components == {"execution_match": 1.0, "format": 0.0}


def test_a_wrong_filter_gets_partial_overlap_but_no_match(bundled: Text2SqlDataset, scorer: Scorer) -> None:
    example = first(bundled, lambda e: re.fullmatch(r"SELECT name FROM \w+ WHERE \w+ > [\d.]+", e.gold_sql))
    widened = example.gold_sql.rsplit(" ", 1)[0] + " 0"
    score = scorer.score(example, widened + ";", EVERYTHING)
    assert not score.correct
    assert score.status is ExecutionStatus.OK
    assert 0.0 < score.components["result_overlap"] < 0.3
    assert score.components["schema_linking"] == pytest.approx(0.1)


def test_text_that_is_not_sql_earns_nothing(bundled: Text2SqlDataset, scorer: Scorer) -> None:
    example = bundled.split("train")[0]
    score = scorer.score(example, "I think the answer is 12.", EVERYTHING)
    assert not score.correct
    assert score.reward == 0.0


def test_a_completion_with_a_lone_surrogate_scores_zero_instead_of_raising(
    bundled: Text2SqlDataset, scorer: Scorer
) -> None:
    # A decoded completion can hold a lone UTF-16 surrogate, which DuckDB's binding cannot take as a str.
    example = bundled.split("dev")[0]
    score = scorer.score(example, f"{example.gold_sql} -- \ud800;", EVERYTHING)
    assert not score.correct and score.components["execution_match"] == 0.0
    assert score.status is ExecutionStatus.ERROR


def test_long_completions_are_penalised_in_proportion(bundled: Text2SqlDataset, scorer: Scorer) -> None:
    example = bundled.split("train")[0]
    spec = RewardSpec(components=(LengthPenalty(weight=1.0, free_chars=100, scale_chars=100),))
    assert scorer.score(example, "SELECT 1;" + " " * 50, spec).reward == 0.0
    assert scorer.score(example, "SELECT 1;" + " " * 141, spec).reward == pytest.approx(-0.5)
    assert scorer.score(example, "SELECT 1;" + " " * 1000, spec).reward == pytest.approx(-1.0)


def test_hostile_sql_is_blocked_scores_zero_and_leaves_the_database_alone(
    bundled: Text2SqlDataset, scorer: Scorer
) -> None:
    example = bundled.split("train")[0]
    path = bundled.database(example.db_id).path
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    for attack in (
        "DROP TABLE customers;",
        "COPY customers TO '/tmp/leak.csv';",
        "SELECT * FROM read_csv('/etc/passwd');",
    ):
        score = scorer.score(example, attack, EVERYTHING)
        assert score.status is ExecutionStatus.BLOCKED, attack
        assert score.components["execution_match"] == 0.0
        assert score.components["executes"] == 0.0
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


def test_a_coincidental_match_is_rejected_by_the_variant_databases(bundled: Text2SqlDataset, scorer: Scorer) -> None:
    """A query that hard-codes the primary database's answer matches there, and nowhere else."""
    example = first(bundled, lambda e: e.gold_sql.startswith("SELECT COUNT(*) FROM") and "WHERE" in e.gold_sql)
    answer = scorer.gold_results(example)[0].rows[0][0]
    assert any(v.rows[0][0] != answer for v in scorer.gold_results(example)[1:])
    hard_coded = f"SELECT {answer};"
    primary_only = RewardSpec(components=(ExecutionMatch(databases="primary"),))
    all_databases = RewardSpec(components=(ExecutionMatch(databases="all"),))
    assert scorer.score(example, hard_coded, primary_only).reward == 1.0
    assert scorer.score(example, hard_coded, all_databases).reward == 0.0
    assert scorer.score(example, f"{example.gold_sql};", all_databases).reward == 1.0


def test_scoring_many_at_once_equals_scoring_one_by_one(bundled: Text2SqlDataset, scorer: Scorer) -> None:
    items = [(e, f"{e.gold_sql};") for e in bundled.split("dev")[:20]]
    items += [(e, "SELECT 1;") for e in bundled.split("dev")[:20]]
    batched = scorer.score_many(items, EVERYTHING)
    assert batched == [scorer.score(e, c, EVERYTHING) for e, c in items]
    assert sum(s.correct for s in batched) == 20
