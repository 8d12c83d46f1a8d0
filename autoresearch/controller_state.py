"""The controller's own state: what its graph carries, and where it lives (LangGraph calls it checkpoints; this is
not a trial's or a model's checkpoint): beside the study, in the same kind of store.

A study in PostgreSQL (a cluster, where the controller's own disk goes away with its pod) keeps the checkpoints in
the same database; any other study keeps them in a SQLite file in the study's folder.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TypedDict

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from psycopg import OperationalError

from autoresearch.errors import ConfigurationError

POSTGRES = re.compile(r"^postgres(?:ql)?(?:\+\w+)?://")


class ControllerState(TypedDict):
    """All the graph carries: the Optuna study and the trials' run directories hold everything else."""

    round: int
    # Ended trials the last analysis covered.
    analysed: int


@contextmanager
def open_controller_state(storage_url: str, folder: Path) -> Iterator[BaseCheckpointSaver]:
    """LangGraph's checkpointer of the controller's graph for a study stored at `storage_url` (SQLite files go in
    `folder`).

    Raises:
        ConfigurationError: the PostgreSQL database cannot be reached.
    """
    if POSTGRES.match(storage_url):
        # SQLAlchemy's dialect suffix (postgresql+psycopg://) means nothing to psycopg itself.
        conninfo = POSTGRES.sub("postgresql://", storage_url)
        with ExitStack() as stack:
            try:
                saver = stack.enter_context(PostgresSaver.from_conn_string(conninfo))
            except OperationalError as error:
                raise ConfigurationError(f"cannot reach the PostgreSQL database for checkpoints: {error}") from None
            saver.setup()
            yield saver
        return
    folder.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(str(folder / "controller.sqlite3"), check_same_thread=False) as connection:
        yield SqliteSaver(connection)
