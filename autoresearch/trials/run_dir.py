"""A trial's run directory: its config, resumable state, metric logs, plot and result.

Layout of `<run_dir>/<run_id>/`:
    config.yaml     the config the run was started with (a resume must match it)
    state.json      the last saved checkpoint: RL step, tinker:// path, position in the training order, seeds
    metrics.jsonl   one line per RL step;  warmup.jsonl: one per warm-up step;  evals.jsonl: one per evaluation
    rewards.png     reward and held-out accuracy over steps
    result.json     the trial's result, once it finished
    backend/        the local backend's storage and log, when the trial started one
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autoresearch.errors import ResumeError
from autoresearch.trials.config import RESUMABLE_CHANGES, TrialConfig, parse_trial_config
from autoresearch.trials.paired import PairedComparison
from tasks.report import ScoreName, held_out_score


class RunState(BaseModel):
    """Where a run stands at its last checkpoint; everything a restart needs to continue it exactly."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    # RL steps completed when the checkpoint was saved.
    step: int
    warmup_steps_done: int
    # Next unused position in the seeded training order.
    data_position: int
    # tinker://…/weights/… with the adapter and its optimizer state; None before the first save.
    checkpoint_path: str | None
    # The seeds the data order, LoRA init and sampling derive from.
    seed: int
    eval_seed: int
    finished: bool = False
    # tinker://…/sampler_weights/… of the final weights, once finished.
    sampler_path: str | None = None
    # The backend's ids of this trial's earlier runs: a resume from a checkpoint trains on in a new run, and the
    # earlier run's checkpoints are deleted once the new run has saved one of its own.
    left_behind: tuple[str, ...] = ()


class TrialResult(BaseModel):
    """What a finished (or early-stopped) trial reports; also written to `result.json` in its run directory."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    run_dir: Path
    steps_completed: int
    # The last held-out evaluation, the trial's objective.
    held_out_accuracy: float
    held_out_by_difficulty: dict[str, float | None]
    # The last evaluation on questions of forms training shows ("seen") and of those it never shows ("unseen");
    # empty when the held-out questions say no form.
    held_out_by_form: dict[str, float | None] = Field(default_factory=dict)
    # Held-out accuracy after each evaluated step.
    held_out_history: dict[int, float]
    # What RL did: the evaluation where it started (after any warm-up) against the last one, question by question;
    # None when the trial did not evaluate where RL started (eval_interval 0) or ran no RL step.
    rl_comparison: PairedComparison | None = None
    # The same comparison on the questions of each form, where they say one.
    rl_comparison_by_form: dict[str, PairedComparison] = Field(default_factory=dict)
    # How prompts were rendered: "chat" (the model's chat template) or "plain".
    prompt_format: Literal["chat", "plain"] = "plain"
    # Reward mean of the last RL step; None when the trial ran no RL step.
    final_reward_mean: float | None
    stopped_early: bool
    # The step this invocation resumed from; None when it started the run.
    resumed_from_step: int | None
    # Times the backend went away during this invocation and the trial went on from its last checkpoint.
    backend_interruptions: int = 0
    checkpoint_path: str
    sampler_path: str
    wall_time_s: float

    def score(self, name: ScoreName) -> float:
        """The last evaluation's accuracy a study is judged on; raises TaskError as `HeldOutReport.score` does."""
        return held_out_score(name, self.held_out_accuracy, self.held_out_by_form)


def _write_atomically(path: Path, text: str) -> None:
    # A crash mid-write must leave the previous file, never half a file.
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


class JsonLines:
    """An append-only log of JSON records, each with a `step`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, record: dict) -> None:
        with self.path.open("a") as log:
            log.write(json.dumps(record) + "\n")

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def keep_until(self, step: int) -> None:
        """Drop records after `step`: a resumed run redoes those steps and logs them again."""
        kept = [record for record in self.read() if record["step"] <= step]
        _write_atomically(self.path, "".join(json.dumps(record) + "\n" for record in kept))


class RunDirectory:
    """The files of one run."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.config_path = root / "config.yaml"
        self.state_path = root / "state.json"
        self.metrics = JsonLines(root / "metrics.jsonl")
        self.warmup = JsonLines(root / "warmup.jsonl")
        self.evals = JsonLines(root / "evals.jsonl")
        self.plot_path = root / "rewards.png"
        self.result_path = root / "result.json"
        self.backend_root = root / "backend"

    def load_state(self) -> RunState | None:
        """The saved state, or None for a run that never saved one.

        Raises:
            ResumeError: the state file is unreadable.
        """
        if not self.state_path.exists():
            return None
        try:
            return RunState.model_validate_json(self.state_path.read_text())
        except ValidationError as error:
            raise ResumeError(f"{self.state_path} is unreadable: {error}") from None

    def save_state(self, state: RunState) -> None:
        _write_atomically(self.state_path, state.model_dump_json(indent=2))

    def read_result(self) -> TrialResult | None:
        """The result of a run that finished, or None."""
        if not self.result_path.exists():
            return None
        return TrialResult.model_validate_json(self.result_path.read_text())

    def write_result(self, result: TrialResult) -> None:
        # Atomically: a controller reads the result of a trial that is still running, as soon as it appears.
        _write_atomically(self.result_path, result.model_dump_json(indent=2))

    def check_config(self, config: TrialConfig) -> None:
        """Write the config of a new run, or check that a resumed run's config only changes what may change.

        Raises:
            ResumeError: naming each field that differs from the config the run was started with.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        if not self.config_path.exists():
            _write_atomically(self.config_path, yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
            return
        started = parse_trial_config(yaml.safe_load(self.config_path.read_text()), str(self.config_path))
        before, now = started.model_dump(mode="json"), config.model_dump(mode="json")
        changed = sorted(k for k in now if now[k] != before[k] and k not in RESUMABLE_CHANGES)
        if changed:
            raise ResumeError(
                f"run {config.run_id!r} was started with another config: {', '.join(changed)} differ "
                f"(only {', '.join(sorted(RESUMABLE_CHANGES))} may change on resume); use a new run_id"
            )
        _write_atomically(self.config_path, yaml.safe_dump(now, sort_keys=False))
