"""Prefix caching: a new request reuses the target's cache entries of a prompt prefix it shares with an
earlier request, and the prefill computes only the rest of its prompt.

Chat prompts share their template's opening (SmolLM2's default system message is 24 of the ~38 tokens of
a short chat prompt), and a server sees the same instructions, documents and few-shot examples again and
again. An entry's keys and values at position ``i`` depend only on tokens ``0..i``; with a target whose
rows are computed independently of what shares their pass (:func:`reuse_is_exact`), the stored entries are
bit for bit those a prefill of the new prompt would write, and the rest of the prompt, forwarded behind
them, attends to exactly the same keys and values in the same order. Reusing a prefix therefore changes
no logit, no token and no random draw of any request; it only skips work (docs/engine.md section 10).

:class:`PrefixCache` keeps the committed entries of recent prompts, least recently used first out, within a
budget of cached tokens. It is owned by one :class:`~spec_fast.engine.batch_engine.BatchEngine` and, like
it, used from one thread.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["PrefixCache", "PrefixMatch", "reuse_is_exact", "DEFAULT_PREFIX_CACHE_TOKENS", "MIN_PREFIX_TOKENS"]

#: the default budget of cached prompt tokens (SmolLM2-135M: 46 KB of float32 keys and values per token, so
#: about 94 MB)
DEFAULT_PREFIX_CACHE_TOKENS = 2048
#: the shortest prefix worth reusing: a few tokens save less prefill than the copy and the ragged pass cost
MIN_PREFIX_TOKENS = 8


def reuse_is_exact(target: Any, device: torch.device) -> bool:
    """Whether reused entries equal recomputed ones bit for bit for ``target`` on ``device``: the lean CPU
    model computes each row of a pass on its own and attends over a row's attended slots in slot order
    whatever padding the pass holds (:mod:`spec_fast.lean`); other targets pick kernels by shape."""
    return device.type == "cpu" and callable(getattr(target, "make_tree_cache", None)) and hasattr(
        target, "kv_cache_dtype")


@dataclass(frozen=True)
class PrefixMatch:
    """The reusable part of one prompt: its first ``length`` tokens' entries, per layer ``(keys, values)``
    each ``[H_kv, length, D]`` (``length`` 0: nothing to reuse, ``layers`` empty)."""

    length: int
    layers: tuple[tuple[torch.Tensor, torch.Tensor], ...]


_NO_MATCH = PrefixMatch(0, ())


@dataclass
class _Entry:
    tokens: tuple[int, ...]
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # per layer [H_kv, len(tokens), D] each
    dtype: torch.dtype


class PrefixCache:
    """The target cache entries of recent prompts, for reuse by later prompts that share a prefix.

    ``max_tokens``: the most prompt tokens held (least recently used prompts leave first; a prompt longer
    than the budget is not stored); ``min_tokens``: the shortest shared prefix that is reused. Counters:
    ``lookups`` (prompts looked up), ``hits`` (those that reused a prefix), ``reused_tokens`` (prompt tokens
    not prefilled thanks to it)."""

    def __init__(self, max_tokens: int = DEFAULT_PREFIX_CACHE_TOKENS, min_tokens: int = MIN_PREFIX_TOKENS) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
            raise ValueError(f"max_tokens must be an integer >= 0, got max_tokens={max_tokens!r}")
        if isinstance(min_tokens, bool) or not isinstance(min_tokens, int) or min_tokens < 1:
            raise ValueError(f"min_tokens must be an integer >= 1, got min_tokens={min_tokens!r}")
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens
        self._entries: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()  # least recently used first
        self.cached_tokens = 0
        self.lookups = 0
        self.hits = 0
        self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, prompt: Sequence[int], dtype: torch.dtype) -> PrefixMatch:
        """The longest stored prefix of ``prompt`` held in ``dtype``, leaving at least the prompt's last token
        to compute (its logits start decoding); no match below ``min_tokens`` tokens."""
        self.lookups += 1
        limit = len(prompt) - 1
        best, best_length = None, 0
        for entry in self._entries.values():
            if entry.dtype != dtype:
                continue
            length = _common_prefix(entry.tokens, prompt, limit)
            if length > best_length:
                best, best_length = entry, length
        if best is None or best_length < self.min_tokens:
            return _NO_MATCH
        self._entries.move_to_end(best.tokens)
        self.hits += 1
        self.reused_tokens += best_length
        return PrefixMatch(best_length, tuple((k[:, :best_length], v[:, :best_length]) for k, v in best.layers))

    def store(self, prompt: Sequence[int], layers: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Keep ``prompt``'s committed entries (per layer ``(keys, values)`` each ``[H_kv, len(prompt), D]``;
        copied). A stored prompt that ``prompt`` extends is replaced by it; a prompt already covered by a
        stored one is only marked recently used."""
        tokens = tuple(int(t) for t in prompt)
        if not tokens or len(tokens) > self.max_tokens or not layers:
            return
        dtype = layers[0][0].dtype
        for key, entry in list(self._entries.items()):
            if entry.dtype != dtype:
                continue
            if len(entry.tokens) >= len(tokens) and entry.tokens[: len(tokens)] == tokens:
                self._entries.move_to_end(key)
                return
            if len(entry.tokens) < len(tokens) and tokens[: len(entry.tokens)] == entry.tokens:
                self._drop(key)
        for k, v in layers:
            if int(k.shape[1]) != len(tokens) or tuple(v.shape) != tuple(k.shape):
                raise ValueError(f"layers must hold [H_kv, {len(tokens)}, D] keys and values, got "
                                 f"{tuple(k.shape)} and {tuple(v.shape)}")
        self._entries[tokens] = _Entry(tokens, [(k.clone(), v.clone()) for k, v in layers], dtype)
        self.cached_tokens += len(tokens)
        while self.cached_tokens > self.max_tokens:
            self._drop(next(iter(self._entries)))

    def clear(self) -> None:
        self._entries.clear()
        self.cached_tokens = 0

    def _drop(self, key: tuple[int, ...]) -> None:
        self.cached_tokens -= len(self._entries.pop(key).tokens)


def _common_prefix(stored: tuple[int, ...], prompt: Sequence[int], limit: int) -> int:
    """The number of leading tokens ``stored`` and ``prompt`` share, at most ``limit``."""
    most = min(len(stored), limit)
    n = 0
    while n < most and stored[n] == prompt[n]:
        n += 1
    return n
