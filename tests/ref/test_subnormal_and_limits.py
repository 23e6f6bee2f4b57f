"""Degenerate but valid input gives the exact behaviour (docs/testing.md section 6, items 13 and 16), and
resource limits refuse absurd sizes before doing the work."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from spec_ref import METHODS, DraftTree, KhistiSolver, ReplaySource, verify

PATH_METHODS = ["naive", "bv", "tree_mc", "traversal"]


@pytest.mark.parametrize("u", [0.0, 0.3, 0.7, 1.0 - 2.0**-53])
@pytest.mark.parametrize("paths", [[[0, 0]], [[0, 1], [0]], [[0], [1]]])
@pytest.mark.parametrize("method", [m for m in METHODS if m not in ("greedy", "dynatree")])
def test_a_subnormal_draft_probability_gives_the_exact_mode_result(method: str, paths: list[list[int]], u: float) -> None:
    """q(x) = 5e-324 for the drafted token: p/q overflowed to inf (a RuntimeWarning, and inf * 0 = NaN in
    the next weight). The float run must equal the same run in exact rational arithmetic."""
    q = [5e-324, 0.5, 0.5 - 5e-324]
    p = [0.6, 0.2, 0.2]
    pairs = [(q, p), (q, [5e-324, 0.5, 0.5])]
    if method == "khisti":  # p = q makes Khisti's pair LP degenerate: float HiGHS picks any optimum
        pairs = pairs[:1]
    for draft, target in pairs:
        tree = DraftTree.from_paths(paths, lambda prefix: draft)
        with np.errstate(over="raise", divide="raise", invalid="raise"):  # underflow to 0 is exact here
            got = verify(tree, lambda prefix: target, method, ReplaySource([u] * 64))
        exact_tree = DraftTree.from_paths(paths, lambda prefix: [Fraction(x) for x in draft])
        expected = verify(exact_tree, lambda prefix: [Fraction(x) for x in target], method, ReplaySource([u] * 64))
        assert got.tokens == expected.tokens, (draft, target)


def test_khisti_refuses_more_draws_than_its_limit_before_solving_any_lp() -> None:
    solver = KhistiSolver()
    with pytest.raises(ValueError, match=r"k=1000000 draws need 999999 pair LPs; .* at most k=256"):
        solver.plan(np.full(4, 0.25), np.full(4, 0.25), 10**6)
    assert solver.plan(np.full(4, 0.25), np.full(4, 0.25), 3).k == 3


@pytest.mark.parametrize("method", ["spectr", "specinfer", "khisti"])
def test_plans_over_a_real_vocabulary_are_not_memoised(method: str) -> None:
    """The plan memo keys on the two laws as tuples; over V = 49152 a full memo held over 10 GB (a study run
    was killed for memory). Large vocabularies bypass it with the same plan; small ones still memoise."""
    from spec_ref.verify import MEMO_MAX_VOCAB, _cached_plan, node_plan, ot_solver

    solver = ot_solver(method, {})
    rng = np.random.default_rng(0)
    size = MEMO_MAX_VOCAB + 1
    target, draft = rng.dirichlet(np.ones(size)), rng.dirichlet(np.ones(size))
    before = _cached_plan.cache_info().currsize
    plan = node_plan(solver, target, draft, 2)
    assert _cached_plan.cache_info().currsize == before
    direct = solver.plan(target, draft, 2)
    assert plan.k == direct.k == 2
    assert np.array_equal(np.asarray(plan.target_probs), np.asarray(direct.target_probs))
    small_target, small_draft = target[:8] / target[:8].sum(), draft[:8] / draft[:8].sum()
    node_plan(solver, small_target, small_draft, 2)
    assert _cached_plan.cache_info().currsize == before + 1 or _cached_plan.cache_info().currsize == 4096
