"""Inverse-CDF sampling at real vocabulary sizes equals spec_ref.inverse_cdf (docs/algorithms.md section 9),
with uniforms placed one float32 step either side of CDF boundaries, for float32 and bfloat16 weights.

A float32 cumulative sum over V = 151936 moves boundaries by ~1e-5 of the mass and float32 chunk totals by
~1e-7, both far more than the float32 grid step of a uniform (6e-8 of u), so they pick a neighbouring
token for many of these uniforms; float64 accumulation agrees with the reference's sequential float64
cumsum to ~1e-13 of the mass.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import spec_ref
from spec_fast._sampling import _inverse_cdf
from tests.fast.test_kernels_helpers import single_thread_torch

__all__ = ["single_thread_torch"]

#: Reference ties closer than this (relative to the row total) may legitimately differ in float64.
FLOAT64_SLACK = 1e-12


def boundary_uniforms(weights64: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """float32 uniforms just below and just above ``cumsum[i] / total`` for ``count`` random cells ``i``
    of positive weight (and u = 0, the largest uniform below 1)."""
    cumulative = np.cumsum(weights64)
    total = cumulative[-1]
    cells = rng.choice(np.flatnonzero(weights64 > 0), size=count, replace=False)
    at = (cumulative[cells] / total).astype(np.float32)
    below = np.nextafter(at, np.float32(0))
    above = np.nextafter(at, np.float32(1))
    values = np.concatenate([below, at, above, [0.0, 1.0 - 2.0**-24]]).astype(np.float32)
    return values[(values >= 0) & (values < 1)]


def rows_of_weights(vocab: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, vocab, generator=gen) * 2.5
    probs = torch.softmax(logits, dim=1)
    probs[0, : vocab // 3] = 0.0  # a long run of zero cells (residual-like rows)
    return probs.to(dtype)


def mismatches(weights: torch.Tensor, draw: object, count: int = 24) -> tuple[int, int]:
    """(rows x uniforms that differ from spec_ref away from float64 ties, uniforms checked)."""
    rng = np.random.default_rng(weights.shape[1])
    wrong = checked = 0
    for row in range(weights.shape[0]):
        w64 = weights[row].to(torch.float64).numpy()
        uniforms = boundary_uniforms(w64, count, rng)
        got = draw(weights[row : row + 1].expand(len(uniforms), -1), torch.from_numpy(uniforms))  # type: ignore[operator]
        cumulative = np.cumsum(w64)
        for j, u in enumerate(uniforms.tolist()):
            expected = spec_ref.inverse_cdf(w64, u)
            checked += 1
            if int(got[j]) != expected:
                gap = np.abs(cumulative - u * cumulative[-1]).min()
                if gap >= FLOAT64_SLACK * cumulative[-1]:
                    wrong += 1
    return wrong, checked


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("vocab", [151936, 262144])
def test_inverse_cdf_equals_the_reference_next_to_cdf_boundaries(vocab: int, dtype: torch.dtype) -> None:
    weights = rows_of_weights(vocab, dtype, seed=vocab)
    got = _inverse_cdf(weights, torch.rand(8, generator=torch.Generator().manual_seed(0)).expand(2, 8)[:, 0])
    assert bool((weights.gather(1, got.unsqueeze(1)) > 0).all())
    wrong, checked = mismatches(weights, _inverse_cdf)
    assert checked >= 140 and wrong == 0


def _float32_single_level(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The lossy variant: one float32 cumulative sum."""
    cumulative = torch.cumsum(weights.to(torch.float32), dim=1)
    index = torch.searchsorted(cumulative, (u.unsqueeze(1) * cumulative[:, -1:]).contiguous(), right=True)
    return index.squeeze(1).clamp(max=weights.shape[1] - 1)


def test_the_boundary_uniforms_catch_a_float32_cumulative_sum() -> None:
    """Negative control: the same check rejects the float32 single-level cumsum at V = 151936."""
    wrong, checked = mismatches(rows_of_weights(151936, torch.float32, seed=151936), _float32_single_level)
    assert wrong > checked // 10


@pytest.mark.parametrize("vocab", [6, 9000])
def test_inverse_cdf_stays_in_the_vocabulary_and_on_positive_weights_at_u_one_and_on_nan_rows(vocab: int) -> None:
    """The guard of the unvalidated engine path: u = 1 (outside the contract) takes the last positive
    weight, a NaN row still gives an id in [0, V) (searchsorted alone returns V for both)."""
    weights = torch.zeros(3, vocab)
    weights[0, : vocab // 2] = 1.0
    weights[1, 1] = 1.0
    weights[2] = float("nan")
    got = _inverse_cdf(weights, torch.tensor([1.0, 1.0, 0.5]))
    assert got.tolist()[:2] == [vocab // 2 - 1, 1]
    assert 0 <= int(got[2]) < vocab
