"""Adversarial and seeded random (target, draft) probability pairs for :mod:`spec_ref.testing`.

Every pair is built in exact rational arithmetic (lists of :class:`fractions.Fraction` summing to exactly
1) from one of the *pair families* below, then handed out either as ``object`` arrays of Fractions or as
``float64`` arrays. The families are the adversarial shapes of docs/testing.md section 6:

=====================  ==================================================================================
family                 (p, q)
=====================  ==================================================================================
``random``             independent random weights with zeros
``equal``              p = q
``disjoint``           supports split in two halves: nothing can be accepted (SpecTr's 0/0)
``target_one_hot``     p a point mass
``draft_one_hot``      q a point mass (a deterministic draft)
``ties``               p uniform, q uniform on the first half: equal values and exact ratio 1/2
``tiny``               p(0) and q(V-1) equal to 2^-1000 (float64 can hold it, float32 cannot)
``draft_inside_target``   supp q a strict subset of supp p where possible
``target_inside_draft``   supp p a strict subset of supp q where possible
=====================  ==================================================================================
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import numpy.typing as npt

__all__ = [
    "ADVERSARIAL_FAMILIES",
    "FAMILIES",
    "Pmf",
    "TINY",
    "WEIGHTS",
    "family_pair",
    "normalised",
    "one_hot",
    "random_weights",
]

#: A probability vector as exact Fractions summing to 1.
Pmf = list[Fraction]

#: Integer weights of random pmfs: zeros, small values and one large value.
WEIGHTS = (0, 0, 1, 1, 2, 3, 7, 1000)
#: The tiny probability of the ``tiny`` family: exactly representable in float64, zero in float32.
TINY = Fraction(1, 2**1000)
#: Every family, adversarial ones first.
ADVERSARIAL_FAMILIES = (
    "equal",
    "disjoint",
    "target_one_hot",
    "draft_one_hot",
    "ties",
    "tiny",
    "draft_inside_target",
    "target_inside_draft",
)
FAMILIES = ADVERSARIAL_FAMILIES + ("random",)


def one_hot(size: int, index: int) -> Pmf:
    return [Fraction(int(i == index)) for i in range(size)]


def normalised(weights: Sequence[Fraction | int], fallback: int) -> Pmf:
    """``weights / sum(weights)``, or a point mass at ``fallback`` if every weight is 0."""
    total = sum((Fraction(w) for w in weights), Fraction(0))
    if total == 0:
        return one_hot(len(weights), fallback)
    return [Fraction(w) / total for w in weights]


def random_weights(generator: np.random.Generator, size: int) -> list[int]:
    """``size`` weights drawn from :data:`WEIGHTS`, at least one positive."""
    weights = [int(WEIGHTS[i]) for i in generator.integers(0, len(WEIGHTS), size=size)]
    if not any(weights):
        weights[int(generator.integers(0, size))] = 1
    return weights


def family_pair(family: str, target_weights: Sequence[int], draft_weights: Sequence[int], pick: int) -> tuple[Pmf, Pmf]:
    """The (p, q) pair of ``family`` built from two weight vectors of equal size (both with a positive entry).

    ``pick`` (any int) chooses the point of the one-hot families and the cut of ``disjoint``.
    """
    size = len(target_weights)
    if family not in FAMILIES:
        raise ValueError(f"family={family!r} must be one of {FAMILIES}")
    p = normalised(target_weights, 0)
    q = normalised(draft_weights, size - 1)
    if size == 1:
        return p, q
    if family == "equal":
        return p, list(p)
    if family == "disjoint":
        cut = 1 + pick % (size - 1)
        p = normalised([w if i < cut else 0 for i, w in enumerate(target_weights)], 0)
        q = normalised([w if i >= cut else 0 for i, w in enumerate(draft_weights)], size - 1)
        return p, q
    if family == "target_one_hot":
        return one_hot(size, pick % size), q
    if family == "draft_one_hot":
        return p, one_hot(size, pick % size)
    if family == "ties":
        half = max(1, size // 2)
        return normalised([1] * size, 0), normalised([1] * half + [0] * (size - half), 0)
    if family == "tiny":
        rest_p = normalised([w for w in target_weights[1:]], 0)
        rest_q = normalised([w for w in draft_weights[:-1]], 0)
        return [TINY] + [(1 - TINY) * w for w in rest_p], [(1 - TINY) * w for w in rest_q] + [TINY]
    if family == "draft_inside_target":
        support = [i for i in range(size) if p[i] > 0]
        keep = support[: max(1, len(support) - 1)]
        return p, normalised([draft_weights[i] + 1 if i in keep else 0 for i in range(size)], keep[0])
    if family == "target_inside_draft":
        support = [i for i in range(size) if q[i] > 0]
        keep = support[: max(1, len(support) - 1)]
        return normalised([target_weights[i] + 1 if i in keep else 0 for i in range(size)], keep[0]), q
    return p, q


def prefixes(vocab_size: int, max_length: int) -> list[tuple[int, ...]]:
    """Every token prefix of length 0..``max_length`` over ``vocab_size`` tokens, shortest first."""
    out: list[tuple[int, ...]] = []
    for length in range(max_length + 1):
        out.extend(itertools.product(range(vocab_size), repeat=length))
    return out


def as_array(pmf: Sequence[Fraction], fraction: bool) -> npt.NDArray[np.generic]:
    """A read-only array: ``object`` holding Fractions, or ``float64``."""
    if fraction:
        array = np.empty(len(pmf), dtype=object)
        array[:] = list(pmf)
    else:
        array = np.array([float(x) for x in pmf], dtype=np.float64)
    array.setflags(write=False)
    return array
