"""`${VAR}` references in a setting, filled in from the environment: a password in a storage URL, the folder of a
user's own data release, anything a spec should name without writing it down."""

from __future__ import annotations

import os
import re

_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def missing_variables(text: str) -> list[str]:
    """The variables `text` refers to that the environment does not set, in order."""
    return [name for name in _REFERENCE.findall(text) if name not in os.environ]


def expand_environment(text: str) -> str:
    """`text` with each `${VAR}` replaced by the variable's value.

    Raises:
        ValueError: naming each variable the environment does not set.
    """
    missing = missing_variables(text)
    if missing:
        raise ValueError(f"refers to {', '.join(missing)}, which the environment does not set")
    return _REFERENCE.sub(lambda match: os.environ[match.group(1)], text)
