"""Boundary checks of the public ``spec_fast`` verifiers (docs/algorithms.md section 9).

Every public verifier entry (:func:`spec_fast.verify_tree`, the solver kernels) checks its tensors here and
raises ``ValueError`` naming the argument, the first bad index and its value. The checks read tensor values
on the host (one synchronisation per call), so the engine's internal hot path skips them
(``verify_tree(..., validate=False)``): its probabilities come from :func:`spec_fast.decoding_operator`,
which never produces NaN/inf, and the kernels clamp every emitted index to ``[0, V)``.

Probability sums are checked with a tolerance that scales with the dtype and the vocabulary: a float32
softmax over ``V`` cells sums to 1 only within a few ``eps * sqrt(V)`` (measured: 1.2e-5 at V = 262144,
where a fixed 1e-6 rejects valid rows).
"""

from __future__ import annotations

import math

import torch

__all__ = ["probability_sum_tolerance", "check_probabilities", "check_uniforms", "check_token_ids"]

Tensor = torch.Tensor

#: The float64 reference's tolerance (spec_ref/_validate.py): the floor of the scaled tolerance.
BASE_SUM_TOLERANCE = 1e-6


def probability_sum_tolerance(dtype: torch.dtype, vocab_size: int) -> float:
    """``|sum - 1|`` allowed for a probability row of ``vocab_size`` cells stored in ``dtype``.

    ``1e-6 + 4 * eps(dtype) * sqrt(V)``: rounding each cell to ``dtype`` moves the sum by at most
    ``eps / 2``, and the softmax normaliser's own summation error grows like ``eps * sqrt(V)`` (random
    rounding); the factor 4 leaves a 5x margin over the worst row measured (float32, V = 49152 to 262144).
    """
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    return BASE_SUM_TOLERANCE + 4.0 * eps * math.sqrt(max(int(vocab_size), 1))


def _index_text(index: Tensor) -> str:
    return ", ".join(str(int(i)) for i in index.tolist())


def _first(mask: Tensor) -> Tensor | None:
    """The index tuple (as a 1-D long tensor) of the first True entry of ``mask``, or None."""
    hits = mask.nonzero()
    if hits.shape[0] == 0:
        return None
    return hits[0]


def check_probabilities(name: str, probs: Tensor, rows: Tensor | None = None) -> None:
    """``probs [..., V]``: finite, non-negative, every checked row summing to 1 within
    :func:`probability_sum_tolerance`. ``rows [...]`` bool (optional) selects the rows that must be
    distributions (padding slots only have to be finite)."""
    if not probs.dtype.is_floating_point:
        raise ValueError(f"{name} must be a floating-point tensor, got {name}.dtype={probs.dtype}")
    if probs.shape[-1] == 0:
        raise ValueError(f"{name} must have V >= 1 columns, got {name}.shape={tuple(probs.shape)}")
    bad = _first(~torch.isfinite(probs))
    if bad is not None:
        raise ValueError(f"{name} must be finite, got {name}[{_index_text(bad)}]={float(probs[tuple(bad)])!r}")
    checked = probs if rows is None else probs[rows]
    negative = _first(checked < 0)
    if negative is not None:
        full = negative if rows is None else torch.cat((rows.nonzero()[int(negative[0])], negative[1:]))
        raise ValueError(
            f"{name} must be non-negative, got {name}[{_index_text(full)}]={float(probs[tuple(full)])!r}"
        )
    totals = checked.sum(dim=-1, dtype=torch.float64)
    tolerance = probability_sum_tolerance(probs.dtype, probs.shape[-1])
    off = _first((totals - 1).abs() > tolerance)
    if off is not None:
        full = off if rows is None else rows.nonzero()[int(off[0])]
        raise ValueError(
            f"{name} rows must sum to 1 (within {tolerance:.3g} for {probs.dtype} and V={probs.shape[-1]}), "
            f"got sum({name}[{_index_text(full)}])={float(totals[tuple(off)])!r}"
        )


def check_uniforms(name: str, uniforms: Tensor, rows: Tensor | None = None) -> None:
    """``uniforms``: every entry (of the selected leading rows) in ``[0, 1)``; NaN is refused."""
    if not uniforms.dtype.is_floating_point:
        raise ValueError(f"{name} must be a floating-point tensor, got {name}.dtype={uniforms.dtype}")
    checked = uniforms if rows is None else uniforms[rows]
    bad = _first(~((checked >= 0) & (checked < 1)))  # NaN fails both comparisons
    if bad is not None:
        full = bad if rows is None else torch.cat((rows.nonzero()[int(bad[0])], bad[1:]))
        raise ValueError(f"{name} must lie in [0, 1), got {name}[{_index_text(full)}]={float(uniforms[tuple(full)])!r}")


def check_token_ids(name: str, tokens: Tensor, vocab_size: int, padding: Tensor | None = None) -> None:
    """``tokens``: integer ids in ``[0, V)``, or ``-1`` where ``padding`` (bool, same shape) allows it."""
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor, got {name}.dtype={tokens.dtype}")
    allowed = (tokens >= 0) & (tokens < vocab_size)
    if padding is not None:
        allowed |= padding & (tokens == -1)
    bad = _first(~allowed)
    if bad is not None:
        raise ValueError(
            f"{name} must hold token ids in [0, V) with V={vocab_size} (or -1 padding), "
            f"got {name}[{_index_text(bad)}]={int(tokens[tuple(bad)])}"
        )
