"""Formulas of the project's seed papers that docs/algorithms.md shows to be lossy as written.

Each is written here literally, as a verifier in the kit's signature, so the kit can show what the docs claim
(docs/algorithms.md sections 3.3, 3.4, 5.2 and 7; docs/papers.md describes the seeds):

* seed 002 section 3.1 describes block verification as accepting each drafted node independently with its
  prefix weight ``w_i = min(1, w_{i-1} p(x_i) / q(x_i))``, keeping the deepest accepted node and drawing the
  next token from ``(w_tau p - q)+`` (Sun et al., arXiv 2403.10444, accept with ``h_i``, not ``w_i``);
* seed 002 Algorithm 14 (the SpecInfer branching law, the law of the output given the drafts) indexes the
  acceptance ratio one round late; used as a sampler (draw the output from that conditional law) it does not
  return the target law;
* seed 002 Appendix B.3 finds SpecTr's division factor rho by "binary search" without saying which end of the
  bracket to keep; the lower end is infeasible and its clipped residual changes the law (by 1.8e-3 after 8
  bisection steps, docs/algorithms.md section 3.3), which only the exact mode resolves.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from functools import lru_cache
from typing import Any

import numpy as np

from spec_ref._sampling import residual

from conformance._common import categorical, positive_part

__all__ = ["bv_as_described", "specinfer_alg14_as_written", "spectr_lower_bracket"]


def bv_as_described(target_probs: Any, draft_probs: Any, draft_tokens: Sequence[int], rng: Any) -> list[int]:
    """Seed 002 section 3.1's block verification: node i kept with probability ``w_i``, the deepest kept wins."""
    weights: list[Any] = [1]
    for i, x in enumerate(draft_tokens):
        weights.append(min(1, weights[-1] * target_probs[i][x] / draft_probs[i][x]))
    deepest = 0
    for i in range(1, len(draft_tokens) + 1):
        if rng.uniform() < weights[i]:
            deepest = i
    committed = [int(t) for t in draft_tokens[:deepest]]
    if deepest == len(draft_tokens):
        return committed + [categorical(rng, list(target_probs[deepest]))]
    rest = positive_part(list(target_probs[deepest]), list(draft_probs[deepest]), weights[deepest])
    return committed + [categorical(rng, rest if sum(rest) > 0 else list(target_probs[deepest]))]


def specinfer_alg14_as_written(target_probs: Any, draft_probs: Any, drafts: tuple[int, ...], rng: Any) -> int:
    """Draw the output from seed 002 Algorithm 14's branching law as printed (uniform order).

    ``P_0 = p, P_{i+1} = Res(P_i, q)``; after ``i`` rejections the printed recursion uses the ratio of
    ``P_{i-1}`` (``P_0`` for ``i = 0``, where the printed index is undefined) instead of ``P_i``.
    """
    p, q = np.asarray(target_probs), np.asarray(draft_probs)
    chain = [p]
    for _ in drafts:
        chain.append(residual(chain[-1], q))

    @lru_cache(maxsize=None)
    def law(rejections: int, remaining: tuple[int, ...]) -> tuple[Any, ...]:
        if not remaining:
            return tuple(chain[rejections])
        total = [0 * x for x in q]
        for j, t in enumerate(remaining):
            ratio = min(1, chain[max(rejections - 1, 0)][t] / q[t])  # the printed, shifted index
            after = law(rejections + 1, remaining[:j] + remaining[j + 1:])
            total = [s + (1 - ratio) * a + (ratio if y == t else 0) for y, (s, a) in enumerate(zip(total, after))]
        return tuple(s / len(remaining) for s in total)

    return categorical(rng, law(0, tuple(drafts)))


def _rho_lower(p: Any, q: Any, k: int, iterations: int) -> Any:
    """The lower (infeasible) end of the bisection for SpecTr's rho on [1, k] (spec_ref.rho_star keeps ``hi``)."""
    lo, hi = Fraction(1), Fraction(k)
    for _ in range(iterations):
        mid = (lo + hi) / 2
        beta = sum(min(x / mid, y) for x, y in zip(p, q))
        if 1 - (1 - beta) ** k <= mid * beta:
            hi = mid
        else:
            lo = mid
    return lo


def spectr_lower_bracket(target_probs: Any, draft_probs: Any, drafts: tuple[int, ...], rng: Any) -> int:
    """SpecTr K-SEQ (seed 002 Algorithm 3) with rho from the lower end of an 8-step bisection."""
    p, q, k = list(target_probs), list(draft_probs), len(drafts)
    rho = _rho_lower(p, q, k, 8) if k > 1 else 1
    capped = [min(x / rho, y) for x, y in zip(p, q)]
    beta = sum(capped)
    for x in drafts:
        if rng.uniform() * (rho * q[x]) < p[x]:
            return x
    gamma = (1 - (1 - beta) ** k) / beta if beta > 0 else rho
    rest = [max(x - gamma * c, 0) for x, c in zip(p, capped)]
    return categorical(rng, rest if sum(rest) > 0 else p)
