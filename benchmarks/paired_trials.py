"""Finished trials' evaluations compared answer by answer, without sampling anything again.

Run: python -m benchmarks.paired_trials [NAME=]RUN_DIR[@STEP] [NAME=]RUN_DIR[@STEP] ...

Each argument is one evaluation a trial logged (its `evals.jsonl`): the run directory's evaluation at RL step STEP,
the last one without `@STEP`. Trials of the same eval split, size and seed evaluate the same questions, so two of
them compare question by question, whatever else differs (mode, reward, base model): `single=RUN@20 agentic=RUN@20`
says whether an agentic trial beat a single-turn one, `@0` is the model before RL in that trial's mode. Every
evaluation is compared with the first (McNemar's exact test), on all questions and on seen and unseen question forms
apart where the data says; the last line is the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from autoresearch.trials.paired import compare, compare_by_form
from autoresearch.trials.run_dir import RunDirectory
from benchmarks import command_line
from tasks.report import FORMS, HeldOutReport


class EvaluationNotFoundError(Exception):
    """An argument names a run or step with no evaluation; the message says what the run has."""


@dataclass(frozen=True)
class LoggedEvaluation:
    """One evaluation a trial logged, under the name the table shows."""

    name: str
    report: HeldOutReport
    # The trial's run directory it was read from.
    run_dir: Path


def parse_reference(argument: str) -> tuple[str | None, Path, int | None]:
    """`[NAME=]RUN_DIR[@STEP]` as its name, run directory and step (None: not given)."""
    name, _, rest = argument.rpartition("=") if "=" in argument else (None, "", argument)
    path, at, step = rest.rpartition("@")
    if not at:
        return name or None, Path(rest), None
    if not step.isdigit():
        raise EvaluationNotFoundError(f"{argument}: the step after '@' must be a whole number, not {step!r}")
    return name or None, Path(path), int(step)


def load_evaluation(argument: str) -> LoggedEvaluation:
    """The evaluation `argument` names.

    Raises:
        EvaluationNotFoundError: no such run, a run without evaluations, or no evaluation at the step asked for.
    """
    name, path, step = parse_reference(argument)
    directory = RunDirectory(path)
    if not directory.evals.path.exists():
        raise EvaluationNotFoundError(f"{path}: no trial's evaluations here ({directory.evals.path.name} is missing)")
    try:
        reports = [HeldOutReport.model_validate(record) for record in directory.evals.read()]
    except (ValidationError, json.JSONDecodeError) as error:
        raise EvaluationNotFoundError(f"{directory.evals.path} is unreadable: {error}") from None
    if not reports:
        raise EvaluationNotFoundError(f"{path}: the trial has not evaluated anything yet")
    by_step = {report.step: report for report in reports}
    chosen = reports[-1] if step is None else by_step.get(step)
    if chosen is None:
        raise EvaluationNotFoundError(f"{path}: no evaluation at step {step}; it evaluated at steps {sorted(by_step)}")
    return LoggedEvaluation(name or f"{path.name}@{chosen.step}", chosen, path)


def comparison_table(evaluations: list[LoggedEvaluation]) -> tuple[Table, dict[str, dict]]:
    """Each evaluation against the first, overall and by form, as a table and as records.

    Raises:
        ValueError: an evaluation is not of the first one's questions.
    """
    reference = evaluations[0]
    forms = [form for form in FORMS if reference.report.accuracy_by_form.get(form) is not None]
    table = Table(title=f"{len(reference.report.answers)} {reference.report.split} questions, against {reference.name}")
    table.add_column("evaluation")
    columns = ["all", *(f"{form} form ({reference.report.counts_by_form(form)[1]})" for form in forms)]
    for column in columns:
        table.add_column(column, justify="right")
        table.add_column("gained/lost, p", justify="right")
    records: dict[str, dict] = {}
    for evaluation in evaluations:
        try:
            overall = compare(reference.report, evaluation.report)
        except ValueError:
            raise ValueError(
                f"{evaluation.name} did not evaluate {reference.name}'s questions: compare trials of the same "
                "eval_split, eval_size and eval_seed"
            ) from None
        by_form = compare_by_form(reference.report, evaluation.report)
        cells = [evaluation.name]
        for paired in (overall, *(by_form[form] for form in forms)):
            cells += [f"{paired.accuracy_after:.1%}", "" if evaluation is reference else paired.summary()]
        table.add_row(*cells)
        records[evaluation.name] = {
            "step": evaluation.report.step,
            "all": overall.model_dump(),
            **{form: by_form[form].model_dump() for form in forms},
        }
    return table, records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("evaluations", nargs="+", metavar="[NAME=]RUN_DIR[@STEP]", help="the first is the reference")
    args = parser.parse_args(argv)
    console = Console(width=140)
    try:
        evaluations = [load_evaluation(argument) for argument in args.evaluations]
        table, records = comparison_table(evaluations)
    except (EvaluationNotFoundError, ValueError) as error:
        console.print(f"[red]error:[/red] {error}")
        return 2
    console.print(table)
    console.print(json.dumps(records), soft_wrap=True)
    console.print(command_line("benchmarks.paired_trials", argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
