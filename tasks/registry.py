"""The tasks a trial or a study can name, by name (`task:` in a trial config or a study spec)."""

from __future__ import annotations

from collections.abc import Callable

from tasks.errors import UnknownTaskError
from tasks.interface import AnyTask
from tasks.text2sql.task import Text2SqlTask

# Each task's factory opens it on the data it ships with.
TASKS: dict[str, Callable[[], AnyTask]] = {Text2SqlTask.name: Text2SqlTask.bundled}


def registered_task(name: str) -> str:
    """`name` if a task is registered under it; else raises UnknownTaskError naming the tasks there are."""
    if name not in TASKS:
        raise UnknownTaskError(f"no task {name!r}; tasks: {', '.join(sorted(TASKS))}")
    return name


def open_task(name: str) -> AnyTask:
    """The task registered as `name`, on its shipped data; raises UnknownTaskError for a name not registered."""
    return TASKS[registered_task(name)]()
