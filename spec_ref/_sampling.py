"""Sampling primitives and the comparison conventions shared by every algorithm (docs/algorithms.md section 9).

* Accept test: ``accept(u, draft_mass, target_mass)`` is ``u * draft_mass < target_mass`` with
  ``u`` in [0, 1). It never divides, and never accepts a token of zero target mass, even at ``u = 0``
  (docs/algorithms.md sections 1 and 9). ``spec_fast`` uses the identical form.
* Inverse CDF: ``inverse_cdf(weights, u)`` returns the smallest index ``i`` with
  ``cumsum(weights)[i] > u * sum(weights)``; if rounding pushes ``u * sum`` past the last partial sum it
  returns the last index of positive weight. It never returns an index of zero weight.
* Residual: ``residual(a, b) = (a - b)_+ / sum (a - b)_+`` elementwise; if the positive mass is
  ``<= 0`` it falls back to ``a / sum(a)`` (the current target), never to uniform or to token 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

Vector = npt.NDArray[Any]


def accept(u: Any, draft_mass: Any, target_mass: Any) -> bool:
    """The multiplicative accept test ``u * draft_mass < target_mass`` (u may be symbolic)."""
    return bool(u * draft_mass < target_mass)


def inverse_cdf(weights: Vector, u: float) -> int:
    """Index drawn by inverse CDF of ``weights`` (non-negative, positive sum) at uniform ``u`` in [0, 1)."""
    w = np.asarray(weights).reshape(-1)
    total = w.sum()
    if not total > 0:
        raise ValueError(f"categorical weights must have a positive sum, got sum={total!r}")
    cumulative = np.cumsum(w)
    threshold = u * total
    index = int(np.searchsorted(cumulative, threshold, side="right"))
    if index >= w.shape[0]:
        # u * total rounded up to (or past) the last partial sum: take the last positive entry.
        index = int(np.flatnonzero(w > 0)[-1])
    return index


def positive_part(values: Vector) -> Vector:
    """``max(values, 0)`` elementwise, in the mode of ``values``."""
    return np.maximum(values, 0)


def residual(a: Vector, b: Vector) -> Vector:
    """``Res(a, b)`` of docs/algorithms.md section 1, with the fallback to ``a / sum(a)``."""
    mass = positive_part(a - b)
    total = mass.sum()
    if total > 0:
        return mass / total  # type: ignore[no-any-return]
    return a / a.sum()  # type: ignore[no-any-return]
