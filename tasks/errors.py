"""The errors every task shares, so callers (trials, the controller) catch one base class whatever the task."""

from __future__ import annotations


class TaskError(Exception):
    """Base class of every error a task raises on purpose; each task's own errors derive from it."""


class UnknownTaskError(TaskError, ValueError):
    """No task is registered under the name asked for (a ValueError too, so config validators can raise it)."""


class SplitError(TaskError):
    """A split does not exist, or holds fewer examples than asked for."""
