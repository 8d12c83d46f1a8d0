"""A scheduler's stop (SIGTERM) for the controller: it unwinds the run like Ctrl-C, even when a library swallows it.

The handler raises SystemExit wherever the main thread is, so a controller blocked on an LLM's reply or a backend's
start-up stops at once. But the exception can land inside a library's `except BaseException` (LangGraph has several,
e.g. the callback that reaps a finished task): the CI saw a stopped controller run its study to the end and exit 0.
So the signal is also remembered, and the controller's next tick raises it again.
"""

from __future__ import annotations

import signal
from types import FrameType

SIGTERM_EXIT = 128 + signal.SIGTERM


class StopSignal:
    """SIGTERM, raised as SystemExit(143) where it lands and again at each `raise_if_received`."""

    def __init__(self) -> None:
        self.received = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def raise_if_received(self) -> None:
        """Raise the stop again if it came: the first SystemExit may have been swallowed where it landed."""
        if self.received:
            raise SystemExit(SIGTERM_EXIT)

    def _on_sigterm(self, _signum: int, _frame: FrameType | None) -> None:
        self.received = True
        raise SystemExit(SIGTERM_EXIT)
