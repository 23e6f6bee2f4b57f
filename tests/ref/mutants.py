"""Known-bad solver variants (negative controls), defined only in the tests, never as product flags."""

from __future__ import annotations

from typing import Any

from spec_ref import SOLVERS, SpecInferSolver
from spec_ref.solvers import SolverPlan


class NaiveResampleFromTarget(type(SOLVERS["naive"])):  # type: ignore[misc]
    """On rejection resample from p instead of Res(p, q) (docs/testing.md section 7, first row)."""

    def _sample(self, plan: SolverPlan, tokens: tuple[int, ...], rng: Any) -> int:
        first = tokens[0]
        if rng.uniform() * plan.draft_probs[first] < plan.target_probs[first]:
            return first
        return rng.categorical(plan.target_probs)


class SpecInferNoResidualUpdate(SpecInferSolver):
    """SpecInfer that keeps testing later draws against p instead of the residual chain."""

    def _plan(self, target: Any, draft: Any, k: int) -> SolverPlan:
        plan = super()._plan(target, draft, k)
        chain = tuple([target] * k + [plan.extras["chain"][-1]])
        return SolverPlan(self.name, target, draft, k, {"chain": chain})
