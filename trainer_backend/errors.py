"""Typed errors of the training server; the HTTP layer maps each to a status code in one place.

`category` follows the Tinker API: "user" errors are the caller's to fix (bad input, unknown ids), "server" errors
are ours. Messages name the problem so a person can act on them.
"""

from __future__ import annotations


class BackendError(Exception):
    """Base class of every error the server raises on purpose."""

    status_code = 500
    category = "server"


class UserInputError(BackendError):
    """The request is malformed or asks for something impossible (shapes, ranges, unknown names)."""

    status_code = 400
    category = "user"


class PayloadTooLargeError(UserInputError):
    """A request body larger than the server accepts (`--max-request-bytes`)."""

    status_code = 413


class NotFoundError(BackendError):
    """An id or checkpoint does not exist, or belongs to another API key (we do not say which)."""

    status_code = 404
    category = "user"


class AuthenticationError(BackendError):
    """No API key, or one the server does not know."""

    status_code = 401
    category = "user"


class ConflictError(BackendError):
    """The request contradicts one already accepted (a seq_id reused with another body, a name taken).

    Sent as 400, not 409: the SDK retries 409 for minutes, and a conflict does not go away by waiting.
    """

    status_code = 400
    category = "user"


class OverloadedError(BackendError):
    """Queues are full; the client should back off and retry."""

    status_code = 429
    category = "server"


class QuotaExceededError(BackendError):
    """What the caller's key holds would pass a per-key limit of the server; what it saved already stays."""

    status_code = 403
    category = "user"


class ServerError(BackendError):
    """Something failed on our side while running a request; the message says what."""

    status_code = 500
    category = "server"


class UnknownBaseModelError(BackendError, ValueError):
    """The name is neither a known base model nor a local Hugging Face model folder (a startup error)."""

    status_code = 400
    category = "user"


class DeviceUnavailableError(BackendError, ValueError):
    """The device flag is malformed or names a device this machine lacks (a startup error)."""

    status_code = 400
    category = "user"
