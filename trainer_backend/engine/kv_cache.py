"""A KV cache for generation that is allocated once, at its final length, instead of growing by concatenation.

Transformers' `DynamicCache` appends each decode step's keys and values with `torch.cat`, copying the whole cache
of every layer at every step: on a CPU that was a fifth of a decode step at 32 rows. A generation knows its final
length (prompt plus `max_tokens`), so each layer here writes into a buffer of that length and hands attention a
view of the filled part. Rows that stop are dropped as from a dynamic cache, the rest moved up in place.

Sliding-window layers keep their whole history only while it stays inside the window, which is when they equal a
full layer; a generation that would outgrow the window keeps transformers' own sliding layer for them.
"""

from __future__ import annotations

import copy

from torch import Tensor
from transformers import Cache, DynamicCache, PretrainedConfig
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer


class _PreallocatedLayer(DynamicLayer):
    """A full-attention layer whose keys and values are views of buffers `capacity` positions long."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        batch, heads, _, width = key_states.shape
        self.device = key_states.device
        self._key_buffer = key_states.new_empty((batch, heads, self.capacity, width))
        self._value_buffer = value_states.new_empty((batch, heads, self.capacity, value_states.shape[-1]))
        self._views(0)
        self.is_initialized = True

    def _views(self, length: int) -> None:
        self.keys = self._key_buffer[:, :, :length]
        self.values = self._value_buffer[:, :, :length]

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.keys.shape[-2]
        end = start + key_states.shape[-2]
        if end > self._key_buffer.shape[-2]:
            raise ValueError(f"the cache holds {self.capacity} positions; {end} were asked for")
        self._key_buffer[:, :, start:end] = key_states
        self._value_buffer[:, :, start:end] = value_states
        self._views(end)
        return self.keys, self.values

    def batch_select_indices(self, indices: Tensor) -> None:
        # Rows that stop leave: the kept ones move to the front of the same buffers. A new pair of buffers each time
        # rows stop left the allocator holes the next, smaller pair did not fit, and the backend grew through a
        # generation batch (docs/reliability.md, "Memory of the Gemma trial"). Selecting more rows than there are (a
        # prompt's cache repeated for its samples) makes new ones. Only the filled positions are copied: the rest
        # of a buffer is never read, and a generation that takes in more rows keeps room for them there.
        if self.is_initialized:
            length = self.keys.shape[-2]
            for name in ("_key_buffer", "_value_buffer"):
                buffer = getattr(self, name)
                selected = buffer[indices, :, :length]
                if len(selected) <= len(buffer):
                    kept = buffer[: len(selected)]
                else:
                    kept = buffer.new_empty((len(selected), *buffer.shape[1:]))
                kept[:, :, :length] = selected
                setattr(self, name, kept)
            self._views(length)

    def append_rows(self, other: _PreallocatedLayer, length: int) -> None:
        """Take in `other`'s rows after this layer's own, both right-aligned at `length` positions (at least either
        layer's): each row's positions move to the end, and the positions before them hold zeros, which its attention
        mask leaves out (masked garbage could still be NaN, and NaN times a zero weight is NaN)."""
        for name in ("_key_buffer", "_value_buffer"):
            mine, theirs = getattr(self, name), getattr(other, name)
            own_length, their_length = self.keys.shape[-2], other.keys.shape[-2]
            joined = mine.new_empty((len(mine) + len(theirs), *mine.shape[1:]))
            for rows, source, filled in (
                (joined[: len(mine)], mine, own_length),
                (joined[len(mine) :], theirs, their_length),
            ):
                rows[:, :, : length - filled] = 0
                rows[:, :, length - filled : length] = source[:, :, :filled]
            setattr(self, name, joined)
        self._views(length)

    def drop_leading(self, count: int) -> None:
        """Forget the first `count` positions of every row: the rest move to the front of the same buffers."""
        length = self.keys.shape[-2]
        for buffer in (self._key_buffer, self._value_buffer):
            # A copy first: the source and the destination overlap.
            buffer[:, :, : length - count] = buffer[:, :, count:length].clone()
        self._views(length - count)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            length = self.keys.shape[-2]
            self._key_buffer = self._key_buffer.repeat_interleave(repeats, dim=0)
            self._value_buffer = self._value_buffer.repeat_interleave(repeats, dim=0)
            self._views(length)


class _PreallocatedWindowLayer(_PreallocatedLayer, DynamicSlidingWindowLayer):
    """A sliding-window layer that never reaches its window: a full layer that reports its length as one."""

    def __init__(self, capacity: int, sliding_window: int) -> None:
        DynamicSlidingWindowLayer.__init__(self, sliding_window=sliding_window)
        self.capacity = capacity

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        _PreallocatedLayer.lazy_initialization(self, key_states, value_states)
        self._sliding_window_tensor = self._sliding_window_tensor.to(self.device)

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        self.cumulative_length += key_states.shape[-2]
        return _PreallocatedLayer.update(self, key_states, value_states)

    def append_rows(self, other: _PreallocatedLayer, length: int) -> None:
        _PreallocatedLayer.append_rows(self, other, length)
        self.cumulative_length = length

    def drop_leading(self, count: int) -> None:
        _PreallocatedLayer.drop_leading(self, count)
        self.cumulative_length -= count


def preallocated_cache(config: PretrainedConfig, capacity: int) -> DynamicCache:
    """A cache for one generation of at most `capacity` positions (prompt and new tokens, padding included)."""
    cache = DynamicCache(config=config)
    layers = []
    for layer in cache.layers:
        if isinstance(layer, DynamicSlidingWindowLayer):
            # Within the window a sliding layer keeps every position; past it, transformers' own layer drops them.
            fits = capacity < layer.sliding_window
            layers.append(_PreallocatedWindowLayer(capacity, layer.sliding_window) if fits else layer)
        elif type(layer) is DynamicLayer:
            layers.append(_PreallocatedLayer(capacity))
        else:
            layers.append(layer)
    cache.layers = layers
    return cache


def joinable_capacity(cache: Cache) -> int | None:
    """The positions every row of `cache` may reach if it can take in another cache's rows (`append_rows`): each of
    its layers holds preallocated buffers; None otherwise (a sliding layer past its window, a layer not filled)."""
    layers = cache.layers
    if not layers or not all(isinstance(layer, _PreallocatedLayer) and layer.is_initialized for layer in layers):
        return None
    return min(layer.capacity for layer in layers)


def append_rows(cache: Cache, other: Cache) -> int:
    """Take `other`'s rows into `cache`, after its own, both right-aligned at the longer of their lengths, which it
    returns; a row's attention mask gains zeros in front for the positions it moved by. Both must be joinable
    (`joinable_capacity`) and the length must fit `cache`'s capacity."""
    length = max(cache.get_seq_length(), other.get_seq_length())
    for mine, theirs in zip(cache.layers, other.layers, strict=True):
        mine.append_rows(theirs, length)
    return length


def drop_leading_positions(cache: Cache, count: int) -> None:
    """Forget the first `count` positions of every row of a joinable cache (`joinable_capacity`), which no row's
    attention mask may let in: positions of rows that have left, padding before the rows that joined later."""
    for layer in cache.layers:
        layer.drop_leading(count)


def repeated_cache(cache: Cache, repeats: int) -> Cache:
    """A new cache holding each row of `cache` `repeats` times, leaving `cache` as it is.

    Several batches can then continue one prefix (a training pass runs a prompt's completions in batches of similar
    length), and a gradient through any of them flows back into the prefix's keys and values. The layers are copied
    shallowly: repeating assigns new tensors to the copy, and later updates concatenate, never writing in place.
    """
    copied = _shallow_copy(cache)
    copied.batch_repeat_interleave(repeats)
    return copied


def copied_cache(cache: Cache) -> Cache:
    """A copy of `cache` with keys and values of its own: prefilling either leaves the other as it is."""
    copied = _shallow_copy(cache)
    for layer in copied.layers:
        if not layer.is_initialized:
            continue
        if isinstance(layer, _PreallocatedLayer):
            # Its keys and values are views of buffers it writes into in place.
            layer._key_buffer, layer._value_buffer = layer._key_buffer.clone(), layer._value_buffer.clone()
            layer._views(layer.keys.shape[-2])
        else:
            layer.keys, layer.values = layer.keys.clone(), layer.values.clone()
    return copied


def cut_cache(cache: Cache) -> tuple[Cache, list[tuple[Tensor, Tensor]]]:
    """A copy of `cache` whose keys and values are new leaves of the autograd graph, and (original, leaf) pairs.

    Batches that continue the copy leave their gradients on the leaves, to be sent through the original graph in
    one backward (`torch.autograd.backward(originals, leaf gradients)`) once they are all done.
    """
    copied = _shallow_copy(cache)
    cut = []
    for layer in copied.layers:
        if layer.is_initialized:
            for name in ("keys", "values"):
                original = getattr(layer, name)
                leaf = original.detach().requires_grad_(original.requires_grad)
                setattr(layer, name, leaf)
                cut.append((original, leaf))
    return copied, cut


def _shallow_copy(cache: Cache) -> Cache:
    """A cache with layers of its own that still hold `cache`'s tensors: assigning new ones leaves `cache` as it is."""
    copied = copy.copy(cache)
    copied.layers = [copy.copy(layer) for layer in cache.layers]
    return copied
