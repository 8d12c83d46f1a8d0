"""benchmarks.paired_trials: trials' logged evaluations compared question by question, from their run directories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoresearch.trials.run_dir import RunDirectory
from benchmarks.paired_trials import EvaluationNotFoundError, comparison_table, load_evaluation, main
from tasks.report import HeldOutAnswer, HeldOutReport

LEVELS = ("easy", "hard")


def report(step: int, right: str, forms: str = "ssuu") -> HeldOutReport:
    """An evaluation of questions q0, q1, ...: `right` marks each 1 or 0, `forms` each seen (s) or unseen (u)."""
    answers = [
        HeldOutAnswer(
            example_id=f"q{i}",
            difficulty=LEVELS[i % 2],
            completion="SELECT 1",
            correct=mark == "1",
            form={"s": "seen", "u": "unseen"}[form],
        )
        for i, (mark, form) in enumerate(zip(right, forms, strict=True))
    ]
    return HeldOutReport.of(answers, "dev", LEVELS, step=step)


def logged_run(root: Path, *reports: HeldOutReport) -> Path:
    """A run directory whose evals.jsonl holds `reports`, as a trial writes it."""
    directory = RunDirectory(root)
    root.mkdir(parents=True)
    for each in reports:
        directory.evals.append(each.model_dump(mode="json"))
    return root


def test_each_evaluation_is_compared_with_the_first_overall_and_by_form(tmp_path: Path) -> None:
    single = logged_run(tmp_path / "single", report(0, "1000"), report(20, "1100"))
    agentic = logged_run(tmp_path / "agentic", report(0, "0000"), report(20, "0111"))
    evaluations = [load_evaluation(f"single={single}"), load_evaluation(str(agentic)), load_evaluation(f"{agentic}@0")]
    assert [e.name for e in evaluations] == ["single", "agentic@20", "agentic@0"]
    _, records = comparison_table(evaluations)
    # single@20 right on q0, q1; agentic@20 on q1, q2, q3: gained q2, q3 (both unseen), lost q0 (seen).
    after_rl = records["agentic@20"]
    assert (after_rl["all"]["gained"], after_rl["all"]["lost"], after_rl["all"]["accuracy_after"]) == (2, 1, 0.75)
    assert (after_rl["seen"]["gained"], after_rl["seen"]["lost"]) == (0, 1)
    assert (after_rl["unseen"]["gained"], after_rl["unseen"]["lost"], after_rl["unseen"]["accuracy_before"]) == (
        2,
        0,
        0.0,
    )
    assert records["agentic@0"]["all"]["lost"] == 2 and records["agentic@0"]["step"] == 0
    assert records["single"]["all"]["gained"] == records["single"]["all"]["lost"] == 0


def test_a_run_or_step_without_an_evaluation_is_named(tmp_path: Path) -> None:
    run = logged_run(tmp_path / "run", report(0, "1000"), report(10, "1100"))
    with pytest.raises(EvaluationNotFoundError, match=r"no evaluation at step 5; it evaluated at steps \[0, 10\]"):
        load_evaluation(f"{run}@5")
    with pytest.raises(EvaluationNotFoundError, match="must be a whole number, not 'last'"):
        load_evaluation(f"{run}@last")
    with pytest.raises(EvaluationNotFoundError, match="no trial's evaluations here"):
        load_evaluation(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "evals.jsonl").write_text("")
    with pytest.raises(EvaluationNotFoundError, match="has not evaluated anything yet"):
        load_evaluation(str(tmp_path / "empty"))


def test_other_questions_are_refused_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    four = logged_run(tmp_path / "four", report(0, "1000"))
    three = logged_run(tmp_path / "three", report(0, "100", forms="ssu"))
    assert main([str(four), f"short={three}"]) == 2
    assert "short did not evaluate four@0's questions" in capsys.readouterr().out


def test_the_command_prints_the_table_and_the_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = logged_run(tmp_path / "run", report(0, "1000"), report(20, "1110"))
    assert main([f"before={run}@0", f"after={run}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    figures = json.loads(next(line for line in lines if line.startswith("{")))
    assert figures["after"]["all"]["gained"] == 2 and figures["after"]["all"]["p_value"] == 0.5
    assert any("+2/−0, p=0.5" in line for line in lines)
