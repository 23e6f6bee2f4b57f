"""The engine's token-level kernels (spec_fast.verify.otlp, built on spec_fast/verify/solvers.py) on the float edge
catalogue (tests/float_edges.py) in float64 and float32: the branching law given the drafts and the
acceptance rate equal spec_ref's (exact at these edges, tests/ref/test_float_edges.py) to 1e-9 (float32
inputs: 1e-6, as spec_ref renormalises the float32 sums in float64), never NaN,
and a sampled token lies in the branching law's support. Pairs in float32 use float32's own subnormals."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from spec_fast.verify.otlp import SOLVER_NAMES, solver_acceptance, solver_branching, solver_sample
from spec_ref import SOLVERS
from tests.float_edges import edge_pairs

CASES = [(dtype, name) for dtype in (np.float64, np.float32) for name in sorted(edge_pairs(dtype))]


@pytest.mark.parametrize("solver", SOLVER_NAMES)
@pytest.mark.parametrize(("dtype", "case"), CASES, ids=[f"{d.__name__}-{c}" for d, c in CASES])
def test_the_kernels_match_the_reference_at_the_float_edges(solver: str, dtype: type[np.floating], case: str) -> None:
    p, q = edge_pairs(dtype)[case]
    target, draft = torch.from_numpy(p.copy())[None], torch.from_numpy(q.copy())[None]
    reference = SOLVERS[solver]
    p64, q64 = p.astype(np.float64), q.astype(np.float64)
    tolerance = 1e-9 if dtype == np.float64 else 1e-6
    for k in (1, 2, 3):
        tuples = [t for t in itertools.product(range(3), repeat=k) if q[list(t)].min() > 0]
        tokens = torch.tensor(tuples)
        laws = solver_branching(solver, target.expand(len(tuples), 3), draft.expand(len(tuples), 3), tokens)
        assert bool(torch.isfinite(laws).all()), laws
        expected = np.stack([np.asarray(reference.branching(p64, q64, t), dtype=np.float64) for t in tuples])
        np.testing.assert_allclose(laws.numpy(), expected, rtol=0, atol=tolerance)
        rate = solver_acceptance(solver, target, draft, k)
        assert bool(torch.isfinite(rate).all())
        assert float(rate[0]) == pytest.approx(float(reference.acceptance(p64, q64, k)), abs=tolerance)
        for u in (0.0, 0.3, 0.7):
            uniforms = torch.full((len(tuples), 2 * k + 2), u, dtype=torch.float64)
            rows = len(tuples)
            sampled = solver_sample(solver, target.expand(rows, 3), draft.expand(rows, 3), tokens, uniforms)
            assert bool((laws.gather(1, sampled[:, None]) > 0).all()), (u, sampled)
