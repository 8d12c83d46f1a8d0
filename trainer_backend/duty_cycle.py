"""What the engines did: when the device was busy (recent busy intervals, the busy fraction over a window, and a
timeline to plot), and how many tokens each phase processed.

The scheduler reports each device call's (start, end) when it finishes; the call running now is passed in by
whoever asks, so a long call counts as busy while it runs, not only once it ends.
"""

from __future__ import annotations

import threading
import time
from collections import deque

Interval = tuple[float, float]


class DutyCycle:
    """Busy intervals (monotonic seconds) of the last `keep_s` seconds; thread-safe."""

    def __init__(self, keep_s: float = 600.0) -> None:
        self.keep_s = keep_s
        self._intervals: deque[Interval] = deque()
        self._lock = threading.Lock()

    def record(self, start: float, end: float) -> None:
        """One device call ran from `start` to `end` (calls arrive in end order and never overlap)."""
        with self._lock:
            self._intervals.append((start, end))
            horizon = end - self.keep_s
            while self._intervals and self._intervals[0][1] < horizon:
                self._intervals.popleft()

    def intervals(self, since: float, running_since: float | None = None, now: float | None = None) -> list[Interval]:
        """Busy intervals that end after `since`, clipped to it, with the running call up to `now`."""
        now = time.monotonic() if now is None else now
        with self._lock:
            found = [(max(start, since), end) for start, end in self._intervals if end > since]
        if running_since is not None:
            found.append((max(running_since, since), now))
        return found

    def busy_fraction(self, window_s: float, running_since: float | None = None, now: float | None = None) -> float:
        """Share of the last `window_s` seconds the device was busy, in [0, 1]."""
        now = time.monotonic() if now is None else now
        busy = sum(end - start for start, end in self.intervals(now - window_s, running_since, now))
        return min(1.0, busy / window_s)
