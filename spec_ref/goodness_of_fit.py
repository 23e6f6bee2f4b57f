"""Goodness-of-fit tests with a stated false-positive rate and power (docs/testing.md section 4.4).

* :func:`chi2_gof`: Pearson chi-square goodness of fit, cells pooled (smallest expected first) until every
  pooled cell has expected count >= 20, rejecting at ``chi2.isf(alpha, df)``; plus the exact support check
  (no count on a zero-probability cell).
* :func:`required_noncentrality`: the noncentrality lambda a chi-square test of ``df`` degrees of freedom
  at level ``alpha`` needs for the given power (``scipy.stats.ncx2``).
* :func:`noncentrality`: ``N * chi2(mutant || expected)`` over the same pooled cells, used by negative
  controls to prove a test has teeth at its sample size.
* :func:`samples_for_power` / :func:`power_at`: the power analysis behind :mod:`spec_ref.testing`. Since
  ``chi2(a || b) >= 4 TV(a, b)^2`` (Cauchy-Schwarz), ``N = lambda / (4 tv^2)`` samples give the stated power
  against every law at total variation ``>= tv`` (measured on the pooled cells) from the expected one.
* :func:`config_seed`: ``zlib.crc32`` of a configuration name (never Python's salted ``hash``).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np
import numpy.typing as npt
from scipy import stats

__all__ = [
    "ALPHA",
    "POWER",
    "MIN_EXPECTED",
    "Chi2Result",
    "chi2_gof",
    "config_seed",
    "noncentrality",
    "pool_cells",
    "power_at",
    "required_noncentrality",
    "samples_for_power",
]

#: Per-assertion false-positive rate used throughout ``pytest -m statistical``.
ALPHA = 1e-6
#: Power every negative control must certify against its mutant.
POWER = 0.99
#: Cells are pooled until each has at least this expected count (the chi-square approximation is then
#: calibrated far into the tail, docs/testing.md section 4.4).
MIN_EXPECTED = 20.0

ArrayLike = Union[Sequence[float], npt.NDArray[Any]]


def config_seed(name: str) -> int:
    """A stable seed for a named configuration: ``zlib.crc32`` of its UTF-8 name."""
    return zlib.crc32(name.encode("utf-8"))


def pool_cells(expected: ArrayLike, min_expected: float = MIN_EXPECTED) -> list[list[int]]:
    """Group cell indices (positive expected only) so each group has expected count >= ``min_expected``."""
    values = np.asarray(expected, dtype=np.float64)
    order = [int(i) for i in np.argsort(values, kind="stable") if values[i] > 0]
    groups: list[list[int]] = []
    current: list[int] = []
    mass = 0.0
    for i in order:
        current.append(i)
        mass += float(values[i])
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
    """One Pearson chi-square test: statistic, degrees of freedom, critical value at alpha, p-value, and the
    cells with a count but zero expected probability (``support_violations``, an exact rejection)."""

    statistic: float
    df: int
    critical: float
    p_value: float
    support_violations: tuple[int, ...]

    @property
    def rejected(self) -> bool:
        return bool(self.support_violations) or self.statistic > self.critical


def chi2_gof(counts: ArrayLike, probs: ArrayLike, alpha: float = ALPHA) -> Chi2Result:
    """Pearson chi-square of ``counts [m]`` against ``probs [m]`` with cells pooled to expected >= 20."""
    observed = np.asarray(counts, dtype=np.float64)
    probabilities = np.asarray(probs, dtype=np.float64)
    n = observed.sum()
    expected = n * probabilities
    violations = tuple(int(i) for i in np.flatnonzero((probabilities == 0) & (observed > 0)))
    groups = pool_cells(expected)
    obs = np.array([observed[g].sum() for g in groups])
    exp = np.array([expected[g].sum() for g in groups])
    df = max(len(groups) - 1, 1)
    statistic = float(((obs - exp) ** 2 / exp).sum()) if len(groups) > 1 else 0.0
    return Chi2Result(
        statistic, df, float(stats.chi2.isf(alpha, df)), float(stats.chi2.sf(statistic, df)), violations
    )


def required_noncentrality(df: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """Smallest lambda with ``P(ncx2(df, lambda) > chi2.isf(alpha, df)) >= power``."""
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


def noncentrality(n: int, mutant: ArrayLike, expected: ArrayLike) -> tuple[float, int]:
    """``(N * chi2(mutant || expected), df)`` over the cells :func:`chi2_gof` would pool at this N."""
    mutant_law = np.asarray(mutant, dtype=np.float64)
    expected_law = np.asarray(expected, dtype=np.float64)
    groups = pool_cells(n * expected_law)
    m = np.array([mutant_law[g].sum() for g in groups])
    e = np.array([expected_law[g].sum() for g in groups])
    return float(n * ((m - e) ** 2 / e).sum()), max(len(groups) - 1, 1)


def samples_for_power(df: int, tv: float, alpha: float = ALPHA, power: float = POWER) -> int:
    """Samples N so that chi-square at ``alpha`` with ``df`` degrees of freedom has at least ``power`` against
    every law at total variation >= ``tv``: ``N = required_noncentrality / (4 tv^2)``."""
    return int(math.ceil(required_noncentrality(df, alpha, power) / (4.0 * tv * tv)))


def power_at(n: int, df: int, tv: float, alpha: float = ALPHA) -> float:
    """The power of the chi-square test (N samples, ``df``, ``alpha``) against a law at total variation ``tv``:
    a lower bound, from the noncentrality ``N * 4 tv^2``."""
    critical = stats.chi2.isf(alpha, df)
    return float(stats.ncx2.sf(critical, df, n * 4.0 * tv * tv))
