"""`Closeable`: a holder of processes, connections or files that a `with` block closes at its end."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Self


class Closeable(ABC):
    """Something whose `close` releases what it holds; `with` hands it over and closes it when the block ends."""

    @abstractmethod
    def close(self) -> None:
        """Release what it holds; calling it again does nothing."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
