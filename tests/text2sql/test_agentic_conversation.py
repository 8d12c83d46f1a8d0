"""The agentic episode as a conversation with a chat model, with a scripted policy: every query it writes is run in
the reward's sandbox and shown in the next user turn with what to do next, a query repeated or confirmed with
`Answer:` ends it, and its answer is always the last query it wrote."""

from __future__ import annotations

import pytest
from support.agentic import EPISODE_REWARD

from tasks.text2sql.agentic.conversation import FIX, LAST_REPLY, REVISE, parse_reply
from tasks.text2sql.agentic.turns import TurnKind, render_result
from tasks.text2sql.dataset import Example
from tasks.text2sql.task import Text2SqlTask


def test_each_query_is_run_and_shown_and_a_reply_without_one_accepts_the_last(
    text2sql: Text2SqlTask, flights: Example
) -> None:
    episode = text2sql.episode(flights, 3, chat=True)
    broken = episode.step("SELECT no_such_column FROM flights;")
    # A user turn of its own: the error, then what to do about it.
    assert broken is not None and broken.startswith("Error: ") and "no_such_column" in broken
    assert broken.endswith(f"\n\n{FIX}") and not episode.done
    fixed = episode.step(f"The column does not exist. Corrected:\n```sql\n{flights.gold_sql}\n```")
    assert fixed is not None and fixed.startswith("Result:\n") and fixed.endswith(f"\n\n{LAST_REPLY}")
    assert episode.step("This result answers the question.") is None
    assert episode.done and episode.answer == flights.gold_sql
    assert [t.parsed.kind for t in episode.turns] == [TurnKind.EXPLORE, TurnKind.EXPLORE, TurnKind.MALFORMED]

    [score] = text2sql.score_episodes([episode], EPISODE_REWARD)
    assert score.correct
    assert score.components["unanswered"] == 0.0 and score.components["failed_exploration"] == pytest.approx(-0.2)


def test_a_result_is_shown_as_the_plain_episode_shows_it_with_the_next_step_after_it(
    text2sql: Text2SqlTask, flights: Example
) -> None:
    episode = text2sql.episode(flights, 4, chat=True)
    shown = episode.step("SELECT COUNT(*) AS n FROM flights;")
    result = text2sql.scorer.sandbox.execute(episode.db_path, "SELECT COUNT(*) AS n FROM flights")
    assert shown == f"{render_result(result, episode.limits.observation)}\n\n{REVISE}"


def test_answer_or_the_same_query_again_confirms_it(text2sql: Text2SqlTask, flights: Example) -> None:
    answered = text2sql.episode(flights, 3, chat=True)
    assert answered.step(f"{flights.gold_sql};") is not None
    assert answered.step(f"Answer: {flights.gold_sql};") is None
    assert answered.done and answered.answer == flights.gold_sql and answered.facts().turns == 2

    repeated = text2sql.episode(flights, 3, chat=True)
    assert repeated.step(f"{flights.gold_sql};") is not None
    assert repeated.step(f"```sql\n{'  '.join(flights.gold_sql.split())}\n```") is None
    assert repeated.turns[-1].parsed.kind is TurnKind.ANSWER and repeated.answer == flights.gold_sql


def test_the_last_query_answers_when_the_replies_run_out(text2sql: Text2SqlTask, flights: Example) -> None:
    episode = text2sql.episode(flights, 2, chat=True)
    assert episode.step("SELECT COUNT(*) FROM flights;") is not None
    assert episode.step(f"{flights.gold_sql};") is None
    assert episode.done and episode.answer == flights.gold_sql
    [score] = text2sql.score_episodes([episode], EPISODE_REWARD)
    assert score.correct and score.components["unanswered"] == 0.0


def test_a_conversation_without_any_query_is_unanswered(text2sql: Text2SqlTask, flights: Example) -> None:
    episode = text2sql.episode(flights, 3, chat=True)
    assert episode.step("I cannot answer this question.") is None
    assert episode.done and episode.answer is None and episode.final_completion() == ""
    [score] = text2sql.score_episodes([episode], EPISODE_REWARD)
    assert score.components["unanswered"] == -1.0


@pytest.mark.parametrize(
    ("reply", "kind", "sql"),
    [
        ("SELECT a FROM t;", TurnKind.EXPLORE, "SELECT a FROM t"),
        ("```sql\nSELECT a\nFROM t\n```", TurnKind.EXPLORE, "SELECT a\nFROM t"),
        ("Here is the query:\nWITH x AS (SELECT 1) TABLE x;", TurnKind.EXPLORE, "WITH x AS (SELECT 1) TABLE x"),
        ("Explore: SELECT a FROM t;", TurnKind.EXPLORE, "SELECT a FROM t"),
        ("Answer: SELECT a FROM t;", TurnKind.ANSWER, "SELECT a FROM t"),
        ("The result is right.\nAnswer:\n```sql\nSELECT a FROM t\n```", TurnKind.ANSWER, "SELECT a FROM t"),
        ("Answer: the query above is right.", TurnKind.MALFORMED, ""),
        ("The result looks right to me.", TurnKind.MALFORMED, ""),
    ],
)
def test_a_reply_is_read_for_its_query_whatever_surrounds_it(reply: str, kind: TurnKind, sql: str) -> None:
    parsed = parse_reply(reply)
    assert (parsed.kind, parsed.sql) == (kind, sql)


def test_the_chat_prompt_is_the_single_turn_prompt_after_the_solved_conversations(
    text2sql: Text2SqlTask, flights: Example
) -> None:
    shots = text2sql.few_shot_examples(1, "train")
    prompt = text2sql.prompt(flights, shots, 3, chat=True)
    # The first reply is the model's one-turn answer; the loop is explained with the first result (REVISE, FIX).
    assert prompt.startswith("Solved example:\n")
    assert prompt.endswith(text2sql.prompt(flights, (), 1))
    assert "`Result:`" not in prompt.split("Solved example:")[0]
    # The solved example shows its query's real result as the conversation would.
    [shot] = shots
    shown = text2sql.episode(shot, 3, chat=True).step(f"{shot.gold_sql};")
    assert shown is not None
    result = shown.split("\n\n")[0]
    assert f"Question: {shot.question}\nYou: {shot.gold_sql};\nMe: {result}\nYou: Answer: {shot.gold_sql};" in prompt
    # The plain agentic prompt is another one.
    assert "exploratory queries" in text2sql.prompt(flights, shots, 3) and "exploratory queries" not in prompt
