"""The theorem runner: re-checks the machine-checkable content of every proofs/T*.md exactly.

For each theorem the runner (1) checks the file's structure: the four required sections, every cited
``spec_ref`` name resolves (import + getattr), every cited test is defined in the tests tree; (2) re-checks
the theorem's statement exactly (Fractions, :func:`spec_ref.exact_law`) on the enumerated small cases of
``proofs/_checks.py``; (3) runs the theorem's documented negative controls — mutants defined only here — and
asserts that the *same* check rejects them. A proof whose statement no longer matches the code fails here.

Test names start with the theorem ID they check (``test_t01_...``); the theorem files cite them back.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from proofs import _checks as C
from proofs._checks import CASES, F, Case
from spec_ref import SOLVERS, KhistiSolver, NaiveSolver, SpecInferSolver, SpecTrSolver, decoding_operator, exact_law
from spec_ref.solvers import KhistiRound, Solver, SolverPlan

THEOREMS = C.theorem_files()


# ==========================================================================================================
# Structure: sections, cited code, cited tests
# ==========================================================================================================
def test_every_numbered_theorem_t01_to_t08_has_a_file() -> None:
    ids = {path.name[:3] for path in THEOREMS}
    assert {f"T0{i}" for i in range(1, 9)} <= ids, sorted(ids)


@pytest.mark.parametrize("path", THEOREMS, ids=lambda p: p.name[:3])
def test_theorem_file_has_statement_proof_code_and_test_sections(path: Any) -> None:
    text = path.read_text()
    missing = [heading for heading in C.REQUIRED_SECTIONS if heading not in text]
    assert not missing, f"{path.name} lacks {missing}"
    assert len(C.section(text, "## Proof").strip()) > 400, f"{path.name}: the proof is a stub"


@pytest.mark.parametrize("path", THEOREMS, ids=lambda p: p.name[:3])
def test_every_spec_ref_name_a_theorem_cites_exists(path: Any) -> None:
    names = C.cited_code(path.read_text())
    assert names, f"{path.name} cites no spec_ref code"
    missing = []
    for dotted in names:
        try:
            C.resolve(dotted)
        except (ImportError, AttributeError):
            missing.append(dotted)
    assert not missing, f"{path.name} cites names that do not exist in spec_ref: {missing}"


@pytest.mark.parametrize("path", THEOREMS, ids=lambda p: p.name[:3])
def test_every_test_a_theorem_cites_exists(path: Any) -> None:
    tests = C.cited_tests(path.read_text())
    assert tests, f"{path.name} cites no test"
    missing = [f"{file}::{name}" for file, name in tests if not C.defines_test(file, name)]
    assert not missing, f"{path.name} cites tests that are not defined: {missing}"


def test_the_index_lists_every_theorem_file() -> None:
    index = (C.PROOFS / "README.md").read_text()
    missing = [path.name for path in THEOREMS if path.name not in index]
    assert not missing, f"proofs/README.md does not list {missing}"


def test_structure_checks_reject_a_file_with_a_missing_section_a_bad_name_and_a_bad_test() -> None:
    """Negative control for the three structural checks above."""
    bad = (
        "# T99\n## Statement\nx\n## Proof\nshort\n## Code\n`spec_ref.solvers.no_such_function`\n"
        "## Tests\n`tests/ref/test_solvers_exact.py::test_that_does_not_exist`\n"
    )
    assert "## Seed" not in bad and len(C.section(bad, "## Proof").strip()) <= 400
    with pytest.raises(AttributeError):
        C.resolve(C.cited_code(bad)[0])
    (file, name), = C.cited_tests(bad)
    assert not C.defines_test(file, name)
    assert C.defines_test("proofs/test_proofs.py", "test_the_index_lists_every_theorem_file")


# ==========================================================================================================
# T01: the five OTLP solvers are lossless, with the stated branching law and acceptance rate
# ==========================================================================================================
KS_FOR = {3: (0, 1, 2, 3), 4: (0, 1, 2)}


def case_ks(case: Case) -> tuple[int, ...]:
    return KS_FOR[case.vocab]


def lossless_failures(solver: Solver, cases: tuple[Case, ...] = CASES) -> list[str]:
    """The T01 losslessness check: every (case, k) where the solver's exact output law is not p."""
    failures = []
    for case in cases:
        for k in case_ks(case):
            plan = solver.plan(list(case.target_probs), list(case.draft_probs), k)
            law = C.marginal_law(solver, plan)
            if not C.laws_equal(law, C.vector_law(case.target_probs)):
                failures.append(f"{case.name}, k={k}: TV={float(C.total_variation(law, C.vector_law(case.target_probs))):.3g}")
    return failures


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_t01_every_solver_outputs_exactly_the_target_law_on_every_case(name: str) -> None:
    assert lossless_failures(SOLVERS[name]) == []


def stated_branching(name: str, solver: Solver, plan: SolverPlan, draws: tuple[int, ...]) -> list[Fraction]:
    """The branching law B(. | draws) exactly as T01 states it, computed independently of solver._branching."""
    p = [F(v) for v in plan.target_probs]
    q = [F(v) for v in plan.draft_probs]
    if name == "nss":
        return p
    if name == "naive":
        return C.naive_branching(p, q, draws)
    if name == "spectr":
        return C.spectr_branching(p, q, draws, F(plan.extras["rho"]))
    if name == "specinfer":
        return C.specinfer_branching(p, q, draws, order=getattr(solver, "order", "uniform"))
    assert name == "khisti"
    # pi_k by the tournament DP over the per-round KEEP1 of the plan, then single-draft SpS against r_k.
    pi: dict[int, Fraction] = {draws[0]: F(1)}
    for pair, challenger in zip(plan.extras["rounds"], draws[1:]):
        nxt: dict[int, Fraction] = {}
        for champion, mass in pi.items():
            keep = F(pair.keep_first(champion, challenger))
            nxt[champion] = nxt.get(champion, F(0)) + mass * keep
            nxt[challenger] = nxt.get(challenger, F(0)) + mass * (1 - keep)
        pi = nxt
    r = [F(v) for v in plan.extras["champion_law"]]
    out = [F(0)] * len(p)
    accepted = F(0)
    for champion, mass in pi.items():
        a = C.acc(r[champion], p[champion])
        out[champion] += mass * a
        accepted += mass * a
    residual = C.res(p, r)
    return [o + (1 - accepted) * v for o, v in zip(out, residual)]


def branching_failures(name: str, solver: Solver, formula: Any = None) -> list[str]:
    """Every (case, draws) where the exact conditional law differs from the stated (or given) formula."""
    formula = formula or stated_branching
    failures = []
    for case in CASES:
        for k in (1, 2, 3) if case.vocab == 3 else (1, 2):
            plan = solver.plan(list(case.target_probs), list(case.draft_probs), k)
            for draws in C.draft_tuples(case.draft_probs, k):
                law = C.as_vector(C.conditional_law(solver, plan, draws), case.vocab)
                if law != formula(name, solver, plan, draws):
                    failures.append(f"{case.name}, draws={draws}")
                elif law != [F(v) for v in solver.branching_planned(plan, draws)]:
                    failures.append(f"{case.name}, draws={draws}: spec_ref branching differs")
    return failures


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_t01_conditional_law_given_each_draft_tuple_is_the_stated_branching_law(name: str) -> None:
    assert branching_failures(name, SOLVERS[name]) == []


def test_t01_specinfer_in_draw_order_also_has_the_stated_branching_law_and_is_lossless() -> None:
    solver = SpecInferSolver("draw")
    assert branching_failures("specinfer", solver) == []
    assert lossless_failures(solver) == []


def test_t01_literal_seed_algorithm_14_is_rejected_by_the_branching_check() -> None:
    """Negative control: Alg 14 as printed (a_i from P_{i-1}) is not the law of SpecInfer."""

    def literal(name: str, solver: Solver, plan: SolverPlan, draws: tuple[int, ...]) -> list[Fraction]:
        p, q = [F(v) for v in plan.target_probs], [F(v) for v in plan.draft_probs]
        return C.specinfer_branching(p, q, draws, shift=1)

    assert branching_failures("specinfer", SOLVERS["specinfer"], literal) != []


def stated_acceptance(name: str, plan: SolverPlan) -> Fraction:
    p = [F(v) for v in plan.target_probs]
    q = [F(v) for v in plan.draft_probs]
    k = plan.k
    if name == "nss":
        return C.nss_acceptance(p, q, k)
    if name == "naive":
        return C.naive_acceptance(p, q, k)
    if name == "spectr":
        return C.spectr_acceptance(p, q, k, F(plan.extras["rho"]))
    if name == "specinfer":
        return C.specinfer_acceptance(p, q, k)
    raise AssertionError(name)


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_t01_acceptance_rate_equals_the_stated_closed_form_and_the_enumerated_truth(name: str) -> None:
    solver = SOLVERS[name]
    for case in CASES:
        for k in case_ks(case):
            plan = solver.plan(list(case.target_probs), list(case.draft_probs), k)
            truth = C.acceptance_from_joint(C.joint_law(solver, plan))
            assert F(solver.acceptance(list(case.target_probs), list(case.draft_probs), k)) == truth, (case.name, k)
            if name == "khisti":
                # Alg 10: sum min(p, r_k) = P(Y = champion) <= alpha (T01, Khisti part).
                r = [F(v) for v in plan.extras["champion_law"]]
                bound = F(solver.acceptance_lower_bound(list(case.target_probs), list(case.draft_probs), k))
                assert bound == (sum((min(a, b) for a, b in zip(case.target_probs, r)), F(0)) if k else 0)
                assert bound <= truth
            else:
                assert stated_acceptance(name, plan) == truth, (case.name, k)


def test_t01_the_residual_term_of_seed_algorithm_9_is_identically_zero() -> None:
    for case in CASES:
        for k in case_ks(case):
            alpha, residual_term = C.specinfer_alg9_literal(list(case.target_probs), list(case.draft_probs), k)
            assert residual_term == 0, (case.name, k)
            assert alpha == C.specinfer_acceptance(list(case.target_probs), list(case.draft_probs), k)


def test_t01_khisti_champion_after_each_round_has_exactly_the_round_law() -> None:
    """Lemma K of T01: given draws i.i.d. ~ q, the champion after round t has law r_t."""
    solver = SOLVERS["khisti"]
    for case in CASES:
        for k in (2, 3):
            plan = solver.plan(list(case.target_probs), list(case.draft_probs), k)
            for t in range(2, k + 1):
                law = [F(0)] * case.vocab
                for draws in C.draft_tuples(case.draft_probs, t):
                    weight = F(1)
                    for x in draws:
                        weight *= case.draft_probs[x]
                    for champion, mass in solver.champion_distribution(plan, draws).items():
                        law[champion] += weight * F(mass)
                assert law == [F(v) for v in plan.extras["rounds"][t - 2].law], (case.name, k, t)


class _FailedLP:
    status = 2
    x = None


def test_t01_khisti_lp_failure_fallback_keeps_the_champion_and_stays_lossless(monkeypatch: pytest.MonkeyPatch) -> None:
    import spec_ref.solvers as solvers_module

    monkeypatch.setattr(solvers_module, "linprog", lambda *args, **kwargs: _FailedLP())
    solver = KhistiSolver()
    assert lossless_failures(solver) == []
    case = CASES[1]
    plan = solver.plan(list(case.target_probs), list(case.draft_probs), 3)
    assert all(pair.keep is None for pair in plan.extras["rounds"])
    assert [F(v) for v in plan.extras["champion_law"]] == list(case.draft_probs)


class SeedKhistiFallback(KhistiSolver):
    """Negative control: the seed authors' LP-failure fallback (declare r = q1 but select with w = 1/2)."""

    def _plan(self, target: Any, draft: Any, k: int) -> SolverPlan:
        plan = super()._plan(target, draft, k)
        rounds = []
        for pair in plan.extras["rounds"]:
            half = np.full((pair.truncation, pair.truncation), F(1, 2), dtype=object)
            rounds.append(KhistiRound(pair.rank, pair.truncation, half, draft.copy()))
        return SolverPlan(self.name, target, draft, k, {"rounds": tuple(rounds), "champion_law": draft.copy()})


def test_t01_seed_khisti_lp_failure_fallback_is_rejected_by_the_losslessness_check() -> None:
    assert lossless_failures(SeedKhistiFallback(truncation=2)) != []


@pytest.mark.parametrize("name", ["spectr", "specinfer", "khisti"])
def test_t01_with_one_draft_spectr_specinfer_and_khisti_equal_naive_in_joint_law(name: str) -> None:
    naive, solver = SOLVERS["naive"], SOLVERS[name]
    for case in CASES:
        args = (list(case.target_probs), list(case.draft_probs), 1)
        assert C.joint_law(solver, solver.plan(*args)) == C.joint_law(naive, naive.plan(*args)), case.name


class NaiveResampleFromTarget(NaiveSolver):
    """Negative control: on rejection resample from p instead of Res(p, q)."""

    def _sample(self, plan: SolverPlan, tokens: tuple[int, ...], rng: Any) -> int:
        first = tokens[0]
        if rng.uniform() * plan.draft_probs[first] < plan.target_probs[first]:
            return first
        return rng.categorical(plan.target_probs)


class SpecInferNoResidualUpdate(SpecInferSolver):
    """Negative control: SpecInfer testing every round against p (no residual update between rounds)."""

    def _plan(self, target: Any, draft: Any, k: int) -> SolverPlan:
        plan = super()._plan(target, draft, k)
        return SolverPlan(self.name, target, draft, k, {"chain": tuple([target] * k + [plan.extras["chain"][-1]])})


class SpecInferDrawsAsTheyCome(SpecInferSolver):
    """Negative control: SpecInfer in draw order that also zeroes each rejected token in q (a without-replacement
    update applied to i.i.d. draws; the true rule never changes q)."""

    def _sample(self, plan: SolverPlan, tokens: tuple[int, ...], rng: Any) -> int:
        target, draft = plan.target_probs.copy(), plan.draft_probs.copy()
        for token in tokens:
            if rng.uniform() * draft[token] < target[token]:
                return token
            mass = np.maximum(target - draft, 0)
            target = mass / mass.sum() if mass.sum() > 0 else target
            draft[token] = 0 * draft[token]
            draft = draft / draft.sum() if draft.sum() > 0 else plan.draft_probs.copy()
        return rng.categorical(target)


@pytest.mark.parametrize(
    "mutant", [NaiveResampleFromTarget(), SpecInferNoResidualUpdate(), SpecInferDrawsAsTheyCome()], ids=lambda m: type(m).__name__
)
def test_t01_losslessness_check_rejects_the_documented_lossy_variants(mutant: Solver) -> None:
    assert lossless_failures(mutant) != []


# ==========================================================================================================
# T02: SpecTr's rho*
# ==========================================================================================================
def spectr_k_cases() -> list[tuple[Case, int]]:
    return [(case, k) for case in CASES for k in (2, 3, 4)]


def test_t02_f_is_non_increasing_with_f1_non_negative_and_fk_non_positive() -> None:
    for case, k in spectr_k_cases():
        p, q = case.target_probs, case.draft_probs
        values = [C.spectr_f(p, q, k, rho) for rho in C.rho_grid(p, q, k)]
        assert values[0] >= 0 and values[-1] <= 0, (case.name, k)
        assert all(a >= b for a, b in zip(values, values[1:])), (case.name, k)
        accept_all = [1 - (1 - C.spectr_beta(p, q, rho)) ** k for rho in C.rho_grid(p, q, k)]
        assert all(a >= b for a, b in zip(accept_all, accept_all[1:])), (case.name, k)


def test_t02_rho_star_returns_the_feasible_upper_bracket_of_the_bisection() -> None:
    for case, k in spectr_k_cases():
        p, q = case.target_probs, case.draft_probs
        plan = SOLVERS["spectr"].plan(list(p), list(q), k)
        rho = F(plan.extras["rho"])
        lo, hi = C.bisection_brackets(p, q, k, 64)
        assert rho == hi and hi - lo == F(k - 1, 2**64), (case.name, k)
        assert C.spectr_f(p, q, k, hi) <= 0, (case.name, k)  # hi is feasible
        assert lo == 1 or C.spectr_f(p, q, k, lo) > 0, (case.name, k)  # lo is 1 or infeasible
        assert all(F(v) >= 0 for v in plan.extras["raw_residual"]), (case.name, k)


def test_t02_residual_is_non_negative_exactly_when_rho_is_feasible_or_no_token_is_capped_by_p() -> None:
    for case, k in spectr_k_cases():
        p, q = case.target_probs, case.draft_probs
        for rho in C.rho_grid(p, q, k):
            non_negative = all(v >= 0 for v in C.spectr_raw_residual(p, q, k, rho))
            feasible = C.spectr_f(p, q, k, rho) <= 0
            capped_by_p = any(0 < pt <= rho * qt for pt, qt in zip(p, q))
            if feasible:
                assert non_negative, (case.name, k, rho)
            if capped_by_p:
                assert non_negative == feasible, (case.name, k, rho)


class SpecTrFixedRho(SpecTrSolver):
    """K-SEQ at a given division factor (a test-only device: rho is chosen by the checks of T02)."""

    def __init__(self, rho_for: Any) -> None:
        super().__init__()
        self.rho_for = rho_for

    def _plan(self, target: Any, draft: Any, k: int) -> SolverPlan:
        rho = self.rho_for([F(v) for v in target], [F(v) for v in draft], k)
        capped = np.minimum(target / rho, draft)
        beta = capped.sum()
        accept_all = 1 - (1 - beta) ** k
        gamma = accept_all / beta if beta > 0 else rho
        raw = target - gamma * capped
        mass = np.maximum(raw, 0)
        law = mass / mass.sum() if mass.sum() > 0 else target
        extras = {"rho": rho, "beta": beta, "accept_all": accept_all, "residual": law, "raw_residual": raw}
        return SolverPlan(self.name, target, draft, k, extras)


def test_t02_k_seq_at_rho_is_lossless_exactly_when_its_residual_is_non_negative() -> None:
    for case in CASES[:4]:
        p, q = case.target_probs, case.draft_probs
        for rho in C.rho_grid(p, q, 2, steps=4):
            solver = SpecTrFixedRho(lambda *_: rho)
            plan = solver.plan(list(p), list(q), 2)
            lossless = C.laws_equal(C.marginal_law(solver, plan), C.vector_law(p))
            non_negative = all(v >= 0 for v in C.spectr_raw_residual(p, q, 2, rho))
            assert lossless == non_negative, (case.name, rho)


def test_t02_an_infeasible_rho_with_no_token_capped_by_p_still_has_a_non_negative_residual() -> None:
    """The exact counterexample of T02 (remark): the phrase 'non-negative only if feasible' needs the qualifier."""
    p, q, k, rho = [F(1, 2), F(1, 2), F(0)], [F(1, 10), F(1, 10), F(4, 5)], 2, F(3, 2)
    assert C.spectr_f(p, q, k, rho) == F(3, 50) > 0
    assert C.spectr_raw_residual(p, q, k, rho) == [F(8, 25), F(8, 25), F(0)]
    solver = SpecTrFixedRho(lambda *_: rho)
    assert C.laws_equal(C.marginal_law(solver, solver.plan(p, q, k)), C.vector_law(p))


def lower_bracket(iterations: int) -> Any:
    return lambda p, q, k: C.bisection_brackets(p, q, k, iterations)[0] if k > 1 else F(1)


@pytest.mark.parametrize(
    "mutant",
    [SpecTrFixedRho(lower_bracket(8)), SpecTrFixedRho(lower_bracket(64)), SpecTrFixedRho(lambda p, q, k: F(1))],
    ids=["lower bracket after 8 steps", "lower bracket after 64 steps", "rho = 1"],
)
def test_t02_losslessness_check_rejects_the_lower_bracket_and_rho_one(mutant: Solver) -> None:
    assert lossless_failures(mutant) != []


def test_t02_upper_bracket_after_only_8_steps_is_still_lossless() -> None:
    solver = SpecTrFixedRho(lambda p, q, k: C.bisection_brackets(p, q, k, 8)[1] if k > 1 else F(1))
    assert lossless_failures(solver) == []
    assert lossless_failures(SpecTrSolver(iterations=8)) == []


# ==========================================================================================================
# T08: the decoding operator and draft provenance
# ==========================================================================================================
LOGITS = [2.0, 1.5, 1.5, -0.5]
SETTINGS = [(1.0, None, None), (0.7, None, None), (1.3, 3, None), (1.0, 2, None), (0.9, None, 0.8), (1.0, 3, 0.7)]


def exact_probs(values: Any) -> list[Fraction]:
    """A float64 probability vector as exact Fractions (each float's exact value), renormalised exactly."""
    exact = [F(float(v)) for v in values]
    total = sum(exact, F(0))
    return [v / total for v in exact]


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_t08_every_solver_reproduces_g_of_the_target_and_not_the_raw_softmax(name: str) -> None:
    solver = SOLVERS[name]
    draft = exact_probs(decoding_operator([0.5, 1.0, -1.0, 0.0], 1.0))
    raw = exact_probs(decoding_operator(LOGITS, 1.0))
    for temperature, top_k, top_p in SETTINGS:
        target = exact_probs(decoding_operator(LOGITS, temperature, top_k, top_p))
        for k in (1, 2):
            law = C.marginal_law(solver, solver.plan(target, draft, k))
            assert C.laws_equal(law, C.vector_law(target)), (temperature, top_k, top_p, k)
            if (temperature, top_k, top_p) != (1.0, None, None):
                assert not C.laws_equal(law, C.vector_law(raw))
    truncated = exact_probs(decoding_operator(LOGITS, 1.0, 2, None))
    law = C.marginal_law(solver, solver.plan(truncated, draft, 2))
    assert set(law) == {0, 1, 2} and law.get(3, 0) == 0  # top-k keeps the tie at the 2nd largest logit


def test_t08_greedy_g_is_the_one_hot_at_the_lowest_index_argmax() -> None:
    assert list(decoding_operator([1.0, 3.0, 3.0, 0.0], 0.0)) == [0.0, 1.0, 0.0, 0.0]
    for name, solver in SOLVERS.items():
        law = C.marginal_law(solver, solver.plan([F(0), F(1), F(0), F(0)], [F(1, 4)] * 4, 2))
        assert law == {1: 1}, name


@pytest.mark.parametrize("name", ["naive", "spectr", "specinfer", "khisti"])
def test_t08_verifying_drafts_with_a_distribution_other_than_their_sampling_law_is_lossy(name: str) -> None:
    """Drafts sampled from q_true, verified with q_used = p != q_true: the output law is q_true, not p."""
    solver = SOLVERS[name]
    q_true = [F(1, 2), F(1, 4), F(1, 4)]
    q_used = [F(1, 6), F(1, 2), F(1, 3)]
    target = q_used
    plan = solver.plan(target, q_used, 1)

    def run(rng: Any) -> int:
        draw = rng.categorical(np.array(q_true, dtype=object))
        return solver.sample_planned(plan, (draw,), rng)

    assert C.vector_law(q_true) == exact_law(run)
    assert exact_law(run) != C.vector_law(target)
    # A temperature-mismatched draft: sampled from G(l, 1), verified with G(l, 1/2): lossy for k = 2 too.
    draft_logits = [0.0, 1.0, 0.5]
    sampled = exact_probs(decoding_operator(draft_logits, 1.0))
    claimed = exact_probs(decoding_operator(draft_logits, 0.5))
    target = [F(1, 3), F(1, 3), F(1, 3)]
    plan = solver.plan(target, claimed, 2)

    def run2(rng: Any) -> int:
        draws = tuple(rng.categorical(np.array(sampled, dtype=object)) for _ in range(2))
        return solver.sample_planned(plan, draws, rng)

    assert not C.laws_equal(exact_law(run2), C.vector_law(target))


def test_t08_nss_ignores_the_draft_law_and_a_drafted_token_of_zero_claimed_mass_is_refused() -> None:
    solver = SOLVERS["nss"]
    target = [F(1, 6), F(1, 2), F(1, 3)]
    plan = solver.plan(target, [F(1, 3)] * 3, 1)

    def run(rng: Any) -> int:
        draw = rng.categorical(np.array([F(1, 2), F(1, 2), F(0)], dtype=object))
        return solver.sample_planned(plan, (draw,), rng)

    assert exact_law(run) == C.vector_law(target)
    with pytest.raises(ValueError, match="draft"):
        SOLVERS["naive"].sample(target, [F(1, 2), F(1, 2), F(0)], [2], 0)


def test_t08_the_same_construction_with_the_true_draft_law_is_lossless() -> None:
    """Control for the check above: with q_used = q_true the same construction is lossless."""
    for name in ("naive", "spectr", "specinfer", "khisti"):
        solver = SOLVERS[name]
        q_true = [F(1, 2), F(1, 4), F(1, 4)]
        target = [F(1, 6), F(1, 2), F(1, 3)]
        plan = solver.plan(target, q_true, 2)

        def run(rng: Any) -> int:
            draws = tuple(rng.categorical(np.array(q_true, dtype=object)) for _ in range(2))
            return solver.sample_planned(plan, draws, rng)

        assert exact_law(run) == C.vector_law(target), name

