"""The agentic environment with a scripted policy: explorations run in the reward's sandbox and are shown as
small tables or errors, the episode ends at an answer, a malformed turn or the turn limit, and the reward weighs
the answer with how the episode went."""

from __future__ import annotations

import os
import re

import pytest
from support.agentic import EPISODE_REWARD
from support.commands import run_command

from tasks.text2sql.agentic.episode import LAST_TURN_CUE, Episode, EpisodeLimits
from tasks.text2sql.agentic.turns import ObservationLimits, TurnKind, parse_turn, render_result
from tasks.text2sql.dataset import Example
from tasks.text2sql.errors import Text2SqlError
from tasks.text2sql.prompts import tables_used
from tasks.text2sql.reward.scoring import Scorer
from tasks.text2sql.sql.sandbox import ExecutionResult, ExecutionStatus, SandboxLimits, SqlSandbox
from tasks.text2sql.task import Text2SqlTask


def test_a_policy_that_explores_then_answers_reads_the_data_and_gets_its_reward(
    text2sql: Text2SqlTask, flights: Example
) -> None:
    episode = text2sql.episode(flights, 4)
    seen = episode.step("Explore: SELECT distance_km, duration_minutes FROM flights ORDER BY distance_km DESC;")
    assert seen is not None and seen.startswith("\nResult:\ndistance_km | duration_minutes\n")
    # Five rows shown of the 50 fetched, and a count of the rest.
    assert seen.count("\n") == 1 + 1 + 5 + 1 + 1 and "(more than 45 more rows)" in seen
    assert not episode.done
    assert episode.step(f"Answer: {flights.gold_sql};") is None
    assert episode.done and episode.answer == flights.gold_sql
    assert [t.parsed.kind for t in episode.turns] == [TurnKind.EXPLORE, TurnKind.ANSWER]
    assert episode.transcript().startswith("Explore: SELECT distance_km") and episode.transcript().endswith(";")

    [score] = text2sql.score_episodes([episode], EPISODE_REWARD)
    assert score.correct
    assert score.components == pytest.approx(
        {"execution_match": 1.0, "executes": 0.1, "turn_penalty": -0.05, "failed_exploration": 0.0, "unanswered": 0.0}
    )
    assert score.reward == pytest.approx(1.05)


def test_a_hostile_or_broken_exploration_is_shown_as_an_error_and_the_episode_goes_on(
    text2sql: Text2SqlTask, flights: Example
) -> None:
    episode = text2sql.episode(flights, 3)
    hostile = episode.step("Explore: SELECT * FROM read_csv('/etc/passwd');")
    assert hostile is not None and LAST_TURN_CUE not in hostile
    assert hostile is not None and hostile.startswith("\nError: ") and "root:" not in hostile
    assert episode.turns[-1].status is ExecutionStatus.BLOCKED
    broken = episode.step("Explore: SELECT no_such_column FROM flights;")
    assert broken is not None and "no_such_column" in broken and broken.startswith("\nError: ")
    assert broken.rstrip().endswith(LAST_TURN_CUE)  # the second turn of three: one turn is left
    assert episode.step(f"answer: {flights.gold_sql};") is None  # the keyword's case does not matter

    [score] = text2sql.score_episodes([episode], EPISODE_REWARD)
    assert score.correct
    assert score.components["failed_exploration"] == pytest.approx(-0.4)
    assert score.components["turn_penalty"] == pytest.approx(-0.1)


def test_a_policy_that_never_answers_ends_at_the_turn_limit_unanswered(
    text2sql: Text2SqlTask, flights: Example
) -> None:
    episode = text2sql.episode(flights, 3)
    assert episode.step("Explore: SELECT COUNT(*) FROM flights;") is not None
    assert episode.step("Explore: SELECT COUNT(*) FROM airlines;") is not None
    assert episode.step("Explore: SELECT COUNT(*) FROM airports;") is None
    assert episode.done and episode.answer is None and episode.final_completion() == ""
    with pytest.raises(Text2SqlError, match="is over"):
        episode.step(f"Answer: {flights.gold_sql};")

    [score] = text2sql.score_episodes([episode], EPISODE_REWARD)
    assert not score.correct
    # No answer: nothing executes or matches; -1 for not answering and 2 exploratory turns at 0.05.
    assert score.reward == pytest.approx(-1.0 - 0.1)


@pytest.mark.parametrize("turn", ["The answer is 42.", "Explore:", "SQL: SELECT 1;", ""])
def test_a_malformed_turn_ends_the_episode_unanswered(text2sql: Text2SqlTask, flights: Example, turn: str) -> None:
    episode = text2sql.episode(flights, 4)
    assert episode.step(turn) is None
    assert episode.done and episode.answer is None
    [score] = text2sql.score_episodes([episode], EPISODE_REWARD)
    assert score.components["unanswered"] == -1.0 and score.components["turn_penalty"] == 0.0


def test_unfinished_episodes_are_not_scored(text2sql: Text2SqlTask, flights: Example) -> None:
    episode = text2sql.episode(flights, 4)
    with pytest.raises(Text2SqlError, match="only finished episodes"):
        text2sql.score_episodes([episode], EPISODE_REWARD)


def test_the_sandbox_time_limit_holds_for_each_exploration(text2sql: Text2SqlTask, flights: Example) -> None:
    db_path = text2sql.dataset.database(flights.db_id).path
    with SqlSandbox(SandboxLimits(timeout_s=0.2)) as sandbox:
        episode = Episode(flights, db_path, sandbox, EpisodeLimits(max_turns=4))
        slow = "SELECT COUNT(*) FROM bookings a, bookings b, bookings c"
        for _ in range(2):
            seen = episode.step(f"Explore: {slow};")
            assert seen is not None and seen.startswith("\nError: ")
            assert episode.turns[-1].status is ExecutionStatus.TIMED_OUT
        assert episode.step(f"Answer: {flights.gold_sql};") is None
    assert all(t.status is not ExecutionStatus.OK for t in episode.turns[:2])
    assert episode.facts().failed_explorations == 2 and episode.facts().answered


def test_turns_are_parsed_by_their_keyword_and_cut_at_the_statement() -> None:
    assert parse_turn("Explore: SELECT 1; Answer: SELECT 2;").sql == "SELECT 1"
    assert parse_turn(" Answer:SELECT name FROM t;").kind is TurnKind.ANSWER
    assert parse_turn("explore:\n SELECT a\n FROM t").sql == "SELECT a\n FROM t"
    assert parse_turn("Answering: SELECT 1;").kind is TurnKind.MALFORMED


def test_results_are_shown_short() -> None:
    limits = ObservationLimits(rows_shown=2, cell_chars=6)
    result = ExecutionResult(
        ExecutionStatus.OK, columns=("name", "note"), rows=(("a", None), ("b", "x" * 20), ("c", "y"))
    )
    assert render_result(result, limits) == "Result:\nname | note\na | NULL\nb | xxxxx…\n(1 more rows)"
    assert render_result(ExecutionResult(ExecutionStatus.OK, columns=("n",)), limits) == "Result:\nn\n(no rows)"
    error = ExecutionResult(ExecutionStatus.ERROR, error="Binder Error:\n  column x not found\n\nLINE 1: SELECT x\n ^")
    assert render_result(error, limits) == "Error: Binder Error: column x not found"


def test_single_turn_completions_have_no_episode_penalties(scorer: Scorer, flights: Example) -> None:
    score = scorer.score(flights, f"{flights.gold_sql};", EPISODE_REWARD)
    assert score.components["turn_penalty"] == 0.0 and score.components["unanswered"] == 0.0
    assert score.components["failed_exploration"] == 0.0 and score.reward == pytest.approx(1.1)


def test_the_prompt_demonstrates_an_exploration_as_the_policy_will_see_it(
    text2sql: Text2SqlTask, flights: Example
) -> None:
    shots = text2sql.few_shot_examples(2, "train")
    prompt = text2sql.prompt(flights, shots, 4)
    assert "up to 3 exploratory queries" in prompt
    assert prompt.endswith(f"Question: {flights.question}\n")
    for shot in shots:
        table = sorted(tables_used(shot.gold_sql))[0]
        seen = text2sql.episode(shot, 4).step(f"Explore: SELECT * FROM {table} LIMIT 3;")
        assert f"Explore: SELECT * FROM {table} LIMIT 3;{seen}Answer: {shot.gold_sql};" in prompt


def test_the_demo_plays_scripted_episodes() -> None:
    done = run_command("tasks.text2sql", "demo", "--agentic", timeout_s=300, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    assert "transcript: explores, then answers" in done.stdout and "Result:\nid | flight_number" in done.stdout
    assert "Error: read_csv() reads files" in done.stdout and LAST_TURN_CUE in done.stdout
    assert re.search(r"explores, then answers\s+│\s+1\.050\s+│\s+True", done.stdout), done.stdout[-2000:]
