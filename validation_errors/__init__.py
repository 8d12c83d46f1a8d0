"""The one line that names what is wrong with input that does not validate, for every layer: the training server's
request bodies and parameters, a task's reward spec and data source, a trial config, a study spec.

The three layers (trainer_backend, tasks, autoresearch) each validate input and none imports another for it, so this
lives beside them, as `lifeline/` does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from pydantic import BaseModel


class HasValidationErrors(Protocol):
    """pydantic's `ValidationError`, or FastAPI's for query and path parameters, which lists its problems the same
    way."""

    def errors(self) -> Sequence[Mapping[str, Any]]: ...


def describe_validation_error(error: HasValidationErrors, model: type[BaseModel] | None = None, root: str = "") -> str:
    """Each bad field and what it allows, in one line, without the values given (a body or a key may be secret).

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
