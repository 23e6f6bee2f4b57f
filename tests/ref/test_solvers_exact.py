"""Exact laws of the five OTLP solvers by enumeration (docs/testing.md section 4.1, layer A1-A4; proofs/T01, T02).

One joint enumeration per example covers the drafts (sampled from q inside the enumerated function, never
chosen by Hypothesis) and every internal branch of the solver, in exact Fraction arithmetic. From the joint
law of (draft tuple, output) the tests read off, with ``==``:

* the marginal law of the output, which must equal p (Def. 3.2, losslessness);
* the conditional law given each draft tuple, which must equal ``branching`` (appendix D);
* P(output in draws), which must equal ``acceptance`` (appendix C; Khisti: also >= Alg 10's bound).
"""

from __future__ import annotations

import itertools
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from spec_ref import SOLVERS, KhistiSolver, SpecInferSolver, exact_law
from spec_ref.solvers import Solver, SolverPlan
from tests.ref.mutants import NaiveResampleFromTarget, SpecInferNoResidualUpdate
from tests.strategies import exact_pair

F = Fraction
EXAMPLES = settings.default.max_examples


def joint_law(solver: Solver, plan: SolverPlan) -> dict[Any, Fraction]:
    def run(rng: Any) -> tuple[tuple[int, ...], int]:
        tokens = tuple(rng.categorical(plan.draft_probs) for _ in range(plan.k))
        return tokens, solver.sample_planned(plan, tokens, rng)

    return exact_law(run)  # type: ignore[return-value]


def check_solver_exactly(solver: Solver, target: list[Fraction], draft: list[Fraction], k: int) -> None:
    plan = solver.plan(target, draft, k)
    law = joint_law(solver, plan)
    vocab = len(target)
    marginal = [sum((w for (_, y), w in law.items() if y == t), F(0)) for t in range(vocab)]
    assert marginal == list(plan.target_probs), f"{solver!r} is not lossless: {marginal} != {target}"
    tuples: dict[tuple[int, ...], Fraction] = {}
    for (tokens, _), w in law.items():
        tuples[tokens] = tuples.get(tokens, F(0)) + w
    for tokens, mass in tuples.items():
        conditional = [law.get((tokens, t), F(0)) / mass for t in range(vocab)]
        assert conditional == list(solver.branching_planned(plan, tokens)), f"branching differs at draws {tokens}"
    accepted = sum((w for (tokens, y), w in law.items() if y in tokens), F(0))
    assert accepted == solver.acceptance(target, draft, k)


@pytest.mark.parametrize("name", sorted(SOLVERS))
@settings(max_examples=EXAMPLES)
@given(pair=exact_pair(max_size=4), k=st.integers(0, 3))
@example(pair=([F(1), F(0)], [F(0), F(1)]), k=2)  # disjoint supports: SpecTr's beta = 0 (0/0 without the guard)
@example(pair=([F(1, 2), F(1, 2)], [F(1, 2), F(1, 2)]), k=3)  # p = q: every draft accepted
@example(pair=([F(1)], [F(1)]), k=3)  # V = 1
def test_solver_output_law_branching_and_acceptance_are_exact(name: str, pair: tuple[list[F], list[F]], k: int) -> None:
    target, draft = pair
    check_solver_exactly(SOLVERS[name], target, draft, k)


@pytest.mark.parametrize(
    "solver",
    [SOLVERS["spectr"], SOLVERS["specinfer"], SpecInferSolver("draw"), SOLVERS["khisti"], KhistiSolver(truncation=2)],
    ids=repr,
)
def test_solver_is_exact_on_a_larger_case_with_four_draws(solver: Solver) -> None:
    target = [F(5, 16), F(1, 4), F(1, 8), F(5, 16)]
    draft = [F(1, 8), F(1, 2), F(1, 4), F(1, 8)]
    check_solver_exactly(solver, target, draft, 4)


def test_khisti_exact_acceptance_is_at_least_its_lower_bound_and_reaches_the_two_draft_optimum() -> None:
    # For K = 2 and truncation s >= V the pair LP reaches min_S [p(S) + 1 - q(S)^2] (docs/algorithms.md section 3.5).
    target = [F(1, 2), F(1, 4), F(1, 8), F(1, 8)]
    draft = [F(1, 8), F(1, 8), F(1, 4), F(1, 2)]
    solver = KhistiSolver(truncation=4)
    exact = solver.acceptance(target, draft, 2)
    bound = solver.acceptance_lower_bound(target, draft, 2)
    assert bound <= exact
    optimum = min(
        sum((target[i] for i in subset), F(0)) + 1 - sum((draft[i] for i in subset), F(0)) ** 2
        for r in range(5)
        for subset in itertools.combinations(range(4), r)
    )
    assert abs(float(bound) - float(optimum)) < 1e-9  # the LP is solved in float64 by HiGHS


@settings(max_examples=EXAMPLES)
@given(pair=exact_pair(max_size=4))
def test_spectr_specinfer_and_khisti_with_one_draft_equal_naive_in_law(pair: tuple[list[F], list[F]]) -> None:
    target, draft = pair
    naive = SOLVERS["naive"]
    reference = joint_law(naive, naive.plan(target, draft, 1))
    for name in ("spectr", "specinfer", "khisti"):
        solver = SOLVERS[name]
        assert joint_law(solver, solver.plan(target, draft, 1)) == reference, name


# ---------------------------------------------------------------------------------------------------------
# Negative controls: known-bad variants, defined only here, must fail the same exact checks.
# ---------------------------------------------------------------------------------------------------------
class SpecTrLowerBracket(type(SOLVERS["spectr"])):  # type: ignore[misc]
    """SpecTr with rho from the LOWER bisection bracket (docs/algorithms.md section 3.3: lossy)."""

    def _plan(self, target: Any, draft: Any, k: int) -> SolverPlan:
        plan = super()._plan(target, draft, k)
        one = F(1)
        lo, hi = one, one * k
        for _ in range(self.iterations):
            mid = (lo + hi) / 2
            beta = np.minimum(target / mid, draft).sum()
            if one - (one - beta) ** k <= mid * beta:
                hi = mid
            else:
                lo = mid
        capped = np.minimum(target / lo, draft)
        beta = capped.sum()
        gamma = (one - (one - beta) ** k) / beta
        mass = np.maximum(target - gamma * capped, 0)
        extras = dict(plan.extras, rho=lo, residual=mass / mass.sum())
        return SolverPlan(self.name, target, draft, k, extras)


CONTROL_TARGET = [F(1, 2), F(1, 4), F(1, 4), F(0)]
CONTROL_DRAFT = [F(1, 8), F(1, 8), F(1, 2), F(1, 4)]


@pytest.mark.parametrize(
    "mutant", [SpecTrLowerBracket(), NaiveResampleFromTarget(), SpecInferNoResidualUpdate()], ids=lambda m: type(m).__name__
)
def test_exact_check_rejects_known_lossy_variants(mutant: Solver) -> None:
    plan = mutant.plan(CONTROL_TARGET, CONTROL_DRAFT, 3)
    law = joint_law(mutant, plan)
    marginal = [sum((w for (_, y), w in law.items() if y == t), F(0)) for t in range(4)]
    assert marginal != CONTROL_TARGET


def test_literal_seed_algorithm_14_differs_from_the_true_specinfer_branching() -> None:
    """Alg 14 as printed uses a_i with P_{i-1} in the state with i rejections (docs/algorithms.md section 3.4)."""
    solver = SOLVERS["specinfer"]
    plan = solver.plan(CONTROL_TARGET, CONTROL_DRAFT, 2)
    chain = plan.extras["chain"]
    q = plan.draft_probs

    def literal(rejections: int, remaining: tuple[int, ...]) -> Any:
        if not remaining:
            return chain[rejections]
        total = 0 * q
        for j, t in enumerate(remaining):
            index = max(rejections - 1, 0)  # the seed's shifted index (a_0 undefined: take P_0)
            a = min(F(1), chain[index][t] / q[t])
            onehot = 0 * q
            onehot[t] = F(1)
            total = total + a * onehot + (1 - a) * literal(rejections + 1, remaining[:j] + remaining[j + 1:])
        return total / len(remaining)

    law = joint_law(solver, plan)
    differs = False
    for tokens in {t for t, _ in law}:
        mass = sum((w for (t, _), w in law.items() if t == tokens), F(0))
        conditional = [law.get((tokens, y), F(0)) / mass for y in range(4)]
        assert conditional == list(solver.branching_planned(plan, tokens))
        differs |= conditional != list(literal(0, tokens))
    assert differs


def test_seed_khisti_lp_failure_fallback_is_inconsistent_while_ours_is_exact() -> None:
    """The seed authors' fallback (r = q1 with w = 0.5) does not induce q1; ours (keep X1) does."""
    from spec_ref.solvers import KhistiRound, _khisti_induced_law

    q1 = np.array([F(1, 2), F(1, 4), F(1, 4)], dtype=object)
    q2 = np.array([F(1, 8), F(5, 8), F(1, 4)], dtype=object)
    order, rank = [1, 0, 2], [1, 0, 2]
    half = np.full((2, 2), F(1, 2), dtype=object)
    assert list(_khisti_induced_law(q1, q2, order, rank, 2, half)) != list(q1)
    ours = KhistiRound(tuple(rank), 2, None, q1)
    induced = [F(0)] * 3
    for a, b in itertools.product(range(3), repeat=2):
        keep = ours.keep_first(a, b)
        induced[a] += q1[a] * q2[b] * keep
        induced[b] += q1[a] * q2[b] * (1 - keep)
    assert induced == list(q1)


@settings(max_examples=EXAMPLES)
@given(pair=exact_pair(min_size=2, max_size=4), seed=st.integers(0, 2**32 - 1))
def test_khisti_round_law_equals_the_winner_law_of_its_own_selection_rule(pair: tuple[list[F], list[F]], seed: int) -> None:
    """r_t computed in closed form equals the brute-force law of SEL(w_t, rank_t) over all pairs."""
    target, draft = pair
    rng = np.random.default_rng(seed)
    plan = KhistiSolver(truncation=int(rng.integers(1, 4))).plan(target, draft, 3)
    champion_law = plan.draft_probs
    for pair_round in plan.extras["rounds"]:
        induced = [F(0)] * len(target)
        for a, b in itertools.product(range(len(target)), repeat=2):
            keep = pair_round.keep_first(a, b)
            induced[a] += champion_law[a] * plan.draft_probs[b] * keep
            induced[b] += champion_law[a] * plan.draft_probs[b] * (1 - keep)
        assert induced == list(pair_round.law)
        champion_law = pair_round.law
