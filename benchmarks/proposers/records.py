"""The arms' runs kept beside the table they queried (`<study>-arms.json`), so that `compare` can run its arms at
different times (the LLM arms are slow on a CPU) and report all of them, and `confirm` can rerun each arm's best
configuration as a real trial. Runs are kept for one table (the digest of its CSV) and one number of trials: running an
arm again replaces that arm's runs, and runs made against another table or trial count are dropped."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ValidationError

from benchmarks.proposers.arms import ARMS, ArmRun


class RecordError(ValueError):
    """A record that cannot be read, or that belongs to another table; the message says which and what to run."""


class ArmRecords(BaseModel):
    """The runs of every arm run so far against one table, each `trials` trials long."""

    table_digest: str
    trials: int
    runs: list[ArmRun]

    def arms(self) -> list[str]:
        """The arms with runs, in the benchmark's order."""
        return [arm for arm in ARMS if any(run.arm == arm for run in self.runs)]

    def runs_of(self, arm: str) -> list[ArmRun]:
        return [run for run in self.runs if run.arm == arm]


def records_path(table_path: Path) -> Path:
    """Where the runs against the table at `table_path` are kept: beside it."""
    return table_path.with_name(f"{table_path.stem}-arms.json")


def table_digest(table_path: Path) -> str:
    return hashlib.sha256(table_path.read_bytes()).hexdigest()[:16]


def load_records(path: Path) -> ArmRecords | None:
    """The record at `path`, or None where there is none; raises RecordError for a file that is not one."""
    if not path.exists():
        return None
    try:
        return ArmRecords.model_validate_json(path.read_bytes())
    except ValidationError as error:
        message = f"{path}: not a record of the arms' runs ({error.error_count()} errors); delete it"
        raise RecordError(message) from error


def record_runs(path: Path, digest: str, trials: int, runs: Sequence[ArmRun]) -> tuple[ArmRecords, list[str]]:
    """Add `runs` to the record at `path` (written whole to a temporary file first), replacing earlier runs of their
    arms; returns the record and the arms whose earlier runs were dropped for another table or trial count."""
    earlier = load_records(path)
    new_arms = {run.arm for run in runs}
    kept: list[ArmRun] = []
    dropped: list[str] = []
    if earlier is not None:
        same_bench = earlier.table_digest == digest and earlier.trials == trials
        kept = [run for run in earlier.runs if same_bench and run.arm not in new_arms]
        dropped = [arm for arm in earlier.arms() if not same_bench and arm not in new_arms]
    records = ArmRecords(table_digest=digest, trials=trials, runs=[*kept, *runs])
    partial = path.with_name(path.name + ".partial")
    partial.write_text(records.model_dump_json(indent=1) + "\n")
    partial.replace(path)
    return records, dropped
