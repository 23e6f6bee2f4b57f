"""Monte Carlo on the production numpy-Generator path of the five solvers (``pytest -m statistical``).

docs/testing.md section 4.4. A fixed grid (not Hypothesis) of (solver, vocabulary size V, draws k, decoding
settings of G: temperature / top-k / top-p); each configuration is seeded with ``zlib.crc32(name)``.
Per configuration, N = 2^16 independent runs:

* D1 support: no output on a token of zero target probability (exact, no alpha);
* D2 Pearson chi-square of the output law against p, cells pooled to expected >= 20, alpha = 1e-6;
* D3 chi-square of the accept indicator against the exact acceptance rate (from the enumerator), alpha = 1e-6.

False-positive rate: 2 chi-square assertions x 15 configurations at 1e-6 = 3e-5 per full run (Bonferroni).
Power: every configuration is paired with a known-bad mutant of the same solver (defined only here); the test
asserts that the same check REJECTS the mutant's samples, and that N * chi2(mutant || p), computed exactly,
is at least the noncentrality needed for power 0.99 at alpha = 1e-6 (tests/stats.py), so a later change
cannot quietly remove the test's teeth.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from spec_ref import SOLVERS, GeneratorSource, decoding_operator, exact_law
from spec_ref._sampling import residual
from spec_ref.solvers import Solver, SolverPlan
from tests.ref.mutants import NaiveResampleFromTarget, SpecInferNoResidualUpdate
from tests.stats import ALPHA, chi2_gof, config_seed, noncentrality, required_noncentrality

pytestmark = pytest.mark.statistical
N_RUNS = 2**16


# ----- mutants (test-only) -------------------------------------------------------------------------------
class NSSReturnsFirstDraft(type(SOLVERS["nss"])):  # type: ignore[misc]
    def _sample(self, plan: SolverPlan, tokens: tuple[int, ...], rng: Any) -> int:
        rng.uniform()
        return tokens[0]


class SpecTrWithoutDivisionFactor(type(SOLVERS["spectr"])):  # type: ignore[misc]
    """rho = 1 ("forgot the division factor"): TV 0.05-0.25 (docs/testing.md section 7)."""

    def _plan(self, target: Any, draft: Any, k: int) -> SolverPlan:
        capped = np.minimum(target, draft)
        beta = capped.sum()
        accept_all = 1 - (1 - beta) ** k
        gamma = accept_all / beta if beta > 0 else 1.0
        mass = np.maximum(target - gamma * capped, 0)
        law = mass / mass.sum() if mass.sum() > 0 else target
        return SolverPlan(self.name, target, draft, k, {"rho": 1.0, "beta": beta, "accept_all": accept_all, "residual": law})


class KhistiTestsAgainstDraftLaw(type(SOLVERS["khisti"])):  # type: ignore[misc]
    """Final single-draft test against q instead of the champion's law r_k (a 'wrong q' bug)."""

    def _sample(self, plan: SolverPlan, tokens: tuple[int, ...], rng: Any) -> int:
        champion = tokens[0]
        for pair, challenger in zip(plan.extras["rounds"], tokens[1:]):
            if not rng.bernoulli(pair.keep_first(champion, challenger)):
                champion = challenger
        p, q = plan.target_probs, plan.draft_probs
        if rng.uniform() * q[champion] < p[champion]:
            return champion
        return rng.categorical(residual(p, q))


MUTANTS: dict[str, Solver] = {
    "nss": NSSReturnsFirstDraft(),
    "naive": NaiveResampleFromTarget(),
    "spectr": SpecTrWithoutDivisionFactor(),
    "specinfer": SpecInferNoResidualUpdate(),
    "khisti": KhistiTestsAgainstDraftLaw(),
}


# ----- grid --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    solver: str
    vocab: int
    k: int
    temperature: float
    top_k: int | None
    top_p: float | None

    @property
    def name(self) -> str:
        return f"{self.solver}-V{self.vocab}-k{self.k}-T{self.temperature}-topk{self.top_k}-topp{self.top_p}"

    def distributions(self) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(config_seed(self.name))
        target_logits = rng.normal(0.0, 1.5, self.vocab)
        draft_logits = target_logits + rng.normal(0.0, 1.5, self.vocab)  # a correlated, imperfect draft
        return (
            decoding_operator(target_logits, self.temperature, self.top_k, self.top_p),
            decoding_operator(draft_logits, self.temperature, self.top_k, self.top_p),
        )


SETTINGS = [(1.0, None, None), (0.7, 5, None), (1.3, None, 0.9)]
GRID = [
    Config(solver, vocab, k, t, top_k, top_p)
    for solver in sorted(SOLVERS)
    for (t, top_k, top_p), (vocab, k) in zip(SETTINGS, [(8, 2), (16, 4), (16, 3)])
]


def run_many(solver: Solver, config: Config) -> tuple[np.ndarray, int]:
    """(output counts [V], number of runs whose output is one of its draws) over N_RUNS runs."""
    target, draft = config.distributions()
    plan = solver.plan(target, draft, config.k)
    generator = np.random.default_rng(config_seed(config.name))
    source = GeneratorSource(generator)
    draws = generator.choice(config.vocab, size=(N_RUNS, config.k), p=plan.draft_probs)
    counts = np.zeros(config.vocab)
    hits = 0
    for row in draws:
        tokens = tuple(int(t) for t in row)
        y = solver.sample_planned(plan, tokens, source)
        counts[y] += 1
        hits += y in tokens
    return counts, hits


def rejects(counts: np.ndarray, hits: int, target: np.ndarray, acceptance: float) -> bool:
    output = chi2_gof(counts, target, ALPHA)
    accept = chi2_gof([hits, N_RUNS - hits], [acceptance, 1 - acceptance], ALPHA)
    return output.rejected or accept.rejected


def exact_output_law(solver: Solver, config: Config) -> np.ndarray:
    target, draft = config.distributions()
    plan = solver.plan(target, draft, config.k)

    def run(rng: Any) -> int:
        tokens = tuple(rng.categorical(plan.draft_probs) for _ in range(config.k))
        return solver.sample_planned(plan, tokens, rng)

    law = exact_law(run)
    return np.array([float(law.get(y, 0)) for y in range(config.vocab)])


@pytest.mark.parametrize("config", GRID, ids=lambda c: c.name)
def test_generator_path_output_law_and_acceptance_rate_match_the_target(config: Config) -> None:
    solver = SOLVERS[config.solver]
    target, draft = config.distributions()
    counts, hits = run_many(solver, config)
    assert not chi2_gof(counts, target).support_violations
    assert not rejects(counts, hits, target, float(solver.acceptance(target, draft, config.k)))


@pytest.mark.parametrize("config", GRID, ids=lambda c: c.name)
def test_negative_control_mutant_is_rejected_with_certified_power(config: Config) -> None:
    mutant = MUTANTS[config.solver]
    target, draft = config.distributions()
    mutant_law = exact_output_law(mutant, config)
    lam, df = noncentrality(N_RUNS, mutant_law, target)
    acceptance = float(SOLVERS[config.solver].acceptance(target, draft, config.k))
    # the acceptance indicator alone can give the teeth (e.g. a mutant that keeps the marginal but not the rate)
    hit_rate = _exact_hit_rate(mutant, config)
    lam_acc, _ = noncentrality(N_RUNS, [hit_rate, 1 - hit_rate], [acceptance, 1 - acceptance])
    assert max(lam, lam_acc) >= required_noncentrality(df if lam >= lam_acc else 1), (
        f"the mutant is too close to the target for N={N_RUNS}: lambda={lam:.1f} (df={df}), {lam_acc:.1f} (rate)"
    )
    counts, hits = run_many(mutant, config)
    assert rejects(counts, hits, target, acceptance)


def _exact_hit_rate(solver: Solver, config: Config) -> float:
    target, draft = config.distributions()
    plan = solver.plan(target, draft, config.k)

    def run(rng: Any) -> bool:
        tokens = tuple(rng.categorical(plan.draft_probs) for _ in range(config.k))
        return solver.sample_planned(plan, tokens, rng) in tokens

    return float(exact_law(run).get(True, 0))
