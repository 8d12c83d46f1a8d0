"""Reward components the LLM writes as code, admitted for a study and handed to its trials by hash.

A candidate may carry a `reward` function (its signature is the task's: `CodeRewardTask.reward_code_signature`).
Before any trial uses it, `RewardCodeAdmission.admit` runs the static check and the task's gate on its probe batch
with the code in a sandboxed worker (`tasks.reward_code.admission`). Admitted code is uploaded as an Optuna artifact
of the study (a FileSystemArtifactStore beside the study's storage, so optuna-dashboard shows it), and the trial
that runs it carries its sha256, the artifact's id and its weight as user attributes, and a copy as an artifact of
its own; the trial's reward spec names the study's artifact and the hash, and the trial loads the code by both
(`tasks.reward_code.loading`). Refused code is
counted with its reason on the study and on the trial, which runs the rest of its proposal.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.artifacts import FileSystemArtifactStore, get_all_artifact_meta, upload_artifact

from autoresearch.attributes import (
    TrialAttributes,
    admitted_reward_code,
    record_admitted_reward_code,
    record_reward_code,
)
from autoresearch.errors import ConfigurationError
from autoresearch.spec import StudySpec
from tasks.errors import TaskError
from tasks.registry import open_task
from tasks.reward_code.admission import CodeRewardTask, Verdict, admit
from tasks.reward_code.errors import RewardCodeError
from tasks.reward_code.loading import CodeReference, load_source, sha256_of
from tasks.reward_code.sandbox import CodeLimits

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CodeComponent:
    """Admitted reward code as a trial's reward spec adds it: where it is, its hash, and its weight."""

    reference: CodeReference
    weight: float


def artifact_store_of(spec: StudySpec) -> Path:
    """The directory of the study's artifacts: `artifacts` in the spec, else `<SQLite file>-artifacts` beside it.

    Raises:
        ConfigurationError: the spec names no directory and its storage is not a SQLite file.
    """
    if spec.artifacts is not None:
        return Path(spec.artifacts).expanduser().resolve()
    url = spec.storage_url()
    if not url.startswith("sqlite:///"):
        raise ConfigurationError(
            "artifacts: a study whose LLM writes reward code needs a directory for its artifacts that trials can read "
            "(in a cluster, one on the runs volume); only a SQLite storage has one by default"
        )
    database = Path(url.removeprefix("sqlite:///")).expanduser().resolve()
    return database.with_name(f"{database.name}-artifacts")


def code_component_of(spec: StudySpec, attributes: TrialAttributes) -> CodeComponent | None:
    """The reward code a trial runs, from its attributes; None for a trial without."""
    if attributes.reward_code_sha256 is None or attributes.reward_code_artifact is None:
        return None
    reference = CodeReference(
        artifact_store=str(artifact_store_of(spec)),
        artifact_id=attributes.reward_code_artifact,
        sha256=attributes.reward_code_sha256,
    )
    return CodeComponent(reference, attributes.reward_code_weight or 0.0)


def attach_to_trial(trial: optuna.Trial, code: CodeComponent) -> None:
    """A copy of the code as an artifact of the trial that runs it, so the dashboard shows it on the trial's page;
    loading it checks its hash before the trial is launched. Done once per trial (a relaunch finds it there).

    Raises:
        ConfigurationError: the artifact is missing or its hash is not the one the trial carries.
    """
    if get_all_artifact_meta(trial, storage=trial.storage):
        return
    try:
        source = load_source(code.reference)
    except RewardCodeError as error:
        raise ConfigurationError(str(error)) from None
    _upload(source, code.reference.sha256, Path(code.reference.artifact_store), trial)


def _upload(source: str, sha256: str, store_dir: Path, owner: optuna.Study | optuna.Trial) -> str:
    """Upload the source as an artifact of the study or trial; returns the artifact's id."""
    store_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"reward-{sha256[:12]}.py"
        path.write_text(source)
        return upload_artifact(
            artifact_store=FileSystemArtifactStore(str(store_dir)),
            file_path=str(path),
            study_or_trial=owner,
            mimetype="text/x-python",
        )


class RewardCodeAdmission:
    """Admits the reward functions an LLM writes for one study; opens the study's task (its data and sandbox) on the
    first function it is given, and keeps it open for the next ones until `close`."""

    def __init__(self, spec: StudySpec, study: optuna.Study, limits: CodeLimits | None = None) -> None:
        self.spec = spec
        self.study = study
        self.limits = limits
        self.store_dir = artifact_store_of(spec)
        self._task: CodeRewardTask | None = None

    def admit(self, source: str, weight: float) -> TrialAttributes:
        """What a trial proposed with this code carries: its hash, artifact and weight once admitted (code the study
        admitted before is not checked again), else why it was refused. Either way it is counted on the study."""
        sha256 = sha256_of(source)
        artifact = admitted_reward_code(self.study, sha256)
        if artifact is None:
            try:
                verdict = admit(self._opened(), source, self.limits)
            except TaskError as error:  # the task's data or sandbox, not the code: the code is refused all the same
                verdict = Verdict("sandbox", f"the task could not run the gate: {error}")
            if not verdict.accepted:
                log.warning("reward code %s %s", sha256[:12], verdict)
                record_reward_code(self.study, f"{sha256[:12]}: {verdict}")
                return TrialAttributes(reward_code_refused=str(verdict))
            artifact = _upload(source, sha256, self.store_dir, self.study)
            record_admitted_reward_code(self.study, sha256, artifact)
            log.info("reward code %s %s", sha256[:12], verdict)
        record_reward_code(self.study, None)
        return TrialAttributes(reward_code_sha256=sha256, reward_code_artifact=artifact, reward_code_weight=weight)

    def _opened(self) -> CodeRewardTask:
        if self._task is None:
            task = open_task(self.spec.task, self.spec.data)
            if not isinstance(task, CodeRewardTask):
                task.close()
                raise ConfigurationError(f"task {self.spec.task!r} takes no reward components as code")
            self._task = task
        return self._task

    def close(self) -> None:
        if self._task is not None:
            self._task.close()
            self._task = None
