"""Shared fixtures: the bundled text-to-SQL data set (built once per machine into the user cache) and its task, and a
scripted LLM."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
from support.scripted_llm import ScriptedLlm, scripted_llm

from tasks.text2sql.dataset import Text2SqlDataset
from tasks.text2sql.reward.scoring import Scorer
from tasks.text2sql.sources.bundled import load_bundled
from tasks.text2sql.task import Text2SqlTask

# Servers the suite starts, in-process or as `serve` processes, compute in float32 whatever this CPU offers: their
# tests compare the engine's paths with the plain computation to fp32's precision. The bf16 paths have tests of
# their own (tests/trainer_backend/test_bf16.py), with bf16's tolerances.
os.environ["TRAINER_BACKEND_DTYPE"] = "float32"

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One torch thread per worker: workers each running a thread per core spin against each other.
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def bundled() -> Text2SqlDataset:
    return load_bundled()


@pytest.fixture(scope="session")
def text2sql(bundled: Text2SqlDataset) -> Iterator[Text2SqlTask]:
    """The text-to-SQL task over the bundled data, as trials and the command line see it."""
    with Text2SqlTask(bundled) as task:
        yield task


@pytest.fixture(scope="session")
def scorer(bundled: Text2SqlDataset) -> Scorer:
    with Scorer(bundled) as shared:
        yield shared


@pytest.fixture
def llm(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedLlm]:
    """A scripted OpenAI-compatible LLM on loopback (support/scripted_llm.py), its key in $SCRIPTED_LLM_KEY."""
    monkeypatch.setenv("SCRIPTED_LLM_KEY", "sk-test")
    with scripted_llm() as script:
        yield script
