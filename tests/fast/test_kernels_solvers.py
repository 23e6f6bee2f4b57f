"""Token-level kernels (spec_fast.verify.otlp) against spec_ref.solvers: sample draw for draw, branching and
acceptance to float32 tolerance, on Hypothesis-drawn (p, q, draws) batches."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import spec_ref
from spec_fast.verify.otlp import SOLVER_NAMES, solver_acceptance, solver_branching, solver_sample
from spec_fast.rng import counter_uniforms
from spec_fast.verify import uniforms_per_node
from tests.fast.test_kernels_helpers import single_thread_torch, dyadic_probs

SOLVER_CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("nss", {}), ("naive", {}), ("spectr", {}), ("specinfer", {}), ("specinfer", {"specinfer_order": "draw"}),
    ("khisti", {}), ("khisti", {"khisti_truncation": 2}),
]
IDS = [n + "".join(f"-{v}" for v in o.values()) for n, o in SOLVER_CONFIGS]
TOLERANCE = 1e-6  # float32 inputs, float64 arithmetic: agreement far below float32 resolution
#: SpecTr: where p = q, f(rho) = -(1 - 1/rho)^k is flat near rho = 1 and both bisections stop where rounding
#: of beta decides the sign (rho - 1 ~ 1e-6 with numpy's pairwise sum); the laws then differ by ~rho - 1.
TOLERANCES = {"spectr": 2e-5}


def _reference_solver(name: str, options: dict[str, Any]) -> spec_ref.Solver:
    if name == "specinfer":
        return spec_ref.SpecInferSolver(options.get("specinfer_order", "uniform"))
    if name == "khisti":
        return spec_ref.KhistiSolver(options.get("khisti_truncation", 5))
    return spec_ref.SOLVERS[name]


@st.composite
def solver_batches(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """``p, q [B, V]`` dyadic (some rows with p = q, some with a one-hot or sparse p), draws [B, K] from q."""
    seed = draw(st.integers(0, 2**32 - 1))
    batch = draw(st.integers(1, 6))
    vocab = draw(st.integers(2, 5))
    k = draw(st.integers(0, 3))
    family = draw(st.sampled_from(["dirichlet", "peaked", "sparse"]))
    rng = np.random.default_rng(seed)
    p = dyadic_probs(rng, (batch, vocab), family)
    q = dyadic_probs(rng, (batch, vocab), family)
    equal = rng.random(batch) < 0.25
    p[equal] = q[equal]
    draws = np.stack([rng.choice(vocab, size=k, p=q[b]) for b in range(batch)]) if k else np.zeros((batch, 0), dtype=np.int64)
    return p, q, draws.astype(np.int64), seed


def _tensors(p: np.ndarray, q: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(p).to(torch.float32), torch.from_numpy(q).to(torch.float32)


@pytest.mark.parametrize(("name", "options"), SOLVER_CONFIGS, ids=IDS)
@settings(max_examples=30)
@given(case=solver_batches())
def test_branching_and_samples_equal_spec_ref(name: str, options: dict[str, Any], case: tuple[np.ndarray, ...]) -> None:
    p, q, draws, seed = case
    target, draft = _tensors(p, q)
    tokens = torch.from_numpy(draws)
    law = solver_branching(name, target, draft, tokens, **options)
    m = uniforms_per_node("specinfer" if name == "specinfer" else "spectr", max(tokens.shape[1], 1), **options)
    uniforms = counter_uniforms(int(seed), 0, (p.shape[0], max(m, 2)))
    sampled = solver_sample(name, target, draft, tokens, uniforms, **options)
    reference = _reference_solver(name, options)
    for b in range(p.shape[0]):
        row = [int(t) for t in draws[b]]
        expected = reference.branching(p[b], q[b], row)
        np.testing.assert_allclose(law[b].numpy(), expected, atol=TOLERANCES.get(name, TOLERANCE), rtol=0)
        source = spec_ref.ReplaySource(uniforms[b].to(torch.float64).numpy())
        assert int(sampled[b]) == reference.sample(p[b], q[b], row, source), (b, row)


@pytest.mark.parametrize(("name", "options"), SOLVER_CONFIGS, ids=IDS)
@settings(max_examples=15)
@given(case=solver_batches())
def test_acceptance_equals_spec_ref(name: str, options: dict[str, Any], case: tuple[np.ndarray, ...]) -> None:
    p, q, draws, _ = case
    k = draws.shape[1]
    target, draft = _tensors(p, q)
    got = solver_acceptance(name, target, draft, k, **options)
    reference = _reference_solver(name, options)
    expected = [float(reference.acceptance(p[b], q[b], k)) for b in range(p.shape[0])]
    np.testing.assert_allclose(got.numpy(), expected, atol=TOLERANCES.get(name, TOLERANCE), rtol=0)


def test_branching_rows_are_probability_laws() -> None:
    rng = np.random.default_rng(2)
    p = dyadic_probs(rng, (8, 6))
    q = dyadic_probs(rng, (8, 6))
    draws = torch.from_numpy(np.stack([rng.choice(6, size=3, p=q[b]) for b in range(8)]))
    for name in SOLVER_NAMES:
        law = solver_branching(name, *_tensors(p, q), draws)
        assert (law >= 0).all()
        np.testing.assert_allclose(law.sum(1).numpy(), 1.0, atol=1e-12)


def test_unknown_solver_and_bad_shapes_raise_value_error() -> None:
    p = torch.full((2, 3), 1 / 3)
    with pytest.raises(ValueError, match="solver"):
        solver_branching("bogus", p, p, torch.zeros(2, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="draft_probs.shape"):
        solver_acceptance("nss", p, p[:, :2], 1)


__all__ = ["single_thread_torch"]  # the module-scoped one-thread fixture is used via autouse
