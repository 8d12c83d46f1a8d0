"""A training pass split across a sharded group's processes: each runs its share of every batch's datums.

Every process holds the whole batch (the leader sends each call to all of them, `replica.py`) and works out the same
shares from it (`share_datums`): whole prefix groups and single datums, the largest first, each to the process with
the least work so far; a group larger than a process's share is split between processes, each computing the prefix.
Each process runs the ordinary pass on its share, its decoder steps agreed with the others (`lockstep.py`). Every
Tinker loss is a sum over datums and over tokens, never a mean (`engine/losses.py`), so the batch's loss and its
gradients are the sums of the shares': the adapters' new gradients are summed across the processes (an all-reduce),
which keeps every replica of an adapter the same, and each call's `loss:sum` is the sum of the shares' sums. The
log-probs of every datum go to every process, so each returns what one process would.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch import Tensor, nn

from trainer_backend.engine.adapters import AdapterPool
from trainer_backend.engine.prefixes import shared_prefix_groups
from trainer_backend.engine.training_pass import TrainingPass
from trainer_backend.engine.types import ForwardBackwardCall, ForwardBackwardResult
from trainer_backend.errors import UserInputError
from trainer_backend.models.loading import LoadedModel
from trainer_backend.sharding.lockstep import Lockstep
from trainer_backend.sharding.shard_model import decoder_layers


@dataclass(frozen=True)
class _Unit:
    """Datums of one call that go to one process together: a prefix group (or part of one), or a datum alone."""

    call: int
    members: tuple[int, ...]
    prefix_length: int  # 0 for a datum alone
    cost: int  # tokens through the decoder: the prefix once, then each member's own tokens


def _unit(call: int, tokens: Sequence[Sequence[int]], members: tuple[int, ...], prefix_length: int) -> _Unit:
    cost = prefix_length + sum(len(tokens[i]) - prefix_length for i in members)
    return _Unit(call, members, prefix_length, cost)


def share_datums(calls: Sequence[ForwardBackwardCall], processes: int) -> list[list[tuple[int, ...]]]:
    """Each process's share of the calls' datums: `shares[process][call]`, the indices of its datums of that call
    in order (empty where it has none). The same calls give the same shares on every process."""
    tokens_by_call = [[d.model_input_tokens for d in call.datums] for call in calls]
    units: list[_Unit] = []
    for c, tokens in enumerate(tokens_by_call):
        groups, singles = shared_prefix_groups(tokens)
        units += [_unit(c, tokens, (i,), 0) for i in singles]
        units += [_unit(c, tokens, group.members, group.prefix_length) for group in groups]
    fair = sum(unit.cost for unit in units) / processes
    pieces: list[_Unit] = []
    for unit in units:
        # A group larger than a fair share in parts of interleaved members, each computing the prefix again.
        parts = min(len(unit.members), math.ceil(unit.cost / fair)) if unit.prefix_length else 1
        tokens = tokens_by_call[unit.call]
        pieces += [_unit(unit.call, tokens, unit.members[p::parts], unit.prefix_length) for p in range(parts)]
    loads = [0] * processes
    shares: list[list[list[int]]] = [[[] for _ in calls] for _ in range(processes)]
    for piece in sorted(pieces, key=lambda piece: (-piece.cost, piece.call, piece.members)):
        least = loads.index(min(loads))
        loads[least] += piece.cost
        shares[least][piece.call] += piece.members
    return [[tuple(sorted(indices)) for indices in share] for share in shares]


class DataParallelPass(TrainingPass):
    """The training pass of one process of a sharded group, over its share of each batch (`share_datums`); what it
    returns, and the gradients it leaves in the adapters, are those of the whole batch, on every process alike."""

    def __init__(
        self,
        loaded: LoadedModel,
        adapters: AdapterPool,
        logprobs: Callable[..., Tensor],
        chunk_tokens: int,
        piece_tokens: int,
    ) -> None:
        self.lockstep = Lockstep(decoder_layers(loaded.model), loaded.device)
        super().__init__(loaded, adapters, logprobs, chunk_tokens, piece_tokens, steps=self.lockstep)

    def run(
        self, calls: Sequence[ForwardBackwardCall], pause: Callable[[], None] = lambda: None
    ) -> list[ForwardBackwardResult | UserInputError]:
        """As `TrainingPass.run`, this process computing its share. Every process of the group calls it with the same
        calls (a refused call is refused by all alike, decided on its whole batch). It does not pause: the other
        processes would wait in the middle of a gather for whatever ran in this one's pause."""
        outcomes: list[ForwardBackwardResult | UserInputError | None] = [self.refusal(call) for call in calls]
        valid = [c for c, outcome in enumerate(outcomes) if outcome is None]
        shares = share_datums([calls[c] for c in valid], dist.get_world_size())[dist.get_rank()]
        mine = [(c, indices) for c, indices in zip(valid, shares, strict=True) if indices]
        trained = sorted({calls[c].model_id for c in valid if not calls[c].forward_only})
        parameters = [p for name in trained for p in self.adapters.parameters(name)]
        earlier = _set_aside(parameters)
        own_calls = [replace(calls[c], datums=[calls[c].datums[i] for i in indices]) for c, indices in mine]
        computed = super().run(own_calls) if own_calls else []
        self.lockstep.finish()
        _sum_new_gradients(parameters, earlier, self.loaded.device)
        parts = []
        for (c, indices), outcome in zip(mine, computed, strict=True):
            assert isinstance(outcome, ForwardBackwardResult), "a share of a valid call is valid"
            parts.append(_Part(c, indices, outcome.loss_fn_outputs, outcome.metrics["loss:sum"]))
        for c, outcome in _whole_outcomes(parts, calls, valid).items():
            outcomes[c] = outcome
        return outcomes


@dataclass(frozen=True)
class _Part:
    """What one process computed of a call: its datums' outputs and the sum of their losses."""

    call: int
    datums: tuple[int, ...]
    outputs: list[dict]
    loss: float


def _whole_outcomes(
    parts: Sequence[_Part], calls: Sequence[ForwardBackwardCall], valid: Sequence[int]
) -> dict[int, ForwardBackwardResult]:
    """Each valid call's outcome from every process's parts (an all-gather): the outputs of all its datums, in order,
    and the sum of its parts' losses."""
    everyone: list[list[_Part] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, list(parts))
    outputs: dict[tuple[int, int], dict] = {}
    losses = dict.fromkeys(valid, 0.0)
    for process_parts in everyone:
        for part in process_parts:
            outputs.update(((part.call, i), output) for i, output in zip(part.datums, part.outputs, strict=True))
            losses[part.call] += part.loss
    return {
        c: ForwardBackwardResult(
            loss_fn_outputs=[outputs[(c, i)] for i in range(len(calls[c].datums))], metrics={"loss:sum": losses[c]}
        )
        for c in valid
    }


def _set_aside(parameters: Sequence[nn.Parameter]) -> list[Tensor | None]:
    """The gradients the parameters hold (from earlier forward_backward calls, already summed), taken off them so
    that this pass's gradients can be summed alone."""
    earlier = [p.grad for p in parameters]
    for p in parameters:
        p.grad = None
    return earlier


def _sum_new_gradients(
    parameters: Sequence[nn.Parameter], earlier: Sequence[Tensor | None], device: torch.device
) -> None:
    """Each parameter's gradient: its earlier one plus the sum of every process's new one. A parameter no process
    gave a gradient keeps its earlier one (None if none), as on one process."""
    if not parameters:
        return
    made = torch.tensor([p.grad is not None for p in parameters], dtype=torch.int32, device=device)
    dist.all_reduce(made, op=dist.ReduceOp.MAX)
    new = torch.cat([(torch.zeros_like(p) if p.grad is None else p.grad).reshape(-1) for p in parameters])
    dist.all_reduce(new)
    sums = new.split([p.numel() for p in parameters])
    for p, before, summed, any_made in zip(parameters, earlier, sums, made.tolist(), strict=True):
        grad = summed.view_as(p) if any_made else None
        p.grad = before if grad is None else grad if before is None else before + grad
