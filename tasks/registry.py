"""The tasks a trial or a study can name, by name (`task:` in a trial config or a study spec)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tasks.errors import UnknownTaskError
from tasks.interface import AnyTask
from tasks.text2sql.task import Text2SqlTask


@dataclass(frozen=True)
class RegisteredTask:
    """A task as the registry holds it: its class, which configs are validated against without opening the task
    (its reward), and how to open it on the data it ships with."""

    cls: type[AnyTask]
    open: Callable[[], AnyTask]


TASKS: dict[str, RegisteredTask] = {Text2SqlTask.name: RegisteredTask(Text2SqlTask, Text2SqlTask.bundled)}


def registered_task(name: str) -> str:
    """`name` if a task is registered under it; else raises UnknownTaskError naming the tasks there are."""
    if name not in TASKS:
        raise UnknownTaskError(f"no task {name!r}; tasks: {', '.join(sorted(TASKS))}")
    return name


def task_class(name: str) -> type[AnyTask]:
    """The class of the task registered as `name`, to ask of its reward; raises UnknownTaskError for another name."""
    return TASKS[registered_task(name)].cls


def open_task(name: str) -> AnyTask:
    """The task registered as `name`, on its shipped data; raises UnknownTaskError for a name not registered."""
    return TASKS[registered_task(name)].open()
