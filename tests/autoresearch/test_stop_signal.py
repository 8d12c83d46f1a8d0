"""The controller's SIGTERM: raised where it lands, and raised again when a library swallowed it."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

import pytest

from autoresearch.stop_signal import SIGTERM_EXIT, StopSignal


@pytest.fixture
def stop() -> Iterator[StopSignal]:
    previous = signal.getsignal(signal.SIGTERM)
    stop = StopSignal()
    stop.install()
    yield stop
    signal.signal(signal.SIGTERM, previous)


def test_nothing_is_raised_before_a_sigterm(stop: StopSignal) -> None:
    stop.raise_if_received()
    assert not stop.received


def test_a_sigterm_raises_where_it_lands(stop: StopSignal) -> None:
    with pytest.raises(SystemExit) as raised:
        os.kill(os.getpid(), signal.SIGTERM)
    assert raised.value.code == SIGTERM_EXIT


def test_a_sigterm_a_library_swallowed_is_raised_again_at_the_next_check(stop: StopSignal) -> None:
    # What LangGraph's task callbacks do with whatever a finished task raised.
    with contextlib.suppress(BaseException):
        os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(SystemExit) as raised:
        stop.raise_if_received()
    assert raised.value.code == SIGTERM_EXIT
