"""The lean model's KV cache: preallocated per-layer buffers behind the interface TreeKVCache uses.

:class:`spec_fast.kv_cache.TreeKVCache` reads and rewrites ``cache.layers[i].keys`` / ``.values``
(``[B, H_kv, S, D]``) to truncate or gather the accepted path. Here those attributes are views of the first
``S`` slots of a preallocated buffer: reading costs nothing, assigning a prefix view of the buffer (a
truncation) only moves the length, and :meth:`LeanLayerCache.replace_tail` writes gathered entries in
place. A forward appends its new entries with one copy into the buffer instead of re-concatenating the
whole cache (what HF's ``DynamicCache`` does on every pass). Buffers grow by doubling when full.

The buffers of a layer are the first ``B`` rows of an allocation of ``R >= B`` rows, so that the rows of a
running batch change in place: a departure moves the kept rows up (:meth:`LeanLayerCache.take_rows`), a
joining request is copied into a spare row (:meth:`LeanLayerCache.append_rows`). Reallocating and copying the
whole cache at each of those cost about 6-8 ms at four rows, a step's worth (scratch profile, 1 thread).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from spec_fast.lean import native, watch

__all__ = ["LeanKVCache", "LeanLayerCache", "uninitialised"]

#: slots allocated on first use (doubled whenever a pass needs more)
INITIAL_SLOTS = 256


class LeanLayerCache:
    """Keys and values of one attention layer, ``[B, H_kv, capacity, D]`` buffers (the dtype of the first
    entries stored)."""

    def __init__(self) -> None:
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None
        #: the allocations ``[R, H_kv, capacity, D]`` whose first ``B`` rows ``_keys`` / ``_values`` are
        self._key_rows: torch.Tensor | None = None
        self._value_rows: torch.Tensor | None = None
        #: rows every new allocation holds at least (:meth:`reserve_rows`)
        self.row_hint = 0
        self.key_length = 0
        self.value_length = 0

    @property
    def keys(self) -> torch.Tensor | None:
        return None if self._keys is None else self._keys[:, :, : self.key_length]

    @keys.setter
    def keys(self, new: torch.Tensor) -> None:
        old = self._keys
        self._keys, self.key_length = _assign(self._keys, new)
        if self._keys is not old:  # a new allocation of exactly its rows
            self._key_rows = self._keys
            watch.changed()

    @property
    def values(self) -> torch.Tensor | None:
        return None if self._values is None else self._values[:, :, : self.value_length]

    @values.setter
    def values(self, new: torch.Tensor) -> None:
        old = self._values
        self._values, self.value_length = _assign(self._values, new)
        if self._values is not old:
            self._value_rows = self._values
            watch.changed()

    @property
    def capacity(self) -> int:
        return 0 if self._keys is None else int(self._keys.shape[2])

    @property
    def row_capacity(self) -> int:
        """Rows the allocation holds (``R``, at least the batch's ``B``)."""
        return 0 if self._key_rows is None else int(self._key_rows.shape[0])

    def _use(self, key_rows: torch.Tensor, value_rows: torch.Tensor, batch: int) -> None:
        """Make ``key_rows, value_rows [R, H_kv, capacity, D]`` the allocation and their first ``batch`` rows
        the buffers."""
        watch.changed()  # new buffer tensors: a kept layer stack points elsewhere
        self._key_rows, self._value_rows = key_rows, value_rows
        self._keys, self._values = key_rows[:batch], value_rows[:batch]

    def _allocate(self, like: torch.Tensor, batch: int, capacity: int) -> None:
        """A new allocation of ``like``'s dtype, heads and head size: at least ``batch`` rows (more where
        :attr:`row_hint` or the old allocation held more) and ``capacity`` slots, the first ``batch`` rows
        holding the old buffers' ``key_length`` entries."""
        rows = max(batch, self.row_hint, self.row_capacity)
        _, heads, _, dim = like.shape
        key_rows = uninitialised(like, rows, heads, capacity, dim)
        value_rows = uninitialised(like, rows, heads, capacity, dim)
        if self._keys is not None and self._values is not None and self.key_length > 0:
            kept = min(batch, int(self._keys.shape[0]))
            key_rows[:kept, :, : self.key_length] = self._keys[:kept, :, : self.key_length]
            value_rows[:kept, :, : self.value_length] = self._values[:kept, :, : self.value_length]
        self._use(key_rows, value_rows, batch)

    def reserve_rows(self, rows: int) -> None:
        """Allocate room for ``rows`` rows (now where the buffers exist, else at their first allocation), so
        that requests joining later are copied into place instead of the whole cache into a new allocation."""
        self.row_hint = max(self.row_hint, rows)
        if self._keys is not None and self.row_capacity < rows:
            self._allocate(self._keys, int(self._keys.shape[0]), self.capacity)

    def take_rows(self, rows: list[int], length: int) -> None:
        """Keep only rows ``rows`` (in that order) and the first ``length`` slots of each, moving the kept
        rows inside the allocation: only a row whose position changes is copied, so a departure whose hole
        the last row fills (the order :class:`~spec_fast.engine.batch_engine.BatchEngine` keeps) copies one
        row."""
        if self._key_rows is None or self._value_rows is None:
            return
        length = min(length, self.key_length)
        key_rows, value_rows = self._key_rows, self._value_rows
        moves = [(i, b) for i, b in enumerate(rows) if b != i]
        destinations = {i for i, _ in moves}
        if all(b not in destinations for _, b in moves) or all(a < b for a, b in zip(rows, rows[1:])):
            # no move reads a row another move writes first (increasing rows: row rows[i] >= i is read before
            # any write reaches it)
            for i, b in moves:
                key_rows[i, :, :length] = key_rows[b, :, :length]
                value_rows[i, :, :length] = value_rows[b, :, :length]
        elif moves:
            targets = torch.tensor([i for i, _ in moves], dtype=torch.long, device=key_rows.device)
            sources = torch.tensor([b for _, b in moves], dtype=torch.long, device=key_rows.device)
            key_rows[:, :, :length].index_copy_(0, targets, key_rows[:, :, :length].index_select(0, sources))
            value_rows[:, :, :length].index_copy_(0, targets, value_rows[:, :, :length].index_select(0, sources))
        self._use(key_rows, value_rows, len(rows))
        self.key_length = self.value_length = length

    def append_rows(self, other: LeanLayerCache, own_rows: int, joining_rows: int, length: int) -> None:
        """Put ``other``'s ``joining_rows`` rows behind this layer's ``own_rows``, every row ``length`` slots
        long: the slots past a row's old length up to ``length`` are zeros, as a padded cache's are (an
        attention that does not skip masked slots multiplies them by zero)."""
        like = self._keys if self._keys is not None else other._keys
        if like is None:
            return
        rows = own_rows + joining_rows
        own_length = self.key_length if self._keys is not None else 0
        their_length = other.key_length if other._keys is not None else 0
        # the allocation can take the joining rows as they are (no allocation without buffers: _key_rows is None
        # exactly while _keys is)
        compatible = self._key_rows is not None and (other._keys is None or (
            other._keys.dtype == self._key_rows.dtype and other._keys.shape[1] == self._key_rows.shape[1]
            and other._keys.shape[3] == self._key_rows.shape[3]))
        if not compatible or rows > self.row_capacity or length > self.capacity:
            # twice the rows it had: while requests keep joining one by one, every other join fits
            self.row_hint = max(self.row_hint, rows, 2 * own_rows)
            self._allocate(like, own_rows, self._capacity_for(length))
        assert self._key_rows is not None and self._value_rows is not None
        key_rows, value_rows = self._key_rows, self._value_rows
        if own_rows > 0 and own_length < length:
            key_rows[:own_rows, :, own_length:length] = 0
            value_rows[:own_rows, :, own_length:length] = 0
        if other._keys is not None and other._values is not None and their_length > 0:
            key_rows[own_rows:rows, :, :their_length] = other._keys[:, :, :their_length]
            value_rows[own_rows:rows, :, :their_length] = other._values[:, :, :their_length]
        if their_length < length:
            key_rows[own_rows:rows, :, their_length:length] = 0
            value_rows[own_rows:rows, :, their_length:length] = 0
        self._use(key_rows, value_rows, rows)
        self.key_length = self.value_length = length

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``keys, values [B, H_kv, Q, D]`` behind the current entries -> every entry ``[B, H_kv, S + Q, D]``."""
        length = self.key_length
        needed = length + int(keys.shape[2])
        if self._keys is None or self._values is None or needed > self.capacity:
            self._grow(keys, needed)
        assert self._keys is not None and self._values is not None
        self._keys[:, :, length:needed] = keys
        self._values[:, :, length:needed] = values
        self.key_length = self.value_length = needed
        return self._keys[:, :, :needed], self._values[:, :, :needed]

    def reserve(self, batch: int, heads: int, dim: int, needed: int, dtype: torch.dtype,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The whole ``[B, H_kv, capacity, D]`` key and value buffers, grown to hold ``needed`` slots, for a
        caller that writes new entries into them itself (then sets ``key_length``/``value_length``); None if
        the buffers hold another batch size, head layout or dtype."""
        if self._keys is None or self._values is None or needed > self.capacity:
            if self._keys is not None and (self._keys.dtype != dtype or self._keys.shape[0] != batch):
                return None
            self._grow(torch.empty(batch, heads, 0, dim, dtype=dtype, device=device), needed)
        assert self._keys is not None and self._values is not None
        keys, values = self._keys, self._values
        if keys.dtype != dtype or tuple(keys.shape[:2]) != (batch, heads) or keys.shape[3] != dim:
            return None
        if not (keys.is_contiguous() and values.is_contiguous()):
            return None
        return keys, values

    def replace_tail(self, start: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Keep slots ``[0, start)`` and put ``keys, values [B, H_kv, W, D]`` at ``[start, start + W)``."""
        end = start + int(keys.shape[2])
        if self._keys is None or self._values is None or end > self.capacity:
            self._grow(keys, end)
        assert self._keys is not None and self._values is not None
        self._keys[:, :, start:end] = keys
        self._values[:, :, start:end] = values
        self.key_length = self.value_length = end

    def _grow(self, like: torch.Tensor, needed: int) -> None:
        self._allocate(like, int(like.shape[0]), self._capacity_for(needed))

    def _capacity_for(self, needed: int) -> int:
        """Slots of a new allocation holding ``needed``: the capacity doubled from the current one (at least
        ``INITIAL_SLOTS``) until it does."""
        capacity = max(INITIAL_SLOTS, self.capacity)
        while capacity < needed:
            capacity *= 2
        return capacity


def uninitialised(like: torch.Tensor, *shape: int) -> torch.Tensor:
    """A cache buffer of ``like``'s dtype and device, not zeroed: no slot at or past a layer's length is read
    before a pass writes it (the views end at the length; the native layer reads only the slots it attends).
    Zeroing 256 or more slots per buffer made each join or departure of a request write as many bytes as a
    step reads. The tests fill these with NaN to show that no slot is read early."""
    return like.new_empty(*shape)


def _assign(buffer: torch.Tensor | None, new: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Make ``new [B, H, S, D]`` the content of ``buffer`` -> (buffer, S); a prefix view of the buffer
    itself (a truncation) is free, anything else is copied in."""
    length = int(new.shape[2])
    if (
        buffer is not None
        and new.data_ptr() == buffer.data_ptr()
        and new.stride() == buffer.stride()
        and new.shape[:2] == buffer.shape[:2]
        and new.shape[3] == buffer.shape[3]
    ):
        return buffer, length
    if buffer is None or buffer.shape[0] != new.shape[0] or length > buffer.shape[2]:
        capacity = max(INITIAL_SLOTS, length)
        fresh = uninitialised(new, int(new.shape[0]), int(new.shape[1]), capacity, int(new.shape[3]))
        fresh[:, :, :length] = new
        return fresh, length
    buffer[:, :, :length] = new
    return buffer, length


class LeanKVCache:
    """One :class:`LeanLayerCache` per decoder layer (``layers``, as HF caches name them)."""

    def __init__(self, num_layers: int) -> None:
        self.layers = [LeanLayerCache() for _ in range(num_layers)]
        self._layer_stack: native.LayerStack | None = None
        #: the change count (spec_fast.lean.watch) and the model's layers when _layer_stack was last checked
        self._stack_checked: tuple[int, tuple[object, ...]] | None = None
        self._cache_buffers: native.CacheBuffers | None = None

    def layer_stack(self, calls: list[tuple[native.LayerWeights, torch.Tensor, torch.Tensor]],
                    layers: Sequence[object] = ()) -> native.LayerStack:
        """``calls`` (each layer's weights and buffers for this pass, checked by the model's ``layers``) as a
        :class:`~spec_fast.lean.native.LayerStack`: the last pass's when every struct and buffer is the same
        object as then (what it checked still holds), else a new one, kept for the next pass."""
        kept = self._layer_stack
        if kept is None or len(kept.layers) != len(calls) or any(
                new is not old for call, then in zip(calls, kept.layers) for new, old in zip(call, then)):
            kept = self._layer_stack = native.LayerStack(calls)
            # the buffers may have changed: a kept move would hold the old ones alive
            self._cache_buffers = None
        self._stack_checked = (watch.changes(), tuple(layers))
        return kept

    def native_stack(self, layers: Sequence[Any], x: torch.Tensor, mask: torch.Tensor | None
                     ) -> native.LayerStack | None:
        """The decoder ``layers``' stack for one :func:`~spec_fast.lean.native.run_layers` call over ``x [B, Q,
        H]`` behind this cache: the kept one where :meth:`kept_stack` can serve the pass, else every layer's
        ``native_call`` (which grows its buffers) as :meth:`layer_stack`; None where any layer would not run
        natively on its own, or the mask ``[B, 1, Q, K]`` would need a conversion."""
        if len(self.layers) != len(layers) or (mask is not None and (mask.dtype != torch.float32
                                                                     or not mask.is_contiguous())):
            return None
        batch, num_query = int(x.shape[0]), int(x.shape[1])
        needed = self.get_seq_length() + num_query
        if x.device.type == "cpu" and x.dtype == torch.float32 and (
                mask is None or tuple(mask.shape) == (batch, 1, num_query, needed)):
            kept = self.kept_stack(layers, batch, needed)
            if kept is not None:
                return kept
        calls = []
        for layer, layer_cache in zip(layers, self.layers):
            call = layer.native_call(x, mask, layer_cache)
            if call is None:
                return None
            calls.append(call)
        return self.layer_stack(calls, layers)

    def kept_stack(self, layers: Sequence[object], batch: int, needed: int) -> native.LayerStack | None:
        """The stack :meth:`layer_stack` last returned, without checking its layers again, where nothing has
        changed since (the count of :mod:`spec_fast.lean.watch`: no lean module and no lean cache buffer
        anywhere), ``layers`` are the same objects, and its buffers hold ``batch`` rows and ``needed`` slots;
        else None (the caller checks every layer)."""
        kept, checked = self._layer_stack, self._stack_checked
        if kept is None or checked is None or checked[0] != watch.changes() or kept.batch != batch:
            return None
        if kept.capacity < needed or len(checked[1]) != len(layers):
            return None
        return kept if all(a is b for a, b in zip(checked[1], layers)) else None

    def reserve_rows(self, rows: int) -> None:
        """Room for ``rows`` rows in every layer (:meth:`LeanLayerCache.reserve_rows`)."""
        for layer in self.layers:
            layer.reserve_rows(rows)

    def take_rows(self, rows: list[int], length: int) -> None:
        """Keep only rows ``rows`` (in that order), ``length`` slots each, in place in every layer."""
        for layer in self.layers:
            layer.take_rows(rows, length)

    def append_rows(self, other: LeanKVCache, own_rows: int, joining_rows: int, length: int) -> None:
        """``other``'s rows behind this cache's in every layer (:meth:`LeanLayerCache.append_rows`)."""
        if len(other.layers) != len(self.layers):
            raise ValueError(f"append_rows needs caches of the same model: {len(self.layers)} vs "
                             f"{len(other.layers)} layers")
        for mine, theirs in zip(self.layers, other.layers):
            mine.append_rows(theirs, own_rows, joining_rows, length)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.layers[layer_idx].key_length

    def move_entries(self, source: torch.Tensor, target: torch.Tensor, counts: torch.Tensor, length: int) -> bool:
        """Per row ``b``, the entries at slots ``source[b, :counts[b]]`` moved to ``target[b, :counts[b]]`` in
        every layer (all read before any is written), then ``length`` entries kept: one native call for the
        whole cache (:func:`spec_fast.lean.native.move_entries`). False, with nothing done, where that call
        cannot serve these buffers (no native library, not float32 or float16 CPU buffers of one shape and
        dtype); the caller then moves the entries itself."""
        if not self.layers or not native.available():
            return False
        buffers = [(layer._keys, layer._values) for layer in self.layers]
        kept = self._cache_buffers
        if kept is None or len(kept) != len(buffers) or any(
                k is not kept_k or v is not kept_v for (k, v), (kept_k, kept_v) in zip(buffers, kept.buffers)):
            first = buffers[0][0]
            if first is None or first.dtype not in native.CACHE_DTYPES or first.device.type != "cpu" or any(
                    k is None or v is None or k.shape != first.shape or v.shape != first.shape
                    or k.dtype != first.dtype or v.dtype != first.dtype
                    or not (k.is_contiguous() and v.is_contiguous()) for k, v in buffers):
                return False
            # checked once per set of buffers (60 checks in Python cost a few percent of a ragged step)
            kept = self._cache_buffers = native.CacheBuffers([(k, v) for k, v in buffers
                                                              if k is not None and v is not None])
        native.move_entries(kept, source.contiguous(), target.contiguous(), counts.contiguous())
        for layer in self.layers:
            layer.key_length = layer.value_length = length
        return True

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` entries of every layer (at most what each holds): a commit of a block
        prefix, which moves only the lengths."""
        for layer in self.layers:
            layer.key_length = min(layer.key_length, length)
            layer.value_length = min(layer.value_length, length)
