"""The lean model's KV cache: preallocated per-layer buffers behind the interface TreeKVCache uses.

:class:`spec_fast.kv_cache.TreeKVCache` reads and rewrites ``cache.layers[i].keys`` / ``.values``
(``[B, H_kv, S, D]``) to truncate or gather the accepted path. Here those attributes are views of the first
``S`` slots of a preallocated buffer: reading costs nothing, assigning a prefix view of the buffer (a
truncation) only moves the length, and :meth:`LeanLayerCache.replace_tail` writes gathered entries in
place. A forward appends its new entries with one copy into the buffer instead of re-concatenating the
whole cache (what HF's ``DynamicCache`` does on every pass). Buffers grow by doubling when full.
"""

from __future__ import annotations

import torch

from spec_fast.lean import native

__all__ = ["LeanKVCache", "LeanLayerCache", "uninitialised"]

#: slots allocated on first use (doubled whenever a pass needs more)
INITIAL_SLOTS = 256


class LeanLayerCache:
    """Keys and values of one attention layer, ``[B, H_kv, capacity, D]`` buffers (the dtype of the first
    entries stored)."""

    def __init__(self) -> None:
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None
        self.key_length = 0
        self.value_length = 0

    @property
    def keys(self) -> torch.Tensor | None:
        return None if self._keys is None else self._keys[:, :, : self.key_length]

    @keys.setter
    def keys(self, new: torch.Tensor) -> None:
        self._keys, self.key_length = _assign(self._keys, new)

    @property
    def values(self) -> torch.Tensor | None:
        return None if self._values is None else self._values[:, :, : self.value_length]

    @values.setter
    def values(self, new: torch.Tensor) -> None:
        self._values, self.value_length = _assign(self._values, new)

    @property
    def capacity(self) -> int:
        return 0 if self._keys is None else int(self._keys.shape[2])

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
        capacity = max(INITIAL_SLOTS, self.capacity)
        while capacity < needed:
            capacity *= 2
        batch, heads, _, dim = like.shape
        old_keys, old_values = self._keys, self._values
        self._keys = uninitialised(like, batch, heads, capacity, dim)
        self._values = uninitialised(like, batch, heads, capacity, dim)
        if old_keys is not None and old_values is not None:
            self._keys[:, :, : self.key_length] = old_keys[:, :, : self.key_length]
            self._values[:, :, : self.value_length] = old_values[:, :, : self.value_length]


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
        self._cache_buffers: native.CacheBuffers | None = None

    def layer_stack(self, calls: list[tuple[native.LayerWeights, torch.Tensor, torch.Tensor]]) -> native.LayerStack:
        """``calls`` (each layer's weights and buffers for this pass) as a :class:`~spec_fast.lean.native.LayerStack`:
        the last pass's when every struct and buffer is the same object as then (what it checked still holds),
        else a new one, kept for the next pass."""
        kept = self._layer_stack
        if kept is None or len(kept.layers) != len(calls) or any(
                new is not old for call, then in zip(calls, kept.layers) for new, old in zip(call, then)):
            kept = self._layer_stack = native.LayerStack(calls)
            # the buffers may have changed: a kept move would hold the old ones alive
            self._cache_buffers = None
        return kept

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
