"""The tasks a trial or a study can name, by name (`task:` in a trial config or a study spec)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from tasks.errors import UnknownTaskError
from tasks.interface import AnyTask
from tasks.text2sql.task import Text2SqlTask


@dataclass(frozen=True)
class RegisteredTask:
    """A task as the registry holds it: its class, which configs are validated against without opening the task
    (its reward, its data sources), and how to open it on a data source (one of the class's `data_source_type`)."""

    cls: type[AnyTask]
    open: Callable[[Any], AnyTask]


TASKS: dict[str, RegisteredTask] = {Text2SqlTask.name: RegisteredTask(Text2SqlTask, Text2SqlTask.open)}


def registered_task(name: str) -> str:
    """`name` if a task is registered under it; else raises UnknownTaskError naming the tasks there are."""
    if name not in TASKS:
        raise UnknownTaskError(f"no task {name!r}; tasks: {', '.join(sorted(TASKS))}")
    return name


def task_class(name: str) -> type[AnyTask]:
    """The class of the task registered as `name`, to ask of its reward; raises UnknownTaskError for another name."""
    return TASKS[registered_task(name)].cls


def open_task(name: str, data: BaseModel | None = None) -> AnyTask:
    """The task registered as `name`, on the data source `data` (a validated one of its `data_source_type`; None:
    the data it ships with).

    Raises:
        UnknownTaskError: no task is registered as `name`.
        TaskError: the data does not load (the task's own error names the file and the fix).
    """
    registered = TASKS[registered_task(name)]
    return registered.open(registered.cls.data_source_type() if data is None else data)
