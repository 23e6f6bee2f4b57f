"""The five token-level OTLP solvers of seed 002 (docs/papers.md) appendix B (NSS, Naive, SpecTr, SpecInfer, Khisti).

Each solver decides the next token Y at one tree node from the processed target distribution
``target_probs [V]`` (p), the distribution the drafts were really sampled from ``draft_probs [V]`` (q) and
the ordered i.i.d. draws ``draft_tokens`` (x_1..x_k, draw order, repeats allowed). Every solver is lossless:
``sum_x prod_i q(x_i) P(Y = y | x) = p(y)`` (Def. 3.2). Each exposes

* ``sample(target_probs, draft_probs, draft_tokens, rng) -> int``;
* ``branching(target_probs, draft_probs, draft_tokens) -> [V]``: the exact law of Y given the draws
  (seed 002 appendix D, with docs/algorithms.md corrections);
* ``acceptance(target_probs, draft_probs, k)``: ``P(Y in {x_i})`` with the draws random (appendix C);
* ``plan(target_probs, draft_probs, k)``: the deterministic per-node precomputation (SpecTr's rho*,
  SpecInfer's residual chain, Khisti's pair LPs) that ``sample_planned`` and ``branching_planned`` share,
  so the sampler and its branching law always describe the same algorithm.

With ``k = 0`` (a leaf) every solver returns ``Y ~ p`` (the bonus token).

Randomness budget of ``sample`` (one uniform per protocol call on the sampling sources, consumed in this
order; the routine stops early once it has its token):

============  =====================================================================================
solver        draws, in order
============  =====================================================================================
nss           ``categorical(p)``
naive         ``uniform()`` tests x_1 (``u*q(x_1) < p(x_1)``); ``categorical(Res(p, q))``
spectr        for j = 1..k: ``uniform()`` tests x_j (``u*(rho*q(x_j)) < p(x_j)``); ``categorical(R)``
specinfer     per round i = 0..k-1: ``integers(k-i)`` picks the draw (uniform order only), ``uniform()``
              tests it against ``P_i``; then ``categorical(P_k)``
khisti        for t = 2..k: ``bernoulli(KEEP1)`` (tournament round t); ``uniform()`` tests the champion
              (``u*r(c) < p(c)``); ``categorical(Res(p, r))``
============  =====================================================================================

Theorems: proofs/T01_otlp_solvers_lossless.md (losslessness, branching, acceptance of all five),
proofs/T02_spectr_rho_star.md (the rho* bracket).
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType
from typing import Any, Literal

import numpy as np

from spec_ref._sampling import accept, positive_part, residual
from spec_ref._validate import (
    Scalar,
    Vector,
    draft_count,
    draft_token_tuple,
    is_exact,
    one_hot_like,
    probability_pair,
    to_mode,
    zeros_like_mode,
)
from spec_ref.rng import RandomSource, as_source

__all__ = [
    "Solver",
    "SolverPlan",
    "NSSSolver",
    "NaiveSolver",
    "SpecTrSolver",
    "SpecInferSolver",
    "KhistiSolver",
    "KhistiRound",
    "SOLVERS",
    "rho_star",
    "accept_probability",
    "acceptance_by_enumeration",
]


def _one(reference: Vector) -> Any:
    return Fraction(1) if is_exact(reference) else 1.0


def accept_probability(draft_mass: Any, target_mass: Any) -> Any:
    """P(u * draft_mass < target_mass) for u ~ U[0, 1): ``min(1, target/draft)``, 1 if draft = 0 < target."""
    if not target_mass > 0:
        return target_mass * 0
    if not draft_mass > target_mass:
        # decided before dividing: a subnormal draft_mass made target/draft overflow to inf, then inf * 0 = NaN
        return target_mass * 0 + 1
    return target_mass / draft_mass


@dataclass(frozen=True, eq=False)
class SolverPlan:
    """Deterministic per-node data shared by ``sample_planned``, ``branching_planned`` and ``acceptance``.

    ``target_probs [V]`` and ``draft_probs [V]`` are validated (and renormalised); ``k`` is the number of
    draws the plan is for; ``extras`` holds the solver's own precomputation.
    """

    solver: str
    target_probs: Vector
    draft_probs: Vector
    k: int
    extras: Mapping[str, Any] = field(default_factory=dict)


class Solver(ABC):
    """A token-level OTLP solver. Public methods validate once; ``*_planned`` methods trust the plan."""

    name: str = ""

    # ----- public, validating entry points -------------------------------------------------------------
    def plan(self, target_probs: Any, draft_probs: Any, k: int) -> SolverPlan:
        """Validate (p, q) and precompute everything that depends only on (p, q, k)."""
        target, draft = probability_pair(target_probs, draft_probs)
        return self._plan(target, draft, draft_count(k))

    def sample(self, target_probs: Any, draft_probs: Any, draft_tokens: Sequence[int], rng: Any) -> int:
        """One output token for the draws ``draft_tokens`` (draw order). ``rng``: Generator or RandomSource."""
        target, draft = probability_pair(target_probs, draft_probs)
        tokens = draft_token_tuple(draft_tokens, draft)
        return self.sample_planned(self._plan(target, draft, len(tokens)), tokens, as_source(rng))

    def branching(self, target_probs: Any, draft_probs: Any, draft_tokens: Sequence[int]) -> Vector:
        """The exact law ``[V]`` of the output given the draws (seed 002 appendix D)."""
        target, draft = probability_pair(target_probs, draft_probs)
        tokens = draft_token_tuple(draft_tokens, draft)
        return self.branching_planned(self._plan(target, draft, len(tokens)), tokens)

    def acceptance(self, target_probs: Any, draft_probs: Any, k: int) -> Scalar:
        """``P(Y in {X_1..X_k})`` with ``X_i ~ q`` i.i.d. (seed 002 appendix C; exact where stated)."""
        target, draft = probability_pair(target_probs, draft_probs)
        return self._acceptance(self._plan(target, draft, draft_count(k)))

    # ----- planned (trusted) entry points ------------------------------------------------------------
    def sample_planned(self, plan: SolverPlan, draft_tokens: Sequence[int], rng: RandomSource) -> int:
        """``sample`` with a precomputed plan; ``len(draft_tokens)`` must equal ``plan.k``."""
        self._check_plan(plan, draft_tokens)
        if plan.k == 0:
            return rng.categorical(plan.target_probs)
        return self._sample(plan, tuple(int(t) for t in draft_tokens), rng)

    def branching_planned(self, plan: SolverPlan, draft_tokens: Sequence[int]) -> Vector:
        """``branching`` with a precomputed plan."""
        self._check_plan(plan, draft_tokens)
        if plan.k == 0:
            return plan.target_probs.copy()
        return self._branching(plan, tuple(int(t) for t in draft_tokens))

    def acceptance_planned(self, plan: SolverPlan) -> Scalar:
        """``acceptance`` with a precomputed plan (for ``plan.k`` draws)."""
        if plan.solver != self.name:
            raise ValueError(f"plan.solver={plan.solver!r} was made by another solver than {self.name!r}")
        return self._acceptance(plan)

    def _check_plan(self, plan: SolverPlan, draft_tokens: Sequence[int]) -> None:
        if plan.solver != self.name:
            raise ValueError(f"plan.solver={plan.solver!r} was made by another solver than {self.name!r}")
        if len(draft_tokens) != plan.k:
            raise ValueError(f"len(draft_tokens)={len(draft_tokens)} must equal plan.k={plan.k}")

    # ----- per-solver pieces -------------------------------------------------------------------------
    def _plan(self, target: Vector, draft: Vector, k: int) -> SolverPlan:
        return SolverPlan(self.name, target, draft, k)

    @abstractmethod
    def _sample(self, plan: SolverPlan, tokens: tuple[int, ...], rng: RandomSource) -> int: ...

    @abstractmethod
    def _branching(self, plan: SolverPlan, tokens: tuple[int, ...]) -> Vector: ...

    @abstractmethod
    def _acceptance(self, plan: SolverPlan) -> Scalar: ...

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def acceptance_by_enumeration(solver: Solver, plan: SolverPlan, max_tuples: int = 200_000) -> Scalar:
    """``P(Y in {X_i})`` by summing ``branching`` over every ordered draft tuple (V^k of them).

    Exact in exact mode. This is the generic oracle the closed forms of appendix C are tested against,
    and the exact acceptance rate of Khisti (which has no closed form).
    """
    vocab = plan.target_probs.shape[0]
    if vocab**plan.k > max_tuples:
        raise ValueError(
            f"acceptance by enumeration needs V**k={vocab}**{plan.k} > max_tuples={max_tuples} draft tuples"
        )
    draft = plan.draft_probs
    total: Any = draft[0] * 0
    support = [t for t in range(vocab) if draft[t] > 0]
    for tokens in itertools.product(support, repeat=plan.k):
        weight: Any = _one(draft)
        for t in tokens:
            weight = weight * draft[t]
        law = solver.branching_planned(plan, tokens)
        total = total + weight * sum((law[t] for t in set(tokens)), law[0] * 0)
    return total  # type: ignore[no-any-return]


# ========================================================================================================
# 3.1 NSS
# ========================================================================================================
class NSSSolver(Solver):
    """Naive *stochastic* sampling (docs/algorithms.md section 3.1): ignore the drafts, ``Y ~ p``."""

    name = "nss"

    def _sample(self, plan: SolverPlan, tokens: tuple[int, ...], rng: RandomSource) -> int:
        return rng.categorical(plan.target_probs)

    def _branching(self, plan: SolverPlan, tokens: tuple[int, ...]) -> Vector:
        return plan.target_probs.copy()

    def _acceptance(self, plan: SolverPlan) -> Scalar:
        p, q = plan.target_probs, plan.draft_probs
        one = _one(p)
        return (p * (one - (one - q) ** plan.k)).sum()  # type: ignore[no-any-return]


# ========================================================================================================
# 3.2 Naive (Leviathan/Chen rule on the first draw)
# ========================================================================================================
class NaiveSolver(Solver):
    """Naive OTLP / NaiveTree (docs/algorithms.md section 3.2): test x_1 only; on rejection ``Y ~ Res(p, q)``."""

    name = "naive"

    def _sample(self, plan: SolverPlan, tokens: tuple[int, ...], rng: RandomSource) -> int:
        p, q = plan.target_probs, plan.draft_probs
        first = tokens[0]
        if accept(rng.uniform(), q[first], p[first]):
            return first
        return rng.categorical(residual(p, q))

    def _branching(self, plan: SolverPlan, tokens: tuple[int, ...]) -> Vector:
        p, q = plan.target_probs, plan.draft_probs
        a = accept_probability(q[tokens[0]], p[tokens[0]])
        return a * one_hot_like(p, tokens[0]) + (1 - a) * residual(p, q)  # type: ignore[no-any-return]

    def _acceptance(self, plan: SolverPlan) -> Scalar:
        p, q, k = plan.target_probs, plan.draft_probs, plan.k
        if k == 0:
            return p[0] * 0  # type: ignore[no-any-return]
        one = _one(p)
        # Alg 7 is correct (docs/algorithms.md section 3.2): a rejected x_1 has Res(x_1) = 0, and draws 2..k are independent.
        return np.minimum(p, q).sum() + (positive_part(p - q) * (one - (one - q) ** (k - 1))).sum()  # type: ignore[no-any-return]


# ========================================================================================================
# 3.3 SpecTr K-SEQ
# ========================================================================================================
def rho_star(target_probs: Vector, draft_probs: Vector, k: int, iterations: int = 64) -> Scalar:
    """SpecTr's division factor: the FEASIBLE (upper) end of a bisection for f(rho) = 0 on [1, k].

    f(rho) = 1 - (1 - beta(rho))^k - rho*beta(rho) with beta(rho) = sum min(p/rho, q) is non-increasing,
    f(1) >= 0 >= f(k); rho is feasible iff f(rho) <= 0. Returning ``hi`` keeps every SpecTr residual
    non-negative. The seed's "solve by binary search" leaves the bracket open; the lower bracket is lossy
    (docs/algorithms.md section 3.3 and 7; proofs/T02_spectr_rho_star.md). Exact in exact mode (dyadic midpoints).
    """
    one = _one(target_probs)
    if k <= 1:
        return one  # type: ignore[no-any-return]
    lo, hi = one, one * k
    for _ in range(iterations):
        mid = (lo + hi) / 2
        beta = np.minimum(target_probs / mid, draft_probs).sum()
        if one - (one - beta) ** k <= mid * beta:
            hi = mid
        else:
            lo = mid
    return hi  # type: ignore[no-any-return]


class SpecTrSolver(Solver):
    """SpecTr K-SEQ (docs/algorithms.md section 3.3) with rho = :func:`rho_star` (upper bracket)."""

    name = "spectr"

    def __init__(self, iterations: int = 64) -> None:
        self.iterations = iterations

    def _plan(self, target: Vector, draft: Vector, k: int) -> SolverPlan:
        rho = rho_star(target, draft, k, self.iterations)
        capped = np.minimum(target / rho, draft)
        beta = capped.sum()
        one = _one(target)
        accept_all = one - (one - beta) ** k
        # beta = 0 (disjoint supports): min(p/rho, q) = 0, so gamma is irrelevant; avoid 0/0.
        gamma = accept_all / beta if beta > 0 else rho
        raw_residual = target - gamma * capped
        mass = positive_part(raw_residual)  # the clip only absorbs rounding when rho is feasible
        total = mass.sum()
        residual_law = mass / total if total > 0 else target / target.sum()
        return SolverPlan(
            self.name,
            target,
            draft,
            k,
            {"rho": rho, "beta": beta, "accept_all": accept_all, "residual": residual_law, "raw_residual": raw_residual},
        )

    def _sample(self, plan: SolverPlan, tokens: tuple[int, ...], rng: RandomSource) -> int:
        p, q, rho = plan.target_probs, plan.draft_probs, plan.extras["rho"]
        for token in tokens:  # every draw, duplicates included, each with a fresh uniform
            if accept(rng.uniform(), rho * q[token], p[token]):
                return token
        return rng.categorical(plan.extras["residual"])

    def _branching(self, plan: SolverPlan, tokens: tuple[int, ...]) -> Vector:
        p, q, rho = plan.target_probs, plan.draft_probs, plan.extras["rho"]
        law = zeros_like_mode(p)
        survive: Any = _one(p)
        for token in tokens:
            a = accept_probability(rho * q[token], p[token])
            law[token] = law[token] + survive * a
            survive = survive * (1 - a)
        return law + survive * plan.extras["residual"]  # type: ignore[no-any-return]

    def _acceptance(self, plan: SolverPlan) -> Scalar:
        p, q, k = plan.target_probs, plan.draft_probs, plan.k
        if k == 0:
            return p[0] * 0  # type: ignore[no-any-return]
        one = _one(p)
        beta, accept_all, rho = plan.extras["beta"], plan.extras["accept_all"], plan.extras["rho"]
        if beta >= 1:
            return one  # type: ignore[no-any-return]
        # Alg 8 (correct): after k rejections each draw has law r = (q - p/rho)_+ / (1 - beta).
        rejected_law = positive_part(q - p / rho) / (one - beta)
        hit = (plan.extras["residual"] * (one - (one - rejected_law) ** k)).sum()
        return accept_all + (one - accept_all) * hit  # type: ignore[no-any-return]


# ========================================================================================================
# 3.4 SpecInfer (recursive rejection sampling with replacement)
# ========================================================================================================
class SpecInferSolver(Solver):
    """SpecInfer RRS with replacement (docs/algorithms.md section 3.4). ``order='uniform'`` (seed Alg 4) or ``'draw'``."""

    name = "specinfer"

    def __init__(self, order: Literal["uniform", "draw"] = "uniform") -> None:
        if order not in ("uniform", "draw"):
            raise ValueError(f"order must be 'uniform' or 'draw', got order={order!r}")
        self.order = order

    def __repr__(self) -> str:
        return f"SpecInferSolver(order={self.order!r})"

    def _plan(self, target: Vector, draft: Vector, k: int) -> SolverPlan:
        chain = [target]  # P_0 = p, P_{i+1} = Res(P_i, q); q never changes
        for _ in range(k):
            chain.append(residual(chain[-1], draft))
        return SolverPlan(self.name, target, draft, k, {"chain": tuple(chain)})

    def _sample(self, plan: SolverPlan, tokens: tuple[int, ...], rng: RandomSource) -> int:
        q, chain = plan.draft_probs, plan.extras["chain"]
        remaining = list(tokens)
        for rejections in range(plan.k):
            j = rng.integers(len(remaining)) if self.order == "uniform" else 0
            token = remaining[j]
            if accept(rng.uniform(), q[token], chain[rejections][token]):
                return token
            del remaining[j]
        return rng.categorical(chain[plan.k])

    def _branching(self, plan: SolverPlan, tokens: tuple[int, ...]) -> Vector:
        # Corrected Alg 14 (docs/algorithms.md section 3.4): the round after i rejections accepts t with
        # a_i(t) = min(1, P_i(t)/q(t)). The seed indexes P_{i-1} here (off by one).
        q, chain = plan.draft_probs, plan.extras["chain"]
        memo: dict[tuple[int, tuple[int, ...]], Vector] = {}

        def law_after(rejections: int, remaining: tuple[int, ...]) -> Vector:
            if not remaining:
                return chain[rejections]  # type: ignore[no-any-return]
            key = (rejections, tuple(sorted(remaining)) if self.order == "uniform" else remaining)
            if key in memo:
                return memo[key]
            positions = range(len(remaining)) if self.order == "uniform" else range(1)
            total: Vector = zeros_like_mode(q)
            for j in positions:
                token = remaining[j]
                a = accept_probability(q[token], chain[rejections][token])
                rest = remaining[:j] + remaining[j + 1:]
                total = total + a * one_hot_like(q, token) + (1 - a) * law_after(rejections + 1, rest)
            result = total / len(positions)
            memo[key] = result
            return result

        return law_after(0, tokens)

    def _acceptance(self, plan: SolverPlan) -> Scalar:
        q, chain = plan.draft_probs, plan.extras["chain"]
        one = _one(q)
        miss: Any = one
        for i in range(plan.k):  # Alg 9's residual term is identically 0 (docs/algorithms.md section 3.4)
            miss = miss * (one - np.minimum(chain[i], q).sum())
        return one - miss  # type: ignore[no-any-return]


# ========================================================================================================
# 3.5 Khisti (pairwise truncated LP + tournament)
# ========================================================================================================
@dataclass(frozen=True, eq=False)
class KhistiRound:
    """One tournament round: champion law ``q1`` against challenger law ``q2``.

    ``rank[y]`` is token y's rank (key ``p - q1*q2`` descending, ties by smaller id); ``keep [s, s]`` holds
    w[i, j] = P(select the token of smaller rank | X1 has rank i, X2 has rank j), or is ``None`` for the
    LP-failure fallback "always keep X1" (docs/algorithms.md section 3.5). ``law [V]`` is the exact winner law r_t.
    """

    rank: tuple[int, ...]
    truncation: int
    keep: Vector | None
    law: Vector

    def keep_first(self, first: int, second: int) -> Any:
        """KEEP1: the probability that the champion ``first`` survives against ``second``."""
        one = _one(self.law)
        if first == second or self.keep is None:
            return one
        a, b = self.rank[first], self.rank[second]
        if a < self.truncation and b < self.truncation:
            return self.keep[a, b] if a < b else one - self.keep[a, b]
        return one if a < b else one * 0


def _khisti_induced_law(
    q1: Vector, q2: Vector, order: list[int], rank: list[int], s: int, keep: Vector
) -> Vector:
    """The exact winner law r of one pair round given w (``keep``), in the mode of q1 (docs/algorithms.md section 3.5)."""
    vocab = q1.shape[0]
    law = zeros_like_mode(q1)
    tail1 = zeros_like_mode(q1)  # mass of ranks strictly below (larger rank than) y
    tail2 = zeros_like_mode(q1)
    running1: Any = q1[0] * 0
    running2: Any = q1[0] * 0
    for position in range(vocab - 1, -1, -1):
        y = order[position]
        tail1[y], tail2[y] = running1, running2
        running1 = running1 + q1[y]
        running2 = running2 + q2[y]
    outside1 = sum((q1[order[i]] for i in range(s, vocab)), q1[0] * 0)
    outside2 = sum((q2[order[i]] for i in range(s, vocab)), q1[0] * 0)
    for position in range(s, vocab):  # Omega_2: the smaller rank always wins
        y = order[position]
        law[y] = q1[y] * q2[y] + q1[y] * tail2[y] + tail1[y] * q2[y]
    for i in range(s):
        y = order[i]
        value = q1[y] * q2[y] + q1[y] * outside2 + outside1 * q2[y]
        for j in range(s):
            if j == i:
                continue
            z = order[j]
            if j < i:
                value = value + q1[y] * q2[z] * (1 - keep[i, j]) + q1[z] * q2[y] * (1 - keep[j, i])
            else:
                value = value + q1[y] * q2[z] * keep[i, j] + q1[z] * q2[y] * keep[j, i]
        law[y] = value
    return law


def _khisti_pair_round(target: Vector, q1: Vector, q2: Vector, truncation: int) -> KhistiRound:
    """KHISTI_PAIR_LP of docs/algorithms.md section 3.5: maximise sum_{Omega_1} min(p, r) over w with HiGHS."""
    vocab = target.shape[0]
    s = min(truncation, vocab)
    key = target - q1 * q2
    order = sorted(range(vocab), key=lambda y: (-key[y], y))
    rank = [0] * vocab
    for position, y in enumerate(order):
        rank[y] = position
    p_f, q1_f, q2_f = (np.asarray([float(v) for v in a], dtype=np.float64) for a in (target, q1, q2))
    pairs = [(i, j) for i in range(s) for j in range(s) if i != j]
    index = {pair: n for n, pair in enumerate(pairs)}
    n_w = len(pairs)
    # r(y_i) = const_i + sum coef * w: build the coefficients from the float-mode induced law.
    const = np.zeros(s)
    coef = np.zeros((s, n_w))
    outside1 = float(sum(q1_f[order[i]] for i in range(s, vocab)))
    outside2 = float(sum(q2_f[order[i]] for i in range(s, vocab)))
    for i in range(s):
        y = order[i]
        const[i] = q1_f[y] * q2_f[y] + q1_f[y] * outside2 + outside1 * q2_f[y]
        for j in range(s):
            if j == i:
                continue
            z = order[j]
            a, b = q1_f[y] * q2_f[z], q1_f[z] * q2_f[y]
            if j < i:
                const[i] += a + b
                coef[i, index[(i, j)]] -= a
                coef[i, index[(j, i)]] -= b
            else:
                coef[i, index[(i, j)]] += a
                coef[i, index[(j, i)]] += b
    # variables: [w (n_w), z (s)]; maximise sum z  <=>  minimise -sum z
    cost = np.concatenate([np.zeros(n_w), -np.ones(s)])
    a_ub = np.concatenate([-coef, np.eye(s)], axis=1)  # z_i - coef_i . w <= const_i
    bounds = [(0.0, 1.0)] * n_w + [(0.0, float(min(1.0, p_f[order[i]]))) for i in range(s)]
    from scipy.optimize import linprog  # imported here: scipy.optimize costs ~0.6 s, the decode path never needs it

    result = linprog(cost, A_ub=a_ub, b_ub=const, bounds=bounds, method="highs")
    if result.status != 0 or result.x is None:
        # Consistent LP-failure fallback (docs/algorithms.md section 3.5): always keep X1, so r = q1 exactly.
        # (The seed authors' w = 0.5 fallback is inconsistent with its own induced law.)
        return KhistiRound(tuple(rank), s, None, q1.copy())
    w_float = np.zeros((s, s))
    for (i, j), n in index.items():
        w_float[i, j] = min(1.0, max(0.0, float(result.x[n])))
    keep = to_mode(w_float, is_exact(q1), "khisti keep")
    law = _khisti_induced_law(q1, q2, order, rank, s, keep)
    if not is_exact(law):
        law = np.maximum(law, 0.0)
        law = law / law.sum()
    return KhistiRound(tuple(rank), s, keep, law)


class KhistiSolver(Solver):
    """Khisti et al.: pairwise truncated-LP importance selection + single-draft SpS (docs/algorithms.md section 3.5).

    ``truncation`` is the LP's alphabet truncation s (the seed authors' implementation uses 5). The
    champion after round t has the exact law ``rounds[t].law``; the final test is single-draft
    speculative sampling of the champion against that law.
    """

    name = "khisti"

    def __init__(self, truncation: int = 5) -> None:
        if isinstance(truncation, bool) or not isinstance(truncation, int) or truncation < 1:
            raise ValueError(f"truncation must be an integer >= 1, got truncation={truncation!r}")
        self.truncation = truncation

    def __repr__(self) -> str:
        return f"KhistiSolver(truncation={self.truncation})"

    #: The most draws one node may have: Khisti solves one pair LP per draw after the first.
    MAX_DRAWS = 256

    def _plan(self, target: Vector, draft: Vector, k: int) -> SolverPlan:
        if k > self.MAX_DRAWS:
            raise ValueError(
                f"k={k} draws need {k - 1} pair LPs; KhistiSolver accepts at most k={self.MAX_DRAWS} per node"
            )
        rounds: list[KhistiRound] = []
        champion_law = draft
        for _ in range(2, k + 1):  # rounds depend on (p, q, k) only: computed once per node
            pair = _khisti_pair_round(target, champion_law, draft, self.truncation)
            rounds.append(pair)
            champion_law = pair.law
        return SolverPlan(
            self.name, target, draft, k, {"rounds": tuple(rounds), "champion_law": champion_law}
        )

    def _sample(self, plan: SolverPlan, tokens: tuple[int, ...], rng: RandomSource) -> int:
        champion = tokens[0]
        for pair, challenger in zip(plan.extras["rounds"], tokens[1:]):
            if not rng.bernoulli(pair.keep_first(champion, challenger)):
                champion = challenger
        law = plan.extras["champion_law"]
        p = plan.target_probs
        if accept(rng.uniform(), law[champion], p[champion]):
            return champion
        return rng.categorical(residual(p, law))

    def champion_distribution(self, plan: SolverPlan, tokens: tuple[int, ...]) -> dict[int, Any]:
        """pi_k: the law of the tournament's champion given the draws (the DP of Alg 15)."""
        pi: dict[int, Any] = {tokens[0]: _one(plan.target_probs)}
        for pair, challenger in zip(plan.extras["rounds"], tokens[1:]):
            nxt: dict[int, Any] = {}
            for champion, mass in pi.items():
                keep = pair.keep_first(champion, challenger)
                nxt[champion] = nxt.get(champion, mass * 0) + mass * keep
                nxt[challenger] = nxt.get(challenger, mass * 0) + mass * (1 - keep)
            pi = nxt
        return pi

    def _branching(self, plan: SolverPlan, tokens: tuple[int, ...]) -> Vector:
        p, law = plan.target_probs, plan.extras["champion_law"]
        out = zeros_like_mode(p)
        accepted: Any = p[0] * 0
        for champion, mass in self.champion_distribution(plan, tokens).items():
            a = accept_probability(law[champion], p[champion])
            out[champion] = out[champion] + mass * a
            accepted = accepted + mass * a
        return out + (1 - accepted) * residual(p, law)  # type: ignore[no-any-return]

    def _acceptance(self, plan: SolverPlan) -> Scalar:
        """The exact acceptance rate, by enumerating the V^k ordered draft tuples (no closed form)."""
        if plan.k == 0:
            return plan.target_probs[0] * 0  # type: ignore[no-any-return]
        return acceptance_by_enumeration(self, plan)

    def acceptance_lower_bound(self, target_probs: Any, draft_probs: Any, k: int) -> Scalar:
        """seed 002 Alg 10: ``sum min(p, r_k)`` = P(Y = champion) <= the exact acceptance rate."""
        target, draft = probability_pair(target_probs, draft_probs)
        plan = self._plan(target, draft, draft_count(k))
        if plan.k == 0:
            return target[0] * 0  # type: ignore[no-any-return]
        return np.minimum(target, plan.extras["champion_law"]).sum()  # type: ignore[no-any-return]


#: The five solvers under their registry names (seed 002 appendix B).
SOLVERS: Mapping[str, Solver] = MappingProxyType(
    {
        "nss": NSSSolver(),
        "naive": NaiveSolver(),
        "spectr": SpecTrSolver(),
        "specinfer": SpecInferSolver("uniform"),
        "khisti": KhistiSolver(),
    }
)

