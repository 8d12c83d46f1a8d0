"""The decoder steps of a data-parallel training pass, agreed by the group's processes before each runs.

Each process runs a pass over its own share of a batch (`data_parallel.py`), and each forward or backward of the
decoder gathers every layer's weights from all the processes, layer by layer: forward from the first layer, backward
from the last (`DecoderSteps`). FSDP2 matches the gathers of the processes by their order alone, and every layer's
shards have the same shapes, so gathers out of step would not fail: they would mix layers. Before each step the
processes agree on the next: a forward if any of them has one next, else a backward if any has one, else the pass is
over. A process whose next step is another one makes the agreed step without computing (it only gathers each layer
and frees it, in the step's order) and asks again; one whose share is done does the same until all are done. A
process with fewer or smaller micro-batches than the others thus makes the same gathers in the same order.
"""

from __future__ import annotations

from enum import IntEnum

import torch
import torch.distributed as dist
from torch import nn

from trainer_backend.engine.decoder_steps import DecoderSteps


class _Step(IntEnum):
    # The order is the priority: the least of the processes' next steps is the one made next.
    FORWARD = 0
    BACKWARD = 1
    DONE = 2


class Lockstep(DecoderSteps):
    """This process's side of the agreement, over the sharded `layers` (FSDP2 modules)."""

    def __init__(self, layers: nn.ModuleList, device: torch.device) -> None:
        self._layers = layers
        self._device = device

    def forward(self) -> None:
        self._agree(_Step.FORWARD)

    def backward(self) -> None:
        self._agree(_Step.BACKWARD)

    def finish(self) -> None:
        """This process's share is done: make the other processes' remaining steps with them."""
        self._agree(_Step.DONE)

    def _agree(self, mine: _Step) -> None:
        """Return when the step agreed is `mine`, having made in the meantime those agreed for the others."""
        while True:
            agreed = torch.tensor([mine], device=self._device)
            dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
            step = _Step(int(agreed))
            if step == mine:
                return
            self._gather_only(step)

    def _gather_only(self, step: _Step) -> None:
        """The gathers of `step` without its computation: every layer's weights gathered and freed, in its order."""
        layers = list(self._layers) if step == _Step.FORWARD else list(reversed(self._layers))
        for layer in layers:
            layer.unshard()
            layer.reshard()
