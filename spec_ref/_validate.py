"""Boundary checks shared by every public ``spec_ref`` entry point.

Every public function validates its input once, here, and raises ``ValueError`` whose message names the
argument and the offending value. Internal helpers trust their input.

Two arithmetic modes run through the same code:

* **float mode** (the default): probability vectors are ``float64`` arrays;
* **exact mode**: if any probability input holds :class:`fractions.Fraction` values (a list of
  Fractions, or an ``object`` array of them), every probability input of the call is converted to an
  ``object`` array of Fractions and the algorithm runs in exact rational arithmetic. This is what the
  exact enumerator (:func:`spec_ref.exact_law`) uses to prove laws with ``==``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any, Union

import numpy as np
import numpy.typing as npt

#: A probability vector ``[V]``: ``float64`` (float mode) or ``object`` holding Fractions (exact mode).
Vector = npt.NDArray[Any]
#: A scalar of either mode.
Scalar = Union[float, Fraction]

#: |sum - 1| allowed before an input is called unnormalised (then it is renormalised).
SUM_TOLERANCE = 1e-6


def show(value: Any) -> str:
    """A plain rendering of a scalar for error messages (``nan``, ``-0.5``, ``1/3``)."""
    if isinstance(value, Fraction):
        return str(value)
    if isinstance(value, (float, np.floating)):
        return repr(float(value))
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return str(int(value))
    return repr(value)


def is_exact(array: Vector) -> bool:
    """True when ``array`` is an exact-mode (``object``/Fraction) array."""
    return bool(array.dtype == object)


def _contains_fraction(values: Any) -> bool:
    if isinstance(values, np.ndarray):
        return bool(values.dtype == object)
    if isinstance(values, Fraction):
        return True
    if isinstance(values, (list, tuple)):
        return any(_contains_fraction(v) for v in values)
    return False


def _to_fraction(value: Any, name: str) -> Fraction:
    if isinstance(value, Fraction):
        return value
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must hold numbers, got {value!r}")
    if isinstance(value, (int, np.integer)):
        return Fraction(int(value))
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(float(value)):
            raise ValueError(f"{name} must be finite, got {value!r}")
        return Fraction(float(value))
    raise ValueError(f"{name} must hold numbers, got {value!r}")


def to_mode(values: Any, exact: bool, name: str) -> Vector:
    """Convert ``values`` to a 1-D-or-more array of the requested mode (no normalisation checks)."""
    if exact:
        raw = np.asarray(values, dtype=object)
        out = np.empty(raw.shape, dtype=object)
        for index in np.ndindex(raw.shape):
            out[index] = _to_fraction(raw[index], name)
        return out
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be numeric, got {values!r}") from err
    return arr


def any_exact(*values: Any) -> bool:
    """True when any of ``values`` is in exact mode; the whole call then runs exactly."""
    return any(_contains_fraction(v) for v in values)


def probability_vector(values: Any, name: str, *, exact: bool | None = None, size: int | None = None) -> Vector:
    """Validate one probability vector ``[V]`` and return it renormalised, in the requested mode.

    Raises ``ValueError`` naming ``name`` for: wrong rank, empty, wrong length, NaN/inf, negative
    entries, a sum off by more than :data:`SUM_TOLERANCE`.
    """
    if exact is None:
        exact = any_exact(values)
    arr = to_mode(values, exact, name)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a vector [V], got shape {arr.shape}")
    if arr.shape[0] == 0:
        raise ValueError(f"{name} must not be empty, got shape {arr.shape}")
    if size is not None and arr.shape[0] != size:
        raise ValueError(f"{name}.shape={arr.shape} must be ({size},) to match the vocabulary size V={size}")
    if not exact:
        bad = ~np.isfinite(arr)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{name} must be finite, got {name}[{i}]={show(arr[i])}")
    negative = [i for i in range(arr.shape[0]) if arr[i] < 0]
    if negative:
        i = negative[0]
        raise ValueError(f"{name} must be non-negative, got {name}[{i}]={show(arr[i])}")
    total = arr.sum()
    if abs(float(total) - 1.0) > SUM_TOLERANCE:
        raise ValueError(f"{name} must sum to 1 (within {SUM_TOLERANCE}), got sum({name})={float(total)!r}")
    normalised: Vector = arr / total
    return normalised


def probability_pair(target_probs: Any, draft_probs: Any) -> tuple[Vector, Vector]:
    """Validate a (target, draft) pair of the same length and mode."""
    exact = any_exact(target_probs, draft_probs)
    target = probability_vector(target_probs, "target_probs", exact=exact)
    draft = probability_vector(draft_probs, "draft_probs", exact=exact, size=target.shape[0])
    return target, draft


def token_index(value: Any, name: str, vocab_size: int) -> int:
    """Validate one token id in ``[0, vocab_size)``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer token id, got {value!r}")
    token = int(value)
    if not 0 <= token < vocab_size:
        raise ValueError(f"{name}={token} must lie in [0, V) with V={vocab_size}")
    return token


def draft_token_tuple(draft_tokens: Sequence[int] | npt.NDArray[Any], draft_probs: Vector) -> tuple[int, ...]:
    """Validate drafted tokens: integer ids in range, each with draft probability > 0."""
    try:
        items = list(draft_tokens)
    except TypeError as err:
        raise ValueError(f"draft_tokens must be a sequence of token ids, got {draft_tokens!r}") from err
    vocab_size = draft_probs.shape[0]
    tokens = tuple(token_index(t, f"draft_tokens[{j}]", vocab_size) for j, t in enumerate(items))
    for j, token in enumerate(tokens):
        if not draft_probs[token] > 0:
            raise ValueError(
                f"draft_tokens[{j}]={token} has draft_probs[{token}]={show(draft_probs[token])}; a drafted token "
                "must have positive draft probability (was it drawn from a different distribution?)"
            )
    return tokens


def draft_count(k: Any) -> int:
    """Validate the number of drafts ``k >= 0``."""
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
        raise ValueError(f"k must be a non-negative integer, got {k!r}")
    if int(k) < 0:
        raise ValueError(f"k must be a non-negative integer, got k={int(k)}")
    return int(k)


def zeros_like_mode(reference: Vector) -> Vector:
    """A zero vector with the shape and mode of ``reference``."""
    if is_exact(reference):
        out = np.empty(reference.shape, dtype=object)
        out[...] = Fraction(0)
        return out
    return np.zeros(reference.shape, dtype=np.float64)


def one_hot_like(reference: Vector, token: int) -> Vector:
    """A point mass at ``token`` with the shape and mode of ``reference``."""
    out = zeros_like_mode(reference)
    out[token] = Fraction(1) if is_exact(reference) else 1.0
    return out
