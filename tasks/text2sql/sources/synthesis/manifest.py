"""The built question file's companion: how it was built (seed, model, sizes, yields, times), the hash of the question
file it goes with, and the digest of every database its questions run on."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

# The shipped question file; its manifest lies beside it.
QUESTIONS_FILE = Path(__file__).resolve().parent / "data" / "train.json"


def manifest_path(questions_file: Path) -> Path:
    return questions_file.with_name(questions_file.stem + ".manifest.json")


class Yield(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sampled: int
    kept: int


class Manifest(BaseModel):
    """How a question file was built, beside it: what a user reads to judge it, and what loading checks."""

    model_config = ConfigDict(extra="forbid")

    seed: int
    model: str
    prompt_version: int
    built_on: str
    questions_sha256: str
    examples: int
    # The digest of every database the questions run on, as this code builds it from the seed.
    databases: dict[str, str]
    sql_draws: int
    sql_kept: int
    sql_rejections: dict[str, int]
    sampled: int
    kept: int
    verdicts: dict[str, int]
    by_feature: dict[str, Yield]
    by_difficulty: dict[str, int]
    llm_requests: int
    cached: int
    sql_seconds: float
    llm_seconds: float
