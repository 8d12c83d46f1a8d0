"""The decoder's forwards and backwards of a training pass, each announced before it runs.

One process has no use for the announcements. The processes of a sharded backend (`sharding/lockstep.py`) each run a
pass over their own share of a batch, and every forward or backward of the decoder gathers each layer's weights from
all of them: they agree on each step before it runs, so that their gathers go in the same order.
"""

from __future__ import annotations


class DecoderSteps:
    """Told of each decoder forward and backward of a pass before it runs; this one, a single process's, does nothing.

    A backward is that of one forward, from its output (all its layers, the last first): the pass runs no backward
    through two forwards at once, nor one that starts inside the decoder.
    """

    def forward(self) -> None:
        """A forward through every decoder layer comes next."""

    def backward(self) -> None:
        """The backward of one decoder forward comes next."""
