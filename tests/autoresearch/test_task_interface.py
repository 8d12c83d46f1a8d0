"""A trial reaches its task through `tasks.interface` alone: a second task, registered by name, trains and is
evaluated by the trial's own loop on the tiny model, with no text-to-SQL code involved; its config's reward spec is
the task's own."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from autoresearch.errors import ConfigurationError
from autoresearch.trials.config import TrialConfig, parse_trial_config
from autoresearch.trials.rl_loop import run_trial
from autoresearch.trials.run_dir import RunDirectory
from tasks import registry
from tasks.errors import SplitError, TaskError
from tasks.interface import Episode, Task

WORDS = ("apple", "river", "stone", "cloud", "tiger", "maple", "ocean", "piano", "lemon", "ember", "frost", "grape")


@dataclass(frozen=True)
class Word:
    id: str
    word: str
    difficulty: str
    form: str | None = None


@dataclass(frozen=True)
class EchoScore:
    reward: float
    correct: bool
    components: dict[str, float]


class EchoReward(BaseModel):
    """What an exact repeat of the word earns; nothing else earns anything."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    exact: float = 1.0


class EchoData(BaseModel):
    """Echo has one data set, its own words."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class EchoTask(Task[Word, EchoReward]):
    """Repeat a word: a task as small as a task can be, standing in for any task that is not text-to-SQL."""

    name = "echo"
    reward_spec_type = EchoReward
    data_source_type = EchoData
    default_reward_spec = EchoReward()
    base_reward_component = "exact"
    optional_reward_components = ()
    description = "The task is to repeat a word."

    @classmethod
    def reward_spec_from_weights(cls, weights: Mapping[str, float]) -> EchoReward:
        if weights:
            raise TaskError(f"echo's reward has no optional components, got {sorted(weights)}")
        return EchoReward()

    def __init__(self) -> None:
        words = [Word(f"w{i}", word, "short" if len(word) <= 5 else "long") for i, word in enumerate(WORDS)]
        self.splits = {"train": tuple(words[:8]), "dev": tuple(words[8:])}
        self.scored: list[tuple[str, str]] = []
        self.judged: list[tuple[str, str]] = []
        self.closed = False

    @property
    def split_names(self) -> tuple[str, ...]:
        return tuple(self.splits)

    @property
    def difficulty_levels(self) -> tuple[str, ...]:
        return ("short", "long")

    def split(self, name: str) -> tuple[Word, ...]:
        if name not in self.splits:
            raise SplitError(f"no split {name!r}")
        return self.splits[name]

    def few_shot_examples(self, count: int, split: str) -> tuple[Word, ...]:
        return self.split(split)[:count]

    def prompt(self, example: Word, shots: Sequence[Word] = (), max_turns: int = 1, chat: bool = False) -> str:
        solved = "".join(f"Repeat: {shot.word}\nAnswer:{self.gold_completion(shot)}\n" for shot in shots)
        return f"{solved}Repeat: {example.word}\nAnswer:"

    def gold_completion(self, example: Word, max_turns: int = 1) -> str:
        return f" {example.word};"

    def score_episodes(self, episodes_B: Sequence[Episode], reward_spec: EchoReward) -> list[EchoScore]:
        items_B = [(e.example, e.transcript()) for e in episodes_B]
        self.scored += [(e.id, c) for e, c in items_B]
        marks = [c.strip().rstrip(";").strip() == e.word for e, c in items_B]
        return [EchoScore(reward_spec.exact * m, m, {"exact": reward_spec.exact * m}) for m in marks]

    def judge_episodes(self, episodes_B: Sequence[Episode]) -> list[bool]:
        items_B = [(e.example, e.transcript()) for e in episodes_B]
        self.judged += [(e.id, c) for e, c in items_B]
        return [c.strip().rstrip(";").strip() == e.word for e, c in items_B]

    def close(self) -> None:
        self.closed = True


def test_a_second_task_trains_and_is_evaluated_through_the_interface_alone(
    backend_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[EchoTask] = []

    def open_echo(source: EchoData) -> EchoTask:
        assert source == EchoData()
        opened.append(EchoTask())
        return opened[-1]

    monkeypatch.setitem(registry.TASKS, "echo", registry.RegisteredTask(EchoTask, open_echo))
    monkeypatch.delitem(registry.TASKS, "text2sql")  # nothing of text-to-SQL may be opened
    config = TrialConfig(
        run_id="echo",
        task="echo",
        base_model="tiny-gemma3",
        lora_rank=4,
        batch_size=2,
        group_size=2,
        max_tokens=6,
        steps=2,
        warmup_steps=1,
        warmup_batch_size=3,
        few_shot=1,
        eval_size=3,
        eval_interval=1,
        checkpoint_interval=2,
    )
    result = run_trial(config, backend_url, tmp_path, progress=False)

    [task] = opened
    assert task.closed
    assert result.steps_completed == 2 and set(result.held_out_by_difficulty) == {"short", "long"}
    train_ids = {w.id for w in task.splits["train"]} - {"w0"}  # w0 is the prompts' solved example
    dev_ids = {w.id for w in task.splits["dev"]}
    # Every sampled completion of the 2 RL steps was scored by the task, on training questions only...
    assert len(task.scored) == 2 * config.batch_size * config.group_size
    assert {example_id for example_id, _ in task.scored} <= train_ids
    # ...and the held-out subset was judged by it where RL started and after each step, on dev questions only.
    assert len(task.judged) == 3 * config.eval_size
    assert {example_id for example_id, _ in task.judged} <= dev_ids
    evals = RunDirectory(tmp_path / "echo").evals.read()
    assert [e["step"] for e in evals] == [0, 1, 2]
    assert [a["completion"] for a in evals[-1]["answers"]] == [c for _, c in task.judged[-config.eval_size :]]
    assert result.held_out_accuracy == evals[-1]["accuracy"]


def test_a_trial_configs_reward_spec_is_its_tasks_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry.TASKS, "echo", registry.RegisteredTask(EchoTask, lambda _: EchoTask()))
    assert TrialConfig(task="echo").reward_spec == EchoReward()
    config = parse_trial_config({"task": "echo", "reward_spec": {"exact": 2.0}})
    assert config.reward_spec == EchoReward(exact=2.0)
    assert parse_trial_config(config.model_dump(mode="json")) == config
    text2sql_reward = TrialConfig().model_dump(mode="json")["reward_spec"]
    refused = r"reward_spec\.components: unknown field; reward component kinds: exact"
    with pytest.raises(ConfigurationError, match=refused):
        parse_trial_config({"task": "echo", "reward_spec": text2sql_reward})


def test_a_single_turn_episode_takes_one_step_and_a_task_without_longer_ones_refuses_them() -> None:
    task = EchoTask()
    word = task.split("dev")[0]
    episode = task.one_step(word, f" {word.word};")
    assert episode.done and episode.transcript() == f" {word.word};"
    assert task.judge_episodes([episode]) == [True]
    with pytest.raises(TaskError, match="it takes one turn"):
        episode.step(" again;")
    with pytest.raises(TaskError, match="task 'echo' has no episodes of several turns"):
        task.episode(word, max_turns=3)
