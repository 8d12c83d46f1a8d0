"""`python -m autoresearch <spec.yaml>`: run a study — an LLM (or Optuna's sampler) proposes, trials run
concurrently on the shared backend, results come back, and it iterates until the budget is spent."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import optuna
import typer
from rich.console import Console

from autoresearch.controller import Controller
from autoresearch.controller_state import open_controller_state
from autoresearch.device_share import device_use_by_trial
from autoresearch.errors import AutoresearchError
from autoresearch.executors import LocalExecutor, TrialExecutor
from autoresearch.proposer import LlmProposer
from autoresearch.reward_code import artifact_store_of
from autoresearch.sdk_logging import quiet_sdk_logs
from autoresearch.spec import StudySpec, load_study_spec
from autoresearch.stop_signal import SIGTERM_EXIT, StopSignal
from autoresearch.study import open_study
from autoresearch.trials.backend import api_key as trial_api_key
from autoresearch.trials.backend import backend_for
from autoresearch.view import StudyView, write_summary

# Click's plain help, not rich's: rich's option table cuts long flag names at 80 columns (issue 41).
app = typer.Typer(add_completion=False, help=__doc__, rich_markup_mode=None)
STOP = StopSignal()


@app.command()
def autoresearch(
    spec_path: Annotated[Path, typer.Argument(help="study spec (YAML), e.g. experiments/text2sql.yaml")],
    run_root: Annotated[Path, typer.Option(help="studies live in <run-root>/<study>/")] = Path("runs/autoresearch"),
    progress: Annotated[bool, typer.Option(help="live table of trials (else log lines)")] = True,
    poll_s: Annotated[float, typer.Option(help="seconds between looks at the running trials")] = 2.0,
) -> None:
    """Run (or resume) the study a spec describes, then print its summary and save its plots."""
    # A scheduler's stop (SIGTERM) unwinds like Ctrl-C, so the local backend is shut down; the trials, in their own
    # sessions, are left to be found again by the next run.
    STOP.install()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    quiet_sdk_logs()
    logging.getLogger("httpx").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    console = Console()
    try:
        spec = load_study_spec(spec_path)
        # An LLM of its own endpoint is checked now; the local backend's own is made once that backend answers.
        remote_llm = spec.llm is not None and not spec.llm.is_local
        proposer = LlmProposer(spec.llm) if remote_llm else None
    except AutoresearchError as error:
        console.print(f"[red]{error}[/red]")
        raise typer.Exit(2) from None
    if spec.llm is None:
        console.print("no LLM configured in the spec: Optuna's TPE sampler proposes every trial alone")
    run_root = run_root.resolve()
    folder = run_root / spec.study
    try:
        study = open_study(spec)
        with (
            _backends(spec, folder) as backend_urls,
            open_controller_state(spec.storage_url(), folder) as checkpointer,
            StudyView(progress, console, lambda: device_use_by_trial(backend_urls, trial_api_key())) as view,
        ):
            if spec.llm is not None and spec.llm.is_local:
                proposer = LlmProposer(spec.llm.served_by(backend_urls[0], spec.base_model), api_key=trial_api_key())
                console.print(
                    f"proposals: {spec.base_model} on the local backend's {backend_urls[0]}/v1 for "
                    f"{spec.llm.share:.0%} of the trials, Optuna's TPE sampler for the rest and for any the LLM "
                    "cannot serve"
                )
            executor = _executor(spec, folder, run_root)

            def on_tick(study: optuna.Study) -> None:
                STOP.raise_if_received()
                view.update(study)

            controller = Controller(spec, study, executor, proposer, backend_urls, on_tick=on_tick, poll_s=poll_s)
            controller.run(checkpointer)
    except AutoresearchError as error:
        console.print(f"[red]{error}[/red]")
        raise typer.Exit(1) from None
    summary = write_summary(study, folder / "summary", console)
    # The reward code the LLM wrote is shown by a dashboard given the study's artifact store.
    artifacts = f" --artifact-dir {artifact_store_of(spec)}" if spec.search_space.reward.code is not None else ""
    console.print(f"summary and plots: {summary.parent}; dashboard: optuna-dashboard {spec.storage}{artifacts}")


@contextmanager
def _backends(spec: StudySpec, folder: Path) -> Iterator[tuple[str, ...]]:
    """The spec's backend URLs, or the URL of a local backend started for this run and stopped after it."""
    if spec.backend_urls:
        yield spec.backend_urls
        return
    with backend_for(spec.base_model, None, folder / "backend") as url:
        yield (url,)


def _executor(spec: StudySpec, folder: Path, run_root: Path) -> TrialExecutor:
    if spec.executor.kind == "local":
        return LocalExecutor(folder / "trials")
    # Imported here: the Kubernetes client is only needed by a controller that runs in a cluster.
    from autoresearch.executors.kubernetes import KubernetesExecutor

    return KubernetesExecutor(
        spec.executor, spec.study, folder / "trials", run_root, deadline_s=spec.budget.trial_time_limit_s
    )


def main() -> None:
    """The command; after a SIGTERM, leave without waiting for threads that libraries started.

    The signal's SystemExit can land anywhere, also between a thread pool starting a worker and registering it for
    shutdown: such a worker waits forever and the interpreter's exit joins it forever (seen once in the test that
    stops a controller). Everything of ours has been closed while the exception unwound: the local backend is
    stopped, the stores are closed.
    """
    try:
        app()
    except SystemExit as stop:
        # Click ends every run with SystemExit; a stop a library swallowed still ends it as stopped.
        if stop.code != SIGTERM_EXIT and not STOP.received:
            raise
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(SIGTERM_EXIT)


if __name__ == "__main__":
    main()
