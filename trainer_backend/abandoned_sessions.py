"""Queued samples of a client that is gone are failed before they run.

A trial killed mid-evaluation leaves hundreds of sampling requests queued; nobody will read their answers, yet they
would take the device from live clients for minutes. The SDK sends a heartbeat every 10 s for its session, so a
session that has been silent far longer than the others is taken for gone, and its sampling sessions' queued
requests are failed with a reason (a training client's ordered requests are left to run: they are few, and a save
among them may be what a restart resumes from).
"""

from __future__ import annotations

import logging
import threading

from trainer_backend.runs import RunStore
from trainer_backend.scheduler import Scheduler

log = logging.getLogger(__name__)

# How often the queues are looked at, at most: a fraction of the silence that counts as gone.
_SWEEP_S = 10.0


class AbandonedSessions:
    """Looks now and then for queued samples of silent sessions and fails them (`sweep`); `close` stops it."""

    def __init__(self, runs: RunStore, scheduler: Scheduler, silent_for_s: float) -> None:
        self.runs = runs
        self.scheduler = scheduler
        self.silent_for_s = silent_for_s
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="abandoned-sessions", daemon=True)
        self._thread.start()

    def sweep(self) -> int:
        """Fail the queued samples of sessions silent for `silent_for_s`; how many were failed."""
        silent = self.runs.silent_sampling_sessions(self.scheduler.lanes_with_queued_samples(), self.silent_for_s)
        if not silent:
            return 0
        reason = (
            f"dropped before it ran: its session sent no heartbeat for more than {self.silent_for_s:.0f} s while "
            "others did, so its client was taken for gone (--abandoned-session-s)"
        )
        dropped = self.scheduler.drop_queued_samples(silent, reason)
        log.warning("dropped %d queued samples of %d silent sampling sessions", dropped, len(silent))
        return dropped

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        while not self._closed.wait(min(_SWEEP_S, self.silent_for_s / 4)):
            try:
                self.sweep()
            except Exception:  # a failed look must not end the watch
                log.exception("looking for abandoned sessions failed")
