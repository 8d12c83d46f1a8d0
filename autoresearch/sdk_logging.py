"""The tinker SDK's logging, set for our command lines: its warnings show, its routine chatter does not."""

from __future__ import annotations

import logging

# The SDK module that awaits futures; it logs each long-poll that the server answered "not ready yet".
_FUTURES_LOGGER = "tinker.lib.api_future_impl"


class _LongPollRetries(logging.Filter):
    """Drops "Retrying request … because of try_again": a long-poll that timed out before its future was ready.

    That is how every future longer than one poll is awaited, not a fault, yet the SDK logs it as a warning: a trial
    waiting on a minute-long evaluation would print one per poll.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return "because of try_again" not in record.getMessage()


def quiet_sdk_logs() -> None:
    """The SDK at WARNING (it reports every client it opens at INFO), without its long-poll retry warnings."""
    logging.getLogger("tinker").setLevel(logging.WARNING)
    futures = logging.getLogger(_FUTURES_LOGGER)
    if not any(isinstance(existing, _LongPollRetries) for existing in futures.filters):
        futures.addFilter(_LongPollRetries())
