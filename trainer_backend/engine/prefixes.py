"""Data that begin with the same tokens, grouped so that a forward pass computes their common prefix once.

The datums of an RL step are a few prompts with several completions each, and a prompt is most of each sequence:
computing a group's prompt once and its completions on top of it (through the KV cache, gradients included)
removes most of a training pass. Groups are chosen over the data in token order, where sequences with a common
prefix are neighbours, by the partition that computes the fewest tokens. Sampling uses the same groups for the
prompts of a generation batch (`plan_shared_prefill`): an evaluation's questions over one schema share most of it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

# A group costs two forward calls instead of a share of one; this many tokens of work is what that overhead is
# worth, so prefixes shorter than it are not shared.
GROUP_OVERHEAD_TOKENS = 16


@dataclass(frozen=True)
class PrefixGroup:
    """Datums (indices) whose first `prefix_length` tokens are the same; each has at least one token more."""

    members: tuple[int, ...]
    prefix_length: int


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens `a` and `b` begin with alike."""
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length


def shared_prefix_groups(sequences: Sequence[Sequence[int]]) -> tuple[list[PrefixGroup], list[int]]:
    """The groups worth computing through a shared prefix, and the indices of the sequences left on their own.

    Minimises tokens computed, `GROUP_OVERHEAD_TOKENS + prefix + sum of the members' remaining tokens` for a group
    and the length for a sequence alone, over partitions of the sequences in sorted order into runs (dynamic
    programming, quadratic in the number of sequences).
    """
    order = sorted(range(len(sequences)), key=lambda i: tuple(sequences[i]))
    lengths = [len(sequences[i]) for i in order]
    # common[k]: the common prefix of the k-th and (k+1)-th sequences in sorted order.
    common = [common_prefix_length(sequences[a], sequences[b]) for a, b in itertools.pairwise(order)]
    count = len(order)
    best = [0] * (count + 1)
    start_of = [0] * (count + 1)
    for end in range(1, count + 1):
        best[end], start_of[end] = best[end - 1] + lengths[end - 1], end - 1
        shared, shortest, total = lengths[end - 1], lengths[end - 1], lengths[end - 1]
        for start in range(end - 2, -1, -1):
            shared = min(shared, common[start])
            shortest = min(shortest, lengths[start])
            total += lengths[start]
            prefix = min(shared, shortest - 1)
            if prefix <= GROUP_OVERHEAD_TOKENS:
                break
            cost = best[start] + GROUP_OVERHEAD_TOKENS + prefix + total - prefix * (end - start)
            if cost < best[end]:
                best[end], start_of[end] = cost, start
    groups, alone = [], []
    end = count
    while end > 0:
        start = start_of[end]
        members = [order[k] for k in range(start, end)]
        if len(members) == 1:
            alone.append(members[0])
        else:
            shared = min(min(common[start : end - 1]), min(lengths[start:end]) - 1)
            groups.append(PrefixGroup(tuple(sorted(members)), shared))
        end = start
    return sorted(groups, key=lambda g: g.members), sorted(alone)


def length_buckets(lengths: Sequence[int]) -> list[list[int]]:
    """Indices of `lengths` in batches of similar length, so that padding each batch to its longest costs little.

    Minimises `GROUP_OVERHEAD_TOKENS` per batch plus rows × longest over batches of consecutive lengths in sorted
    order (dynamic programming, quadratic in the count). The completions of one RL prompt run from a few tokens to
    `max_tokens`: one batch padded to the longest computes about twice the tokens that exist.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    best = [0] * (len(order) + 1)
    start_of = [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        longest = lengths[order[end - 1]]
        best[end], start_of[end] = min(
            (best[start] + GROUP_OVERHEAD_TOKENS + longest * (end - start), start) for start in range(end)
        )
    buckets = []
    end = len(order)
    while end > 0:
        buckets.append(order[start_of[end] : end])
        end = start_of[end]
    return buckets[::-1]


@dataclass(frozen=True)
class SharedPrefill:
    """A generation batch's prompts prefilled in two passes: the shared prefixes (one row each), then the rests.

    Prompt j is `prefixes[prefix_of[j]] + suffixes[j]`, and its prefix row went through its own adapter
    (`prefix_adapters`); every suffix has at least one token, so its last position gives the next-token logits.
    """

    prefixes: tuple[tuple[int, ...], ...]
    prefix_adapters: tuple[str | None, ...]
    prefix_of: tuple[int, ...]
    suffixes: tuple[tuple[int, ...], ...]


def plan_shared_prefill(prompts: Sequence[Sequence[int]], adapters: Sequence[str | None]) -> SharedPrefill | None:
    """The two-pass prefill of these prompts, or None when it would compute no fewer positions than one pass.

    A batched prefill pads every row to the longest, so its cost is rows × longest: one pass costs
    `len(prompts) × longest prompt`, two cost `prefix rows × longest prefix + len(prompts) × longest suffix`.
    Prompts share a prefix only with prompts of the same adapter (its keys and values depend on the adapter); a
    prompt that shares with none has all but its last token as its own prefix row.
    """
    if any(len(prompt) < 2 for prompt in prompts):
        return None
    by_adapter: dict[str | None, list[int]] = {}
    for index, adapter in enumerate(adapters):
        by_adapter.setdefault(adapter, []).append(index)
    prefixes: list[tuple[int, ...]] = []
    prefix_adapters: list[str | None] = []
    prefix_of = [0] * len(prompts)
    shares = False
    for adapter, indices in by_adapter.items():
        groups, alone = shared_prefix_groups([prompts[i] for i in indices])
        shares = shares or bool(groups)
        rows = [([indices[m] for m in group.members], group.prefix_length) for group in groups]
        rows += [([indices[m]], len(prompts[indices[m]]) - 1) for m in alone]
        for members, length in rows:
            for member in members:
                prefix_of[member] = len(prefixes)
            prefixes.append(tuple(prompts[members[0]][:length]))
            prefix_adapters.append(adapter)
    if not shares:
        return None
    suffixes = tuple(tuple(prompt[len(prefixes[prefix_of[i]]) :]) for i, prompt in enumerate(prompts))
    one_pass = len(prompts) * max(map(len, prompts))
    two_passes = len(prefixes) * max(map(len, prefixes)) + len(prompts) * max(map(len, suffixes))
    if two_passes >= one_pass:
        return None
    return SharedPrefill(tuple(prefixes), tuple(prefix_adapters), tuple(prefix_of), suffixes)
