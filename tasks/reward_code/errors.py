"""Errors of reward code: refused before it runs, or not loadable as a trial asks for it."""

from tasks.errors import TaskError


class RewardCodeError(TaskError):
    """Reward code cannot be loaded or run: its artifact is missing, its hash differs, its worker cannot start."""


class StaticCheckError(RewardCodeError):
    """The static check refuses the source; the message names the line and what is not allowed."""
