"""One count of changes to the lean model's modules and KV caches, for what holds raw pointers into them.

The native layers run from a struct of raw pointers per layer (weights, biases, norms) and the cache's
buffers (:class:`spec_fast.lean.native.LayerStack`). Checking every tensor behind those pointers before each
pass cost about 0.4 ms of a 6.5 ms one-token pass of SmolLM2 on a Zen 4 core: after a pass has streamed
~97 MB of weights, the Python objects that check walks (30 layers of modules, dictionaries and tensors) are
no longer in the CPU's caches. Instead, every lean module counts its own changes here (attribute
assignment and deletion, registering a buffer, parameter or submodule, conversions such as ``.to()``), and
so does every cache buffer replaced by a new tensor; a pass reuses the last pass's stack only while the
count has not moved (:meth:`spec_fast.lean.cache.LeanKVCache.kept_stack`).

Changes made past the module's methods are not counted: assigning a tensor's ``.data``, or writing a
module's ``_buffers`` or ``_parameters`` dictionary directly. Call :func:`changed` after such a change.
"""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["WatchedModule", "changed", "changes"]

_changes = 0


def changed() -> None:
    """Count a change: the next pass rebuilds its pointer structs from the modules."""
    global _changes
    _changes += 1


def changes() -> int:
    """The number of changes counted so far."""
    return _changes


class WatchedModule(nn.Module):
    """An ``nn.Module`` that counts its own changes (:func:`changed`)."""

    def __setattr__(self, name: str, value: Any) -> None:
        changed()
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        changed()
        super().__delattr__(name)

    def register_buffer(self, *args: Any, **kwargs: Any) -> None:
        changed()
        super().register_buffer(*args, **kwargs)

    def register_parameter(self, *args: Any, **kwargs: Any) -> None:
        changed()
        super().register_parameter(*args, **kwargs)

    def add_module(self, *args: Any, **kwargs: Any) -> None:
        changed()
        super().add_module(*args, **kwargs)

    def _apply(self, *args: Any, **kwargs: Any) -> Any:
        # .to(), .float(), .half(), ...: parameters may get new storage under the same tensor object. Counted
        # before the conversion, like every other change: nothing checks a stack in between, and a conversion
        # that fails halfway is counted too
        changed()
        return super()._apply(*args, **kwargs)  # type: ignore[no-untyped-call]
