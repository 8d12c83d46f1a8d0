"""Reward components written as code: the static check, the sandboxed worker, the gate on the probe batch, and a
component loaded by hash in a reward spec. Real worker processes, real DuckDB, the bundled data; nothing mocked."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from optuna.artifacts import FileSystemArtifactStore

from tasks.reward_code.admission import admit
from tasks.reward_code.errors import RewardCodeError, StaticCheckError
from tasks.reward_code.loading import CodeReference, sha256_of
from tasks.reward_code.sandbox import CodeLimits, CodeSandbox
from tasks.reward_code.static_check import check_source
from tasks.text2sql.reward.rewards import DEFAULT_REWARD_SPEC
from tasks.text2sql.task import Text2SqlTask

# Short limits keep a function that loops from holding a test for long.
FAST = CodeLimits(cpu_s=1, wall_s=0.5)

PARTIAL_CREDIT = '''import math

def reward(completion, example, execution):
    """Jaccard overlap of the result's rows with the gold rows; -1 for SQL that does not run."""
    if execution["status"] != "ok":
        return -1.0
    gold = set(map(tuple, execution["gold_rows"]))
    got = set(map(tuple, execution["rows"]))
    return len(gold & got) / max(1, len(gold | got))
'''
# Each way reward code can go wrong, and what its refusal must say.
HOSTILE = {
    "an infinite loop": (
        "def reward(completion, example, execution):\n    while True:\n        pass\n",
        "sandbox",
        "ran past the wall-clock limit of 0.5 s",
    ),
    "import os": (
        "import os\n\ndef reward(completion, example, execution):\n    return float(len(os.listdir('/')))\n",
        "static check",
        "line 1: importing 'os' is not allowed; reward code may import only math, re",
    ),
    "a 10 GB allocation": (
        "def reward(completion, example, execution):\n    block = 'x' * (10 * 2**30)\n    return 0.0\n",
        "sandbox",
        "MemoryError: needed more than the 256 MiB memory cap",
    ),
    "reading a file": (
        "def reward(completion, example, execution):\n    return float(len(open('/etc/passwd').read()))\n",
        "static check",
        "line 2: 'open' is not allowed in reward code",
    ),
    "ranking wrong above right": (
        "def reward(completion, example, execution):\n    return 0.0 if execution['correct'] else 1.0\n",
        "gate",
        "it does not rank right SQL above wrong: mean 0.000 on 8 right answers, 1.000 on 16 known-wrong ones",
    ),
}


@pytest.fixture(scope="module")
def task() -> Iterator[Text2SqlTask]:
    with Text2SqlTask.bundled() as opened:
        yield opened


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("from os import path\ndef reward(c, e, x):\n    return 0.0\n", "importing 'os' is not allowed"),
        ("def reward(c, e, x):\n    return len(().__class__.__subclasses__())\n", "'__subclasses__' is not allowed"),
        ("def reward(c, e, x):\n    return eval('1')\n", "'eval' is not allowed"),
        ("def reward(c, e, x):\n    return getattr(c, 'upper')\n", "'getattr' is not allowed"),
        ("def reward(c, e, x):\n    return __import__('os')\n", "'__import__' is not allowed"),
        ("def reward(c, e, x):\n    return (i for i in c).gi_frame\n", "'gi_frame' is not allowed"),
        ("def reward(c, e, x):\n    return '{0.__class__}'.format(c)\n", "'format' is not allowed"),
        ("class R:\n    pass\ndef reward(c, e, x):\n    return 0.0\n", "ClassDef is not allowed"),
        ("def reward(c, e, x):\n    with c:\n        return 0.0\n", "With is not allowed"),
        ("def score(c, e, x):\n    return 0.0\n", "no top-level 'def reward(completion, example, execution)'"),
        ("def reward(c, e):\n    return 0.0\n", "must take exactly 3 positional parameters"),
        ("def reward(c, e, x):\n    return 0.0 +\n", "not valid Python"),
    ],
)
def test_the_static_check_refuses_what_reward_code_may_not_say(source: str, reason: str) -> None:
    with pytest.raises(StaticCheckError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        check_source(source)


def test_the_sandbox_alone_stops_what_the_static_check_would_miss() -> None:
    """Run without the static check: the worker has no open, no __import__ beyond math and re, and its modules are
    stand-ins without submodules, so none of these reaches a file."""
    calls = [["", {}, {}]]
    sources = {
        "def reward(c, e, x):\n    return float(len(open('/etc/passwd').read()))\n": "NameError: name 'open'",
        "def reward(c, e, x):\n    return float(len(__import__('os').listdir('/')))\n": "ImportError: only math, re",
        "import re\ndef reward(c, e, x):\n    return float(len(re.enum.sys.modules))\n": "has no attribute 'enum'",
    }
    for source, error in sources.items():
        with CodeSandbox(source, FAST) as sandbox:
            (outcome,) = sandbox.call_many(calls)
        assert outcome.value is None and error in outcome.error


def test_a_call_that_ends_its_worker_is_an_error_and_the_next_call_gets_a_new_worker() -> None:
    source = "def reward(c, e, x):\n    if x['loop']:\n        while True:\n            pass\n    return 0.25\n"
    with CodeSandbox(source, FAST) as sandbox:
        outcomes = sandbox.call_many([["", {}, {"loop": True}], ["", {}, {"loop": False}]])
    assert outcomes[0].error == "ran past the wall-clock limit of 0.5 s"
    assert outcomes[1].value == 0.25 and sandbox.replaced == 1


def test_a_call_past_its_cpu_time_is_ended_by_the_kernel_before_the_wall_clock_deadline() -> None:
    """RLIMIT_CPU, not the parent's deadline, ends a loop that spins: 1 s of CPU time (up to 2 s as the kernel
    counts whole seconds) against 30 s of wall-clock time."""
    source = "def reward(c, e, x):\n    while True:\n        pass\n"
    with CodeSandbox(source, CodeLimits(cpu_s=1, wall_s=30)) as sandbox:
        (outcome,) = sandbox.call_many([["", {}, {}]])
    assert outcome.error == "used more than its 1 s of CPU time"


def test_a_function_that_ranks_right_answers_above_wrong_ones_is_admitted_with_its_numbers(
    task: Text2SqlTask,
) -> None:
    verdict = admit(task, PARTIAL_CREDIT, FAST)
    assert verdict.accepted, verdict
    assert verdict.right_mean == 1.0 and verdict.wrong_mean is not None and verdict.wrong_mean < 0.5
    assert "on 8 right answers" in verdict.reason and "on 16 known-wrong ones" in verdict.reason


@pytest.mark.parametrize("case", list(HOSTILE))
def test_each_hostile_function_is_refused_with_the_reason(task: Text2SqlTask, case: str) -> None:
    source, stage, reason = HOSTILE[case]
    verdict = admit(task, source, FAST)
    assert not verdict.accepted
    assert verdict.stage == stage and reason in verdict.reason, verdict


def _stored(tmp_path: Path, source: str) -> CodeReference:
    store = tmp_path / "artifacts"
    store.mkdir()
    FileSystemArtifactStore(str(store)).write("reward-code", io.BytesIO(source.encode()))
    return CodeReference(artifact_store=str(store), artifact_id="reward-code", sha256=sha256_of(source))


def test_a_code_component_loaded_by_hash_adds_its_weighted_value_to_the_reward(
    task: Text2SqlTask, tmp_path: Path
) -> None:
    spec = Text2SqlTask.reward_spec_with_code(DEFAULT_REWARD_SPEC, _stored(tmp_path, PARTIAL_CREDIT), 0.5)
    example = task.split("train")[0]
    items = [(example, task.gold_completion(example)), (example, " SELECT 1 FROM nowhere;")]
    base = task.scorer.score_many(items, DEFAULT_REWARD_SPEC)
    with_code = task.scorer.score_many(items, spec)
    assert [s.components["code"] for s in with_code] == [0.5, -0.5]
    assert [s.reward - b.reward for s, b in zip(with_code, base, strict=True)] == [0.5, -0.5]


def test_code_whose_artifact_changed_after_it_was_admitted_is_not_run(task: Text2SqlTask, tmp_path: Path) -> None:
    source = "def reward(c, e, x):\n    return 1.0 if x['correct'] else 0.0\n"
    reference = _stored(tmp_path, source)
    (Path(reference.artifact_store) / reference.artifact_id).write_text(source.replace("1.0 if", "-1.0 if"))
    spec = Text2SqlTask.reward_spec_with_code(DEFAULT_REWARD_SPEC, reference, 0.5)
    example = task.split("train")[0]
    with pytest.raises(RewardCodeError, match=f"not the {reference.sha256} the reward spec names"):
        task.scorer.score_many([(example, task.gold_completion(example))], spec)
