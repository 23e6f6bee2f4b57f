"""Drafts of controlled quality, derived from the target's own law (a tool for block-efficiency studies).

At every position the target's next-token law is ``p`` (over a vocabulary of size V). The *permuted
mixture* draft of strength ``eps`` in [0, 1] is::

    q_eps = (1 - eps) * p + eps * r,        r(t) = p(sigma(t)),

with ``sigma`` one fixed permutation of the vocabulary (:func:`vocab_permutation`, seeded). ``r`` is as
peaked as ``p`` but puts its mass on unrelated tokens, so a large ``eps`` gives a confidently wrong draft,
the failure mode of a small real draft; ``eps = 0`` is the target itself (acceptance 1).

The *rank-permuted mixture* (:func:`rank_permuted_mixture`, the one ``bench/study_regimes.py`` uses) keeps
p's support: ``r`` moves p's masses between the tokens of that support by a seeded permutation of their
ranks (:func:`rank_permuted`), so every drafted token is plausible under p and only the ranking is wrong.
With a vocabulary permutation and a truncated p, p and p[sigma] are nearly disjoint and every draw is
either a draw of p or a token the target never emits; the rank version avoids that all-or-nothing draft.

For both, single-token acceptance is exactly linear in ``eps`` (:func:`mixture_acceptance`)::

    sum_t min(p, q_eps) = 1 - TV(p, q_eps) = 1 - eps * TV(p, r),    TV(a, b) = (1/2) sum_t |a - b|,

:func:`solve_strength` inverts it for a set of positions:
the ``eps`` whose *mean* acceptance over them equals a target acceptance (clipped to [0, 1]; the achieved
mean is returned, so a regime that a high-entropy ``p`` cannot reach is reported, never hidden), because
``p - q_eps = eps * (p - r)`` pointwise for either ``r``.

This draft is **derived from p**: producing it costs a target pass per drafted token, so it says nothing
about speed. It exists to place the verifiers' comparison at a chosen acceptance (``bench/study_regimes.py``,
docs/algorithms.md section 13). Works on float64 arrays and on Fraction object arrays (exact).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from spec_ref._validate import Vector, any_exact, is_exact, probability_vector
from spec_ref.rng import as_source

__all__ = [
    "Strength",
    "vocab_permutation",
    "permuted_mixture",
    "rank_permuted",
    "rank_permuted_mixture",
    "acceptance",
    "total_variation",
    "mixture_acceptance",
    "solve_strength",
]


def _strength(eps: Any) -> Any:
    if isinstance(eps, bool) or not isinstance(eps, (int, float, Fraction, np.floating, np.integer)):
        raise ValueError(f"eps must be a number in [0, 1], got eps={eps!r}")
    if not 0 <= eps <= 1:
        raise ValueError(f"eps must lie in [0, 1], got eps={eps!r}")
    return eps


def vocab_permutation(vocab_size: int, seed: int) -> npt.NDArray[np.int64]:
    """A permutation ``sigma`` of ``range(vocab_size)`` (Fisher-Yates on :func:`spec_ref.rng.as_source`)."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) or vocab_size < 1:
        raise ValueError(f"vocab_size must be an integer >= 1, got vocab_size={vocab_size!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an integer, got seed={seed!r}")
    source = as_source(int(seed))
    sigma = np.arange(int(vocab_size), dtype=np.int64)
    for i in range(int(vocab_size) - 1, 0, -1):
        j = int(source.integers(i + 1))
        sigma[i], sigma[j] = sigma[j], sigma[i]
    return sigma


def _permutation(sigma: Any, size: int) -> npt.NDArray[np.int64]:
    perm = np.asarray(sigma)
    if perm.shape != (size,) or not np.issubdtype(perm.dtype, np.integer) or not np.array_equal(
        np.sort(perm), np.arange(size)
    ):
        raise ValueError(f"sigma must be a permutation of range({size}), got sigma={sigma!r}")
    return perm.astype(np.int64)


def permuted_mixture(p: Any, eps: Any, sigma: Any) -> Vector:
    """``q_eps = (1 - eps) p + eps p[sigma]`` (module docstring); exact when ``p`` and ``eps`` are Fractions."""
    law = probability_vector(p, "p")
    eps = _strength(eps)
    perm = _permutation(sigma, law.shape[0])
    out: Vector = law * (1 - eps) + law[perm] * eps
    return out


def rank_permuted(p: Any, seed: int) -> Vector:
    """``r``: p's masses moved between the tokens of its support by a seeded permutation of their ranks.

    With ``t_1, ..., t_n`` the support of p by decreasing p (ties: lower id first) and ``pi`` =
    ``vocab_permutation(n, seed)``, ``r(t_i) = p(t_{pi(i)})``: r has p's support and p's multiset of
    masses, but ranks the candidates in an unrelated order (the draft "knows" the plausible tokens and
    misranks them)."""
    law = probability_vector(p, "p")
    support = [t for t in range(law.shape[0]) if law[t] > 0] if is_exact(law) else np.flatnonzero(law > 0).tolist()
    order = sorted(support, key=lambda t: (-law[t], t))
    pi = vocab_permutation(len(order), seed)
    out: Vector = law * 0
    for i, t in enumerate(order):
        out[t] = law[order[int(pi[i])]]
    return out


def rank_permuted_mixture(p: Any, eps: Any, seed: int) -> Vector:
    """``q_eps = (1 - eps) p + eps r`` with ``r = rank_permuted(p, seed)`` (module docstring); q has p's support,
    and ``acceptance(p, q) = 1 - eps * TV(p, r)`` exactly."""
    law = probability_vector(p, "p")
    eps = _strength(eps)
    out: Vector = law * (1 - eps) + rank_permuted(law, seed) * eps
    return out


def total_variation(a: Any, b: Any) -> Any:
    """``TV(a, b) = (1/2) sum |a - b|`` of two laws of one vocabulary."""
    exact = any_exact(a, b)
    first, second = probability_vector(a, "a", exact=exact), probability_vector(b, "b", exact=exact)
    if first.shape != second.shape:
        raise ValueError(f"a and b must have the same size, got {first.shape[0]} and {second.shape[0]}")
    diff = first - second
    if not is_exact(diff):
        return float(np.abs(diff).sum()) / 2
    return sum((abs(d) for d in diff), diff[0] * 0) / 2


def acceptance(p: Any, q: Any) -> Any:
    """Single-token acceptance of speculative sampling, ``sum_t min(p(t), q(t))`` (= 1 - TV(p, q))."""
    exact = any_exact(p, q)
    first, second = probability_vector(p, "p", exact=exact), probability_vector(q, "q", exact=exact)
    if first.shape != second.shape:
        raise ValueError(f"p and q must have the same size, got {first.shape[0]} and {second.shape[0]}")
    if not (is_exact(first) or is_exact(second)):
        return float(np.minimum(first, second).sum())
    return sum((min(x, y) for x, y in zip(first, second)), first[0] * 0)


def mixture_acceptance(p: Any, eps: Any, sigma: Any) -> Any:
    """The closed form ``1 - eps * TV(p, p[sigma])`` of ``acceptance(p, permuted_mixture(p, eps, sigma))``."""
    law = probability_vector(p, "p")
    eps = _strength(eps)
    return 1 - eps * total_variation(law, law[_permutation(sigma, law.shape[0])])


@dataclass(frozen=True)
class Strength:
    """The ``eps`` of :func:`solve_strength` and the mean acceptance it achieves on its positions."""

    eps: float
    target_acceptance: float
    achieved_acceptance: float
    positions: int


def solve_strength(distances: Sequence[float] | npt.NDArray[np.float64], target_acceptance: float) -> Strength:
    """The ``eps`` with ``mean_i (1 - eps * d_i) = target_acceptance`` over positions with ``d_i = TV(p_i, r_i)``.

    ``eps = (1 - target) / mean(d)``, clipped to [0, 1]; ``achieved_acceptance`` is the mean at that eps
    (below the target only when even ``eps = 1`` cannot reach it)."""
    values = np.asarray(distances, dtype=np.float64)
    if values.ndim != 1 or values.size == 0 or not np.all(np.isfinite(values)) or np.any(values < -1e-12) or np.any(
        values > 1 + 1e-12
    ):
        raise ValueError(f"distances must be a non-empty 1-D array of values in [0, 1], got distances={distances!r}")
    target = float(target_acceptance)
    if not 0 <= target <= 1:
        raise ValueError(f"target_acceptance must lie in [0, 1], got target_acceptance={target_acceptance!r}")
    mean = float(np.clip(values, 0.0, 1.0).mean())  # rounding of a TV of disjoint laws: 1 +- 1 ulp
    eps = 0.0 if mean == 0 else min(1.0, (1 - target) / mean)
    return Strength(eps, target, float(1 - eps * mean), int(values.size))
