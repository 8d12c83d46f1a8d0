"""The errors every task shares, so callers (trials, the controller) catch one base class whatever the task, and
the one line that names what is wrong with input that does not validate (a reward spec, a data source, and above
this layer a trial config or a study spec)."""

from __future__ import annotations

from pydantic import BaseModel, ValidationError


class TaskError(Exception):
    """Base class of every error a task raises on purpose; each task's own errors derive from it."""


class UnknownTaskError(TaskError, ValueError):
    """No task is registered under the name asked for (a ValueError too, so config validators can raise it)."""


class SplitError(TaskError):
    """A split does not exist, or holds fewer examples than asked for."""


def describe_validation_error(error: ValidationError, model: type[BaseModel] | None = None, root: str = "") -> str:
    """Each bad field and what it allows, in one line, without the values given (a key may be secret).

    `model`: the model validated; an unknown top-level field's message lists its fields. `root`: the name given to a
    problem of the whole input rather than of a field (else the problem stands alone).
    """
    items = error.errors()
    # Validator wrappers (function-after[…]) name no field.
    locations = [".".join(str(p) for p in item["loc"] if not str(p).startswith("function-")) for item in items]
    problems = []
    for item, where in zip(items, locations, strict=True):
        # A bad component also fails the tuple's length check, which would only confuse.
        if item["type"] == "too_short" and any(other.startswith(f"{where}.") for other in locations):
            continue
        if item["type"] == "extra_forbidden":
            fields = f" (fields: {', '.join(model.model_fields)})" if model is not None and "." not in where else ""
            problems.append(f"{where}: unknown field{fields}")
            continue
        where = where or root
        message = item["msg"].removeprefix("Value error, ")
        problems.append(f"{where}: {message}" if where else message)
    return "; ".join(problems)
