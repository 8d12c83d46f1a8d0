"""Errors of the data synthesis, each naming what went wrong and what fixes it."""

from tasks.text2sql.errors import Text2SqlError


class SynthesisError(Text2SqlError):
    """The synthesized data cannot be built or loaded as asked."""


class LlmUnavailableError(SynthesisError):
    """The question-writing LLM cannot be reached, refuses the request, or answers nothing usable."""


class BuildInterruptedError(SynthesisError):
    """The build was stopped (Ctrl-C, SIGTERM) before it finished; what it finished is cached."""
