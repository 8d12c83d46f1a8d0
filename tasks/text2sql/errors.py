"""Typed errors of the text-to-SQL task, so callers can tell bad input from bad data."""

from tasks.errors import TaskError


class Text2SqlError(TaskError):
    """Base class of every error this task raises on purpose."""


class DatasetError(Text2SqlError):
    """A data set on disk is missing, malformed or inconsistent."""


class DomainFileError(DatasetError):
    """A domain file (tasks/text2sql/sources/domains/) does not parse, validate or resolve."""


class RewardSpecError(Text2SqlError):
    """A reward spec does not validate."""


class SandboxError(Text2SqlError):
    """The sandbox is misconfigured, cannot open a database, or is used after close; bad SQL never raises."""


class CookbookSetupError(Text2SqlError):
    """The cookbook environment cannot be built as configured (a renderer that does not fit the tokenizer...)."""


class EndpointError(Text2SqlError):
    """The model endpoint being evaluated cannot be reached or refuses a request."""
