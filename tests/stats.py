"""Statistical test helpers (docs/testing.md section 4.4): the public ones live in
:mod:`spec_ref.goodness_of_fit` (shared with :mod:`spec_ref.testing`); :func:`z_test` is test-only."""

from __future__ import annotations

import numpy as np

from spec_ref.goodness_of_fit import (
    ALPHA,
    MIN_EXPECTED,
    POWER,
    Chi2Result,
    chi2_gof,
    config_seed,
    noncentrality,
    pool_cells,
    required_noncentrality,
)

__all__ = [
    "ALPHA",
    "MIN_EXPECTED",
    "POWER",
    "Chi2Result",
    "chi2_gof",
    "config_seed",
    "noncentrality",
    "pool_cells",
    "required_noncentrality",
    "z_test",
]


def z_test(sample_mean: float, mean: float, variance: float, n: int, bound: float = 5.3) -> bool:
    """True when |z| < bound (two-sided alpha ~ 1e-7 at 5.3)."""
    if variance <= 0:
        return abs(sample_mean - mean) < 1e-12
    return bool(abs(sample_mean - mean) / np.sqrt(variance / n) < bound)
