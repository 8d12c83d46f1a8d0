"""`Periodic`: readings taken on a thread of their own, every so often, while a `with` block runs."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import Self


class Periodic(ABC):
    """Calls `tick` every `interval_s` from when the `with` block starts until it ends, or until `tick` says done."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @abstractmethod
    def tick(self) -> bool:
        """Take one reading; False once there is nothing more to read."""

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self.tick():
                return

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
