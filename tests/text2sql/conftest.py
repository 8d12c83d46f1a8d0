"""The question the agentic tests (test_agentic*.py) play their episodes on."""

from __future__ import annotations

import pytest

from tasks.text2sql.dataset import Example
from tasks.text2sql.task import Text2SqlTask


@pytest.fixture
def flights(text2sql: Text2SqlTask) -> Example:
    """A dev question over the flights database: SELECT MAX(duration_minutes) FROM flights WHERE distance_km > …"""
    example = text2sql.split("dev")[0]
    assert example.db_id == "flights"
    return example
