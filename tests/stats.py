"""Statistical test helpers with a stated false-positive rate and power (TESTING.md section 4.4).

* :func:`chi2_gof` — Pearson chi-square goodness of fit, cells pooled (smallest expected first) until every
  pooled cell has expected count >= 20, rejecting at ``chi2.isf(alpha, df)``; plus the exact support check
  (no count on a zero-probability cell).
* :func:`required_noncentrality` — the noncentrality lambda a chi-square test of ``df`` degrees of freedom
  at level ``alpha`` needs for the given power (``scipy.stats.ncx2``).
* :func:`noncentrality` — ``N * chi2(mutant || expected)`` over the same pooled cells, used by every
  negative control to prove the test has teeth at its sample size.
* :func:`config_seed` — ``zlib.crc32`` of a configuration name (never Python's salted ``hash``).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

#: Per-assertion false-positive rate used throughout ``pytest -m statistical``.
ALPHA = 1e-6
#: Power every negative control must certify against its mutant.
POWER = 0.99
MIN_EXPECTED = 20.0


def config_seed(name: str) -> int:
    return zlib.crc32(name.encode("utf-8"))


def pool_cells(expected: np.ndarray, min_expected: float = MIN_EXPECTED) -> list[list[int]]:
    """Group cell indices (positive expected only) so each group has expected count >= min_expected."""
    order = [int(i) for i in np.argsort(expected, kind="stable") if expected[i] > 0]
    groups: list[list[int]] = []
    current: list[int] = []
    mass = 0.0
    for i in order:
        current.append(i)
        mass += float(expected[i])
        if mass >= min_expected:
            groups.append(current)
            current, mass = [], 0.0
    if current:
        if groups:
            groups[-1].extend(current)
        else:
            groups.append(current)
    return groups


@dataclass(frozen=True)
class Chi2Result:
    statistic: float
    df: int
    critical: float
    p_value: float
    support_violations: tuple[int, ...]

    @property
    def rejected(self) -> bool:
        return bool(self.support_violations) or self.statistic > self.critical


def chi2_gof(counts: Sequence[float] | np.ndarray, probs: Sequence[float] | np.ndarray, alpha: float = ALPHA) -> Chi2Result:
    counts = np.asarray(counts, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    n = counts.sum()
    expected = n * probs
    violations = tuple(int(i) for i in np.flatnonzero((probs == 0) & (counts > 0)))
    groups = pool_cells(expected)
    obs = np.array([counts[g].sum() for g in groups])
    exp = np.array([expected[g].sum() for g in groups])
    df = max(len(groups) - 1, 1)
    statistic = float(((obs - exp) ** 2 / exp).sum()) if len(groups) > 1 else 0.0
    return Chi2Result(statistic, df, float(stats.chi2.isf(alpha, df)), float(stats.chi2.sf(statistic, df)), violations)


def required_noncentrality(df: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """Smallest lambda with P(ncx2(df, lambda) > chi2.isf(alpha, df)) >= power."""
    critical = stats.chi2.isf(alpha, df)
    lo, hi = 0.0, 1.0
    while stats.ncx2.sf(critical, df, hi) < power:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        if stats.ncx2.sf(critical, df, mid) < power:
            lo = mid
        else:
            hi = mid
    return hi


def noncentrality(n: int, mutant: Sequence[float] | np.ndarray, expected: Sequence[float] | np.ndarray) -> tuple[float, int]:
    """(N * chi2(mutant || expected), df) over the cells :func:`chi2_gof` would pool at this N."""
    mutant = np.asarray(mutant, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    groups = pool_cells(n * expected)
    m = np.array([mutant[g].sum() for g in groups])
    e = np.array([expected[g].sum() for g in groups])
    return float(n * ((m - e) ** 2 / e).sum()), max(len(groups) - 1, 1)


def z_test(sample_mean: float, mean: float, variance: float, n: int, bound: float = 5.3) -> bool:
    """True when |z| < bound (two-sided alpha ~ 1e-7 at 5.3)."""
    if variance <= 0:
        return abs(sample_mean - mean) < 1e-12
    return abs(sample_mean - mean) / np.sqrt(variance / n) < bound
