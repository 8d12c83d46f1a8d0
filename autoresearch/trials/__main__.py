"""`python -m autoresearch.trials <config.yaml>`: run one RL trial by hand, or resume it with the same run id.

`--baseline` scores the untrained base model on the config's held-out subset instead (the number a trial has to beat).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from autoresearch.errors import TrialError
from autoresearch.sdk_logging import quiet_sdk_logs
from autoresearch.trials.backend import backend_for
from autoresearch.trials.config import field_change, load_trial_config, parse_trial_config
from autoresearch.trials.evaluation import evaluate_checkpoint
from autoresearch.trials.rl_loop import DEFAULT_RUN_DIR, run_trial
from tasks.errors import TaskError

# Click's plain help, not rich's: rich's option table cuts long flag names at 80 columns (issue 41).
app = typer.Typer(add_completion=False, help=__doc__, rich_markup_mode=None)


@app.command()
def trial(
    config: Annotated[Path, typer.Argument(help="trial config (YAML), e.g. experiments/trials/text2sql_tiny.yaml")],
    backend_url: Annotated[
        str | None, typer.Option(help="Tinker backend; default $TINKER_BASE_URL, else a local one is started")
    ] = None,
    run_dir: Annotated[Path, typer.Option(help="runs live in <run-dir>/<run_id>/")] = DEFAULT_RUN_DIR,
    run_id: Annotated[str | None, typer.Option(help="overrides the config's run_id; an existing run resumes")] = None,
    progress: Annotated[bool, typer.Option(help="live progress bar (else log lines)")] = True,
    baseline: Annotated[bool, typer.Option(help="only score the base model on the held-out subset")] = False,
    set_fields: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="FIELD=VALUE (repeatable): a config field changed for this run, the value read as YAML, e.g. "
            '--set eval_size=400 --set "data={source: spider, path: $SPIDER_RELEASE}"',
        ),
    ] = None,
) -> None:
    """Train a LoRA adapter with RL on the config's task and report its held-out accuracy."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    quiet_sdk_logs()
    trial_config = load_trial_config(config)
    changes = dict(field_change(text) for text in set_fields or [])
    if run_id is not None:
        changes["run_id"] = run_id
    if changes:
        trial_config = parse_trial_config({**trial_config.model_dump(), **changes}, f"{config} with --set/--run-id")
    if baseline:
        with backend_for(trial_config.base_model, backend_url, run_dir / "baseline-backend") as url:
            report = evaluate_checkpoint(trial_config, url)
        typer.echo(
            f"baseline {trial_config.base_model} on {report.split} ({len(report.answers)} questions): "
            f"held-out accuracy {report.accuracy:.3f} ({_breakdown(report.accuracy_by_difficulty)})"
            + (f"; by form: {_breakdown(report.accuracy_by_form)}" if report.accuracy_by_form else "")
        )
        return
    result = run_trial(trial_config, backend_url=backend_url, run_dir=run_dir, progress=progress)
    typer.echo(
        f"run {result.run_id}: {result.steps_completed} steps, held-out accuracy {result.held_out_accuracy:.3f} "
        f"({_breakdown(result.held_out_by_difficulty)}){' (stopped early)' if result.stopped_early else ''}"
        + (f"; by form: {_breakdown(result.held_out_by_form)}" if result.held_out_by_form else "")
    )
    if result.backend_interruptions:
        typer.echo(
            f"the backend was interrupted {result.backend_interruptions} time(s); "
            "each time the run went on from its last checkpoint"
        )
    comparisons = {"": result.rl_comparison} if result.rl_comparison is not None else {}
    for form, rl in {**comparisons, **{f" {form}-form": c for form, c in result.rl_comparison_by_form.items()}}.items():
        typer.echo(
            f"RL: held-out{form} {rl.accuracy_before:.3f} -> {rl.accuracy_after:.3f} ({rl.gain:+.3f}) on "
            f"{rl.questions} questions; {rl.gained} gained, {rl.lost} lost, McNemar exact p = {rl.p_value:.3g}"
        )
    typer.echo(f"results in {result.run_dir}; sampler weights {result.sampler_path}")


def _breakdown(accuracies: dict[str, float | None]) -> str:
    return ", ".join(f"{d} {'-' if a is None else f'{a:.3f}'}" for d, a in accuracies.items())


def main() -> None:
    try:
        app(prog_name="python -m autoresearch.trials")
    except (TrialError, TaskError) as error:
        typer.echo(f"error: {error}", err=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
