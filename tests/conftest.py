"""Shared fixtures: the bundled text-to-SQL data set, built once per machine into the user cache."""

from __future__ import annotations

import pytest

from tasks.text2sql.bundled import load_bundled
from tasks.text2sql.dataset import Text2SqlDataset
from tasks.text2sql.scoring import Scorer


@pytest.fixture(scope="session")
def bundled() -> Text2SqlDataset:
    return load_bundled()


@pytest.fixture(scope="session")
def scorer(bundled: Text2SqlDataset) -> Scorer:
    with Scorer(bundled) as shared:
        yield shared
