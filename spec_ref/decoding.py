"""The decoding operator G: temperature -> top-k -> top-p -> softmax (docs/algorithms.md section 2).

Losslessness is always relative to G(target logits): speculative decoding reproduces ordinary sampling
with the same (temperature, top_k, top_p), not raw-softmax sampling (proofs/T08_decoding_operator.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["decoding_operator", "greedy_token", "validate_sampling_params"]


def _logits_iv(logits: Any) -> npt.NDArray[np.float64]:
    try:
        arr = np.asarray(logits, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"logits must be numeric, got {logits!r}") from err
    if arr.ndim != 1 or arr.shape[0] == 0:
        raise ValueError(f"logits must be a non-empty vector [V], got shape {arr.shape}")
    if np.isnan(arr).any():
        i = int(np.flatnonzero(np.isnan(arr))[0])
        raise ValueError(f"logits must not contain NaN, got logits[{i}]=nan")
    if np.isposinf(arr).any():
        i = int(np.flatnonzero(np.isposinf(arr))[0])
        raise ValueError(f"logits must be finite or -inf, got logits[{i}]=inf")
    if np.isneginf(arr).all():
        raise ValueError("logits must have at least one finite entry, got all -inf")
    return arr


def validate_sampling_params(temperature: Any, top_k: Any, top_p: Any, vocab_size: int | None = None) -> None:
    """Raise ``ValueError`` naming the bad sampling parameter (T < 0, top_k < 1, top_p outside (0, 1])."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float, np.integer, np.floating)):
        raise ValueError(f"temperature must be a number >= 0, got temperature={temperature!r}")
    if not np.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0, got temperature={temperature!r}")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1:
            raise ValueError(f"top_k must be None or an integer >= 1, got top_k={top_k!r}")
    if top_p is not None:
        if isinstance(top_p, bool) or not isinstance(top_p, (int, float, np.integer, np.floating)):
            raise ValueError(f"top_p must be None or a number in (0, 1], got top_p={top_p!r}")
        if not (0.0 < float(top_p) <= 1.0):
            raise ValueError(f"top_p must lie in (0, 1], got top_p={top_p!r}")


def greedy_token(logits: Any) -> int:
    """argmax of the raw logits, ties broken by the lowest token id (``np.argmax``)."""
    return int(np.argmax(_logits_iv(logits)))


def _softmax(z: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    shifted = z - z.max()
    weights = np.exp(shifted)  # exp(-inf) = 0 exactly
    return weights / weights.sum()  # type: ignore[no-any-return]


def decoding_operator(
    logits: Any, temperature: float, top_k: int | None = None, top_p: float | None = None
) -> npt.NDArray[np.float64]:
    """G(logits): the processed next-token distribution ``[V]`` in float64.

    1. ``z = (logits - max logits) / T`` (the shift leaves G unchanged and keeps ``z`` finite for any
       ``T > 0``). ``T = 0`` is greedy: the result is one-hot at :func:`greedy_token` (ties to the
       lowest id) and top-k/top-p are irrelevant; nothing is ever divided by 0.
    2. top-k (if ``1 <= top_k < V``): ``t`` = the k-th largest ``z``; every ``z_x < t`` becomes -inf, ties
       at ``t`` are kept (as HF ``TopKLogitsWarper`` and vLLM do).
    3. top-p (if ``0 < top_p < 1``): ``P = softmax(z)``; tokens sorted by (P descending, id ascending);
       the token at sorted position j is kept iff the mass strictly before j is ``< top_p`` (the shortest
       prefix with mass >= top_p, at least one token). The others become -inf.
    4. ``softmax(z)``.

    Raises ``ValueError`` for NaN or +inf logits, an all -inf row, T < 0, top_k < 1 and top_p outside
    (0, 1].
    """
    z = _logits_iv(logits)
    validate_sampling_params(temperature, top_k, top_p)
    vocab_size = z.shape[0]
    if temperature == 0:
        out = np.zeros(vocab_size, dtype=np.float64)
        out[int(np.argmax(z))] = 1.0
        return out
    # Shifted before dividing: the same distribution, and z <= 0 never overflows, so a tiny temperature
    # (1e-38, 1e-300) gives the T -> 0 limit (uniform over the tied maxima) instead of inf - inf = NaN.
    with np.errstate(over="ignore"):  # a gap / tiny T beyond float64 is -inf: probability exactly 0
        z = (z - z.max()) / float(temperature)
    if top_k is not None and int(top_k) < vocab_size:
        kth_largest = np.sort(z)[vocab_size - int(top_k)]
        z = np.where(z < kth_largest, -np.inf, z)
    if top_p is not None and float(top_p) < 1.0:
        probs = _softmax(z)
        order = np.lexsort((np.arange(vocab_size), -probs))  # P descending, then id ascending
        sorted_probs = probs[order]
        mass_before = np.concatenate(([0.0], np.cumsum(sorted_probs)[:-1]))
        keep_sorted = mass_before < float(top_p)
        keep = np.zeros(vocab_size, dtype=bool)
        keep[order[keep_sorted]] = True
        z = np.where(keep, z, -np.inf)
    return _softmax(z)
