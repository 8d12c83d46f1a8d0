"""Text-to-SQL through the task interface: what trials, the cookbook and the CLI see of it."""

from __future__ import annotations

import pytest

from tasks.errors import SplitError, TaskError, UnknownTaskError
from tasks.registry import open_task
from tasks.text2sql.dataset import Difficulty
from tasks.text2sql.reward.rewards import DEFAULT_REWARD_SPEC, RewardSpec
from tasks.text2sql.reward.scoring import Scorer
from tasks.text2sql.task import Text2SqlTask


def test_a_group_is_scored_as_the_scorer_scores_each_completion(text2sql: Text2SqlTask, scorer: Scorer) -> None:
    example = text2sql.split("dev")[0]
    spec = RewardSpec.parse({"components": [{"kind": "execution_match"}, {"kind": "format", "weight": 0.1}]})
    completions = [f"{example.gold_sql};", "SELECT 1;", "not sql", f"{example.gold_sql}; and more"]
    scores = text2sql.score_group(example, completions, spec)
    assert scores == [scorer.score(example, c, spec) for c in completions]
    assert [s.correct for s in scores] == [True, False, False, True]


def test_held_out_answers_are_judged_by_execution_on_every_variant(text2sql: Text2SqlTask) -> None:
    examples = text2sql.split("dev")[:6]
    completions = [f"{e.gold_sql};" if i % 2 == 0 else "SELECT 0;" for i, e in enumerate(examples)]
    episodes = [text2sql.one_step(e, c) for e, c in zip(examples, completions, strict=True)]
    assert text2sql.judge_episodes(episodes) == [True, False] * 3
    report = text2sql.report("dev", episodes, step=7)
    assert (report.step, report.split, report.accuracy) == (7, "dev", 0.5)
    assert list(report.accuracy_by_difficulty) == list(Difficulty)
    for difficulty in Difficulty:
        correct, total = report.counts(difficulty)
        expected = None if total == 0 else correct / total
        assert report.accuracy_by_difficulty[difficulty] == expected
    assert [a.example_id for a in report.answers] == [e.id for e in examples]


def test_a_prompt_shows_its_shots_answered_as_the_gold_completion_answers(text2sql: Text2SqlTask) -> None:
    example = text2sql.split("dev")[0]
    shots = text2sql.few_shot_examples(2, "train")
    prompt = text2sql.prompt(example, shots)
    for shot in shots:
        assert f"Question: {shot.question}\nSQL:{text2sql.gold_completion(shot)}" in prompt
    assert prompt.endswith(f"Question: {example.question}\nSQL:")


def test_the_held_out_subset_is_seeded_and_bounded(text2sql: Text2SqlTask) -> None:
    subset = text2sql.held_out_subset("dev", 10, seed=3)
    assert subset == text2sql.held_out_subset("dev", 10, seed=3)
    dev = text2sql.split("dev")
    assert [dev.index(e) for e in subset] == sorted(dev.index(e) for e in subset)
    with pytest.raises(SplitError, match="11000 examples asked of split 'dev', which has 332"):
        text2sql.held_out_subset("dev", 11_000, seed=3)
    with pytest.raises(SplitError, match=r"no split 'validation'.*\['dev', 'test', 'train'\]"):
        text2sql.split("validation")


def test_the_registry_opens_tasks_by_name_and_names_the_ones_it_has() -> None:
    with open_task("text2sql") as task:
        assert isinstance(task, Text2SqlTask) and set(task.split_names) == {"train", "dev", "test"}
        example = task.split("dev")[0]
        assert task.judge_episodes([task.one_step(example, f"{example.gold_sql};")]) == [True]
        assert task.score_episodes([task.one_step(example, "SELECT")], DEFAULT_REWARD_SPEC)[0].reward == 0.0
    with pytest.raises(UnknownTaskError, match="no task 'chess'; tasks: text2sql") as error:
        open_task("chess")
    assert isinstance(error.value, TaskError)
