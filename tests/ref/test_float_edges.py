"""spec_ref at the edges of float64 (tests/float_edges.py): subnormal and huge probability ratios give the
exact law, never NaN.

For every solver, every edge pair and every tuple of k = 1..3 drafts, the float64 branching law (the
output's law given the drafts) and acceptance rate equal the same computation in exact rational
arithmetic on the same inputs (``exact_pmf``: the float values as Fractions, normalised), to 1e-12; the
output's marginal law (the branching laws weighted by the drafts' probability) is the target law to 1e-12.
Where two inputs differ only below float64's resolution of their sums, the conditional law given an event of
probability about 5e-324 can differ from the rational one (both are valid); the marginal law cannot.
Every verify method runs the same pairs in a two-path tree with numpy's floating-point errors raised
(underflow excepted, which is exact here).
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest

from spec_ref import METHODS, SOLVERS, DraftTree, ReplaySource, verify
from spec_ref._cases import exact_pmf
from tests.float_edges import edge_pairs

PAIRS = edge_pairs(np.float64)


def _exact(values: np.ndarray) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = exact_pmf(values)
    return out


@pytest.mark.parametrize("case", sorted(PAIRS))
@pytest.mark.parametrize("solver", sorted(SOLVERS))
def test_every_solver_gives_the_exact_law_at_the_float64_edges(solver: str, case: str) -> None:
    p, q = PAIRS[case]
    sol = SOLVERS[solver]
    pe, qe = _exact(p), _exact(q)
    for k in (1, 2, 3):
        marginal = np.zeros(3)
        for tokens in itertools.product(range(3), repeat=k):
            if any(q[t] == 0 for t in tokens):
                continue
            with np.errstate(over="raise", divide="raise", invalid="raise"):
                law = np.asarray(sol.branching(p, q, tokens), dtype=np.float64)
            assert np.isfinite(law).all() and (law >= 0).all() and abs(law.sum() - 1) < 1e-12, (tokens, law)
            exact = np.array([float(x) for x in sol.branching(pe, qe, tokens)])
            weight = float(np.prod([qe[t] for t in tokens]))
            if weight > 1e-300:  # a draft tuple of probability >= 1e-300: its conditional law is exact too
                np.testing.assert_allclose(law, exact, rtol=0, atol=1e-12, err_msg=str(tokens))
            marginal += weight * law
        np.testing.assert_allclose(marginal, [float(x) for x in pe], rtol=0, atol=1e-12, err_msg=f"k={k}")
        with np.errstate(over="raise", divide="raise", invalid="raise"):
            rate = float(sol.acceptance(p, q, k))
        assert rate == pytest.approx(float(sol.acceptance(pe, qe, k)), abs=1e-12)


@pytest.mark.parametrize("u", [0.0, 0.3, 0.7])  # off the steps of every CDF and acceptance test (one at u
# can sit on either side of u below float64 resolution: a set of uniforms of measure 0)
@pytest.mark.parametrize("case", sorted(PAIRS))
@pytest.mark.parametrize("method", [m for m in METHODS if m not in ("greedy", "dynatree")])
def test_every_verify_method_matches_exact_arithmetic_at_the_float64_edges(method: str, case: str, u: float) -> None:
    p, q = PAIRS[case]
    paths = [[0, 1], [0, 2]] if q[0] > 0 else [[1], [2]]
    tree = DraftTree.from_paths(paths, lambda prefix: q)
    with np.errstate(over="raise", divide="raise", invalid="raise"):
        got = verify(tree, lambda prefix: p, method, ReplaySource([u] * 64))
    exact_tree = DraftTree.from_paths(paths, lambda prefix: list(exact_pmf(q)))
    expected = verify(exact_tree, lambda prefix: list(exact_pmf(p)), method, ReplaySource([u] * 64))
    assert got.tokens == expected.tokens


def test_the_issue_case_was_nan_before_the_fix() -> None:
    """The negative control of the catalogue: the old ``min(1, p/q)`` as ``ratio * 0 + 1`` is NaN here."""
    p, q = Fraction(1, 2), 5e-324
    with np.errstate(over="ignore", invalid="ignore"):
        ratio = np.float64(0.5) / np.float64(q)
        old = ratio if ratio < 1 else ratio * 0 + 1
    assert np.isnan(old) and float(p) > q
    from spec_ref.solvers import accept_probability

    assert accept_probability(np.float64(q), np.float64(0.5)) == 1.0
