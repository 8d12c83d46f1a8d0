"""A training pass split into micro-batches whose activations fit a memory budget.

A backward needs every layer's activations of every token of its forward. For an RL step of 8 prompts of ~300
tokens × 8 completions, that is about 6,000 tokens: 17 GB for Qwen2.5-Coder-0.5B (24 layers, MLP width 4,864), more
than a laptop has. Every Tinker loss is a sum over data, so the gradient of the whole batch is the sum of the
gradients of its parts, and a pass run as several forward/backward pieces, each freed before the next, gives the
same gradients at a fraction of the memory. Pieces are whole prefix groups (a prompt and its completions share the
prompt's activations) or single data; a group too large for one piece is split into parts of fewer members in
consecutive pieces, which share one computation of the prefix (`training_pass.py`): its activations stay for all of
them, and each part counts them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from transformers import PretrainedConfig

from trainer_backend.engine.prefixes import PrefixGroup, length_buckets

# Activations one forward keeps for backward, per token and layer, in units of the layer's widths: calibrated on
# Qwen2.5-Coder-0.5B, where a piece of about 1,200 tokens held 5 GiB above the weights (4.5 MB a token; this gives
# 4.2 MB), and `benchmarks/rl_step.py` prints the backend's peak.
_SAVED_PER_HIDDEN = 16
_SAVED_PER_INTERMEDIATE = 6
# What the activations of one piece may take by default (`serve --max-training-activation-bytes`); the model's
# weights and the LoRA state come on top. 2.5 GiB keeps the shipped Gemma trial's backend within 6 GiB (3 GiB left it
# at 6.06; docs/reliability.md) and still holds a whole group of Qwen's usual RL step (~570 tokens, 2.4 GB).
ACTIVATION_BUDGET_BYTES = 5 * 2**29


def activation_bytes_per_token(config: PretrainedConfig, dtype_bytes: int) -> int:
    """The memory a training forward keeps for backward per token of this model, from its widths and depth."""
    text = config.get_text_config()
    intermediate = getattr(text, "intermediate_size", None) or 4 * text.hidden_size
    per_layer = _SAVED_PER_HIDDEN * text.hidden_size + _SAVED_PER_INTERMEDIATE * intermediate
    return text.num_hidden_layers * per_layer * dtype_bytes


@dataclass(frozen=True)
class Piece:
    """Work of one micro-batch: datums on their own (`alone`) and prefix groups, as (call index, ...) pairs."""

    alone: tuple[tuple[int, int], ...]
    groups: tuple[tuple[int, PrefixGroup], ...]


def plan_pieces(
    alone: Sequence[tuple[int, int]],
    groups: Sequence[tuple[int, PrefixGroup]],
    lengths: dict[tuple[int, int], int],
    token_budget: int,
) -> list[Piece]:
    """Pack the pass's work into pieces of at most `token_budget` tokens each (a unit larger alone gets its own).

    A datum alone costs its length, padded to the longest of its piece; a group costs its prefix once and each
    member's remaining tokens padded to the group's longest. `lengths` maps (call, datum) to its token count.
    """
    pieces: list[Piece] = []
    piece_alone: list[tuple[int, int]] = []
    piece_groups: list[tuple[int, PrefixGroup]] = []
    groups_cost = 0

    def cost() -> int:
        # The datums alone are sorted longest first: the first one's length is the batch's padded width.
        return groups_cost + (lengths[piece_alone[0]] * len(piece_alone) if piece_alone else 0)

    def flush() -> None:
        nonlocal piece_alone, piece_groups, groups_cost
        pieces.append(Piece(tuple(piece_alone), tuple(piece_groups)))
        piece_alone, piece_groups, groups_cost = [], [], 0

    for c, group in groups:
        for part in _split_group(c, group, lengths, token_budget):
            unit = _group_cost(c, part, lengths)
            if piece_groups and groups_cost + unit > token_budget:
                flush()
            piece_groups.append((c, part))
            groups_cost += unit
    for key in sorted(alone, key=lambda key: -lengths[key]):
        width = lengths[piece_alone[0]] if piece_alone else lengths[key]
        if (piece_alone or piece_groups) and cost() + width > token_budget:
            flush()
        piece_alone.append(key)
    if piece_alone or piece_groups:
        flush()
    return pieces


def _group_cost(c: int, group: PrefixGroup, lengths: dict[tuple[int, int], int]) -> int:
    # As the pass computes a group: the prefix once, the members in batches of similar length (`length_buckets`).
    suffixes = [lengths[(c, m)] - group.prefix_length for m in group.members]
    return group.prefix_length + sum(
        max(suffixes[i] for i in bucket) * len(bucket) for bucket in length_buckets(suffixes)
    )


def _split_group(
    c: int, group: PrefixGroup, lengths: dict[tuple[int, int], int], token_budget: int
) -> list[PrefixGroup]:
    """The group as parts of consecutive members within the budget, each counting the prefix, whose activations
    stay while its parts run."""
    parts: list[PrefixGroup] = []
    members: list[int] = []
    for member in group.members:
        candidate = PrefixGroup((*members, member), group.prefix_length)
        if members and _group_cost(c, candidate, lengths) > token_budget:
            parts.append(PrefixGroup(tuple(members), group.prefix_length))
            members = []
        members.append(member)
    parts.append(PrefixGroup(tuple(members), group.prefix_length))
    return parts
