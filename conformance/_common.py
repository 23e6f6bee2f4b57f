"""Small helpers shared by the rule modules: residuals, argmax, and the law of the engines' sampling primitives.

Every rule module writes its engine's acceptance rule from that engine's public code contract in the kit's call
signature (:mod:`spec_ref.testing`), drawing its randomness through the spec_ref RNG protocol where the rule's
randomness can be enumerated. The helpers work on Fractions (exact mode) and floats alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["argmax", "categorical", "exponential_race", "one_hot_rows", "positive_part", "without"]


def positive_part(a: Sequence[Any], b: Sequence[Any], scale: Any = 1) -> list[Any]:
    """``max(scale * a - b, 0)`` elementwise (an unnormalised residual)."""
    return [max(scale * x - y, 0) for x, y in zip(a, b)]


def without(row: Sequence[Any], tokens: Sequence[int]) -> list[Any]:
    """``row`` with the entries of ``tokens`` set to 0 (not renormalised)."""
    removed = set(tokens)
    return [0 if i in removed else x for i, x in enumerate(row)]


def argmax(row: Sequence[Any]) -> int:
    """The index of the largest entry, the lowest index on ties (``torch.argmax`` and ``np.argmax`` agree)."""
    best = 0
    for i, x in enumerate(row):
        if x > row[best]:
            best = i
    return best


def categorical(rng: Any, weights: Sequence[Any]) -> int:
    """One draw of ``weights / sum(weights)`` from the spec_ref RNG source ``rng``."""
    return int(rng.categorical(np.asarray(list(weights))))


def exponential_race(rng: Any, weights: Sequence[Any]) -> int:
    """The law of ``argmax(weights / E)`` with ``E`` i.i.d. Exp(1), the recovered-token sampler of vLLM.

    The index with the largest ``w_i / E_i`` is the one whose Exp(rate w_i) clock rings first, so the draw has
    law ``weights / sum(weights)`` (no normalisation needed). When every weight is 0 all ratios are 0 and the
    argmax is index 0.
    """
    if not sum(weights) > 0:
        return 0
    return categorical(rng, weights)


def one_hot_rows(tokens: Sequence[int], vocab_size: int) -> list[list[int]]:
    """Point masses at ``tokens``: the draft law an engine assumes when it has no draft probabilities."""
    return [[int(i == t) for i in range(vocab_size)] for t in tokens]
