"""Shared fixtures: the bundled text-to-SQL data set, built once per machine into the user cache."""

from __future__ import annotations

import os

import pytest
import torch

from tasks.text2sql.bundled import load_bundled
from tasks.text2sql.dataset import Text2SqlDataset
from tasks.text2sql.scoring import Scorer

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One torch thread per worker: workers each running a thread per core spin against each other.
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def bundled() -> Text2SqlDataset:
    return load_bundled()


@pytest.fixture(scope="session")
def scorer(bundled: Text2SqlDataset) -> Scorer:
    with Scorer(bundled) as shared:
        yield shared
