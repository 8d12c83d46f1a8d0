"""A device call nested in another's pause that runs in slices: on a thread of its own, it gives the device back between
its steps (it parks) and goes on in the paused call's next pause.

A call nested in a pause used to hold the device to its end, and the paused call with it: a training pass of the other
trial of a study, 25-68 s of one Qwen2.5-Coder 0.5B step on two cores, froze a generation for all of it (issue 48).
Python cannot leave a function midway and come back to it, so the nested call keeps its own stack on a thread; the
device worker and that thread hand the device to each other and never run at once, so what each sees of the model is
what it would see with one thread (the torch modes that differ, grad and inference mode, are per thread anyway).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from trainer_backend.operations import BatchCall

log = logging.getLogger(__name__)


class SlicedCall:
    """Runs `execute(call)` on a thread of its own, a slice at a time: `run_slice` returns once the call parks
    (`park`, on its thread) or ends (`done`). Once `hosted` is off it no longer parks: the rest runs in one slice."""

    def __init__(self, call: BatchCall, execute: Callable[[BatchCall], None]) -> None:
        self.call = call
        self.hosted = True
        self.done = False
        self._execute = execute
        self._to_call = threading.Semaphore(0)
        self._to_host = threading.Semaphore(0)
        first = call.operations[0]
        self._thread = threading.Thread(target=self._main, name=f"sliced-{first.request_id}", daemon=True)

    def run_slice(self) -> None:
        """Run the call until it parks or ends, waiting meanwhile (on the thread that hands it the device)."""
        assert not self.done, "a call that ended has no slice left"
        if self._thread.ident is None:
            self._thread.start()
        else:
            self._to_call.release()
        self._to_host.acquire()

    def park(self) -> None:
        """On the call's thread: hand the device back and wait for the next slice (only while `hosted`: the
        scheduler's park hook checks it, with the bookkeeping of the wait)."""
        self._to_host.release()
        self._to_call.acquire()

    def _main(self) -> None:
        try:
            self._execute(self.call)
        except BaseException:  # the runner's errors fail its operations in `execute`; this is a bug in the worker
            log.exception("a sliced call of %s failed outside its runner", self.call.operations[0].kind)
        finally:
            self.done = True
            self._to_host.release()
