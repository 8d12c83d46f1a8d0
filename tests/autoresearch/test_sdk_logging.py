"""The command lines keep the SDK's warnings but not its warning for every long-poll that timed out."""

from __future__ import annotations

import logging

import pytest
from tinker.lib import api_future_impl

from autoresearch.sdk_logging import quiet_sdk_logs


def test_long_poll_retries_are_dropped_and_other_sdk_warnings_kept(caplog: pytest.LogCaptureFixture) -> None:
    quiet_sdk_logs()
    quiet_sdk_logs()  # a second call (a study running trials in-process) adds no second filter
    # The logger the SDK's futures really log through, so a rename in the SDK fails here.
    futures = api_future_impl.logger
    assert sum(type(f).__name__ == "_LongPollRetries" for f in futures.filters) == 1
    with caplog.at_level(logging.INFO):
        futures.warning("Retrying request self.request_id='req-1' because of try_again")
        futures.warning("Retrying request self.request_id='req-2' because of a 503")
        logging.getLogger("tinker").info("created a client")
    assert [record.getMessage() for record in caplog.records] == [
        "Retrying request self.request_id='req-2' because of a 503"
    ]
