"""Exact checking helpers for the theorem runner ``proofs/test_proofs.py``.

Everything here is exact: probabilities are :class:`fractions.Fraction`, laws are computed with
:func:`spec_ref.exact_law` over every random branch of the code under test, and comparisons use ``==``.

Three kinds of object live here:

* the enumerated small cases every theorem is re-checked on (:data:`CASES`);
* the *formulas stated in the theorem files*, written out independently of ``spec_ref`` so that the runner
  compares the code with the statement, not the code with itself;
* the theorem-file parser used by the structural checks (sections, cited code, cited tests).

Negative controls (mutants) are defined in ``proofs/test_proofs.py`` next to the checks that must reject
them, never as product flags.
"""

from __future__ import annotations

import importlib
import itertools
import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from tests.tables import Table as Table
from tests.tables import model, random_table
from spec_ref import exact_law
from spec_ref.solvers import Solver, SolverPlan

F = Fraction
ROOT = Path(__file__).resolve().parent.parent
PROOFS = ROOT / "proofs"

Law = dict[Hashable, Fraction]


# ==========================================================================================================
# Enumerated small cases
# ==========================================================================================================
@dataclass(frozen=True)
class Case:
    """A (target, draft) pair of exact distributions: ``target_probs [V]``, ``draft_probs [V]``."""

    name: str
    target_probs: tuple[Fraction, ...]
    draft_probs: tuple[Fraction, ...]

    @property
    def vocab(self) -> int:
        return len(self.target_probs)


def _case(name: str, target: Sequence[Any], draft: Sequence[Any]) -> Case:
    return Case(name, tuple(F(v) for v in target), tuple(F(v) for v in draft))


#: The token-level cases of T01/T02/T08: generic, nested and disjoint supports, p = q, one-hot target,
#: one-hot draft, and a V = 4 case where every ordering matters.
CASES: tuple[Case, ...] = (
    _case("generic V=3", [F(1, 2), F(1, 3), F(1, 6)], [F(1, 6), F(1, 2), F(1, 3)]),
    _case("generic V=4", [F(1, 10), F(2, 5), F(3, 10), F(1, 5)], [F(2, 5), F(1, 10), F(1, 4), F(1, 4)]),
    _case("draft mass outside the target support", [F(1, 2), F(1, 2), 0], [F(1, 10), F(3, 10), F(3, 5)]),
    _case("disjoint supports", [F(1, 2), F(1, 2), 0], [0, 0, 1]),
    _case("target equals draft", [F(1, 5), F(3, 10), F(1, 2)], [F(1, 5), F(3, 10), F(1, 2)]),
    _case("one-hot target", [0, 1, 0], [F(1, 3), F(1, 3), F(1, 3)]),
    _case("one-hot draft", [F(1, 4), F(1, 4), F(1, 2)], [0, 0, 1]),
    _case("skewed V=4", [F(7, 10), F(1, 10), F(1, 10), F(1, 10)], [F(1, 20), F(3, 20), F(3, 10), F(1, 2)]),
)


def vector_law(values: Sequence[Any]) -> Law:
    """The law ``{token: mass}`` of a probability vector, dropping zero entries, as Fractions."""
    return {i: F(v) for i, v in enumerate(values) if F(v) != 0}


def marginal_law(solver: Solver, plan: SolverPlan) -> Law:
    """Exact law of the solver's output with the ``plan.k`` draws sampled i.i.d. from ``plan.draft_probs``."""

    def run(rng: Any) -> int:
        draws = tuple(rng.categorical(plan.draft_probs) for _ in range(plan.k))
        return solver.sample_planned(plan, draws, rng)

    return exact_law(run)


def joint_law(solver: Solver, plan: SolverPlan) -> Law:
    """Exact law of ``(draws, output)``."""

    def run(rng: Any) -> tuple[tuple[int, ...], int]:
        draws = tuple(rng.categorical(plan.draft_probs) for _ in range(plan.k))
        return draws, solver.sample_planned(plan, draws, rng)

    return exact_law(run)


def conditional_law(solver: Solver, plan: SolverPlan, draws: Sequence[int]) -> Law:
    """Exact law of the output given the draws ``draws`` (draw order)."""
    return exact_law(lambda rng: solver.sample_planned(plan, tuple(draws), rng))


def acceptance_from_joint(joint: Mapping[Hashable, Fraction]) -> Fraction:
    """``P(Y in {X_1..X_k})`` read off an exact joint law of ``(draws, output)``."""
    total = F(0)
    for key, mass in joint.items():
        pair: tuple[tuple[int, ...], int] = key  # type: ignore[assignment]
        draws, output = pair
        if output in draws:
            total += mass
    return total


def draft_tuples(case_draft: Sequence[Fraction], k: int) -> list[tuple[int, ...]]:
    """Every ordered k-tuple of tokens with positive draft probability."""
    support = [t for t, v in enumerate(case_draft) if v > 0]
    return list(itertools.product(support, repeat=k))


# ==========================================================================================================
# The formulas stated in the theorem files (independent of spec_ref's own implementation)
# ==========================================================================================================
def pos(values: Sequence[Fraction]) -> list[Fraction]:
    return [v if v > 0 else F(0) for v in values]


def res(a: Sequence[Fraction], b: Sequence[Fraction]) -> list[Fraction]:
    """``Res(a, b)`` of docs/algorithms.md section 1 with the fallback to ``a`` (a sums to 1)."""
    mass = pos([x - y for x, y in zip(a, b)])
    total = sum(mass, F(0))
    return [m / total for m in mass] if total > 0 else list(a)


def acc(draft_mass: Fraction, target_mass: Fraction) -> Fraction:
    """``min(1, target/draft)``, the probability of ``u * draft_mass < target_mass``."""
    if target_mass <= 0:
        return F(0)
    if draft_mass <= 0:
        return F(1)
    return min(F(1), target_mass / draft_mass)


def as_vector(law: Mapping[Hashable, Fraction], vocab: int) -> list[Fraction]:
    return [law.get(t, F(0)) for t in range(vocab)]


def naive_branching(p: Sequence[Fraction], q: Sequence[Fraction], draws: Sequence[int]) -> list[Fraction]:
    """T01 (Naive): ``a e_{x1} + (1 - a) Res(p, q)``, ``a = min(1, p(x1)/q(x1))``."""
    a = acc(q[draws[0]], p[draws[0]])
    r = res(p, q)
    return [a * (t == draws[0]) + (1 - a) * r[t] for t in range(len(p))]


def spectr_branching(p: Sequence[Fraction], q: Sequence[Fraction], draws: Sequence[int], rho: Fraction) -> list[Fraction]:
    """T01 (SpecTr): ``sum_j [x_j=y] a_j prod_{l<j}(1-a_l) + prod_l (1-a_l) R_hat(y)`` with ``R = (p - gamma min(p/rho, q))_+``."""
    k = len(draws)
    capped = [min(pt / rho, qt) for pt, qt in zip(p, q)]
    beta = sum(capped, F(0))
    accept_all = 1 - (1 - beta) ** k
    gamma = accept_all / beta if beta > 0 else rho
    raw = pos([pt - gamma * c for pt, c in zip(p, capped)])
    total = sum(raw, F(0))
    r_hat = [v / total for v in raw] if total > 0 else list(p)
    out = [F(0)] * len(p)
    survive = F(1)
    for x in draws:
        a = acc(rho * q[x], p[x])
        out[x] += survive * a
        survive *= 1 - a
    return [o + survive * r for o, r in zip(out, r_hat)]


def specinfer_chain(p: Sequence[Fraction], q: Sequence[Fraction], k: int) -> list[list[Fraction]]:
    chain = [list(p)]
    for _ in range(k):
        chain.append(res(chain[-1], q))
    return chain


def specinfer_branching(
    p: Sequence[Fraction], q: Sequence[Fraction], draws: Sequence[int], shift: int = 0, order: str = "uniform"
) -> list[Fraction]:
    """T01 (SpecInfer, corrected Alg 14): ``B_i(S)`` with ``a_i(t) = min(1, P_i(t)/q(t))``.

    ``shift = 1`` is the seed's literal Alg 14 (``a_i`` built from ``P_{i-1}``, with ``P_{-1} := P_0``); it
    is a negative control, not a product option.
    """
    k = len(draws)
    chain = specinfer_chain(p, q, k)

    def a(i: int, t: int) -> Fraction:
        return acc(q[t], chain[max(i - shift, 0)][t])

    def b(i: int, remaining: tuple[int, ...]) -> list[Fraction]:
        if not remaining:
            return chain[i]
        picks = range(len(remaining)) if order == "uniform" else range(1)
        out = [F(0)] * len(p)
        for j in picks:
            t = remaining[j]
            rest = b(i + 1, remaining[:j] + remaining[j + 1:])
            out = [o + a(i, t) * (y == t) + (1 - a(i, t)) * r for y, (o, r) in enumerate(zip(out, rest))]
        return [o / len(picks) for o in out]

    return b(0, tuple(draws))


def nss_acceptance(p: Sequence[Fraction], q: Sequence[Fraction], k: int) -> Fraction:
    """Alg 6: ``sum_y p(y)(1 - (1 - q(y))^k)``."""
    return sum((pt * (1 - (1 - qt) ** k) for pt, qt in zip(p, q)), F(0))


def naive_acceptance(p: Sequence[Fraction], q: Sequence[Fraction], k: int) -> Fraction:
    """Alg 7: ``sum min(p, q) + sum (p - q)_+ (1 - (1 - q)^(k-1))``."""
    if k == 0:
        return F(0)
    return sum((min(pt, qt) + max(pt - qt, F(0)) * (1 - (1 - qt) ** (k - 1)) for pt, qt in zip(p, q)), F(0))


def spectr_acceptance(p: Sequence[Fraction], q: Sequence[Fraction], k: int, rho: Fraction) -> Fraction:
    """Alg 8 at division factor ``rho``: ``A + (1 - A) sum R_hat (1 - (1 - r)^k)``, 1 if beta = 1."""
    if k == 0:
        return F(0)
    capped = [min(pt / rho, qt) for pt, qt in zip(p, q)]
    beta = sum(capped, F(0))
    if beta >= 1:
        return F(1)
    accept_all = 1 - (1 - beta) ** k
    gamma = accept_all / beta if beta > 0 else rho
    raw = pos([pt - gamma * c for pt, c in zip(p, capped)])
    total = sum(raw, F(0))
    r_hat = [v / total for v in raw] if total > 0 else list(p)
    rejected = [max(qt - pt / rho, F(0)) / (1 - beta) for pt, qt in zip(p, q)]
    return accept_all + (1 - accept_all) * sum((rh * (1 - (1 - r) ** k) for rh, r in zip(r_hat, rejected)), F(0))


def specinfer_acceptance(p: Sequence[Fraction], q: Sequence[Fraction], k: int) -> Fraction:
    """T01: ``1 - prod_{i<k} (1 - sum min(P_i, q))`` (Alg 9 without its vanishing residual term)."""
    chain = specinfer_chain(p, q, k)
    miss = F(1)
    for i in range(k):
        miss *= 1 - sum((min(a, b) for a, b in zip(chain[i], q)), F(0))
    return 1 - miss


def specinfer_alg9_literal(p: Sequence[Fraction], q: Sequence[Fraction], k: int) -> tuple[Fraction, Fraction]:
    """The seed's Alg 9 verbatim: returns ``(alpha, residual_term)``; T01 proves ``residual_term == 0``."""
    current = list(p)
    p_rej = F(1)
    m = [F(1)] * len(p)
    for _ in range(k):
        r = sum((min(a, b) for a, b in zip(current, q)), F(0))
        p_rej *= 1 - r
        if r < 1:  # the guard of docs/algorithms.md section 3.4: r = 1 means P_i = q, nothing is ever rejected
            m = [mt * (1 - max(qt - pt, F(0)) / (1 - r)) for mt, qt, pt in zip(m, q, current)]
        current = res(current, q)
    residual_term = p_rej * sum((pt * (1 - mt) for pt, mt in zip(current, m)), F(0))
    return (1 - p_rej) + residual_term, residual_term


# ==========================================================================================================
# SpecTr's f(rho) (T02)
# ==========================================================================================================
def spectr_beta(p: Sequence[Fraction], q: Sequence[Fraction], rho: Fraction) -> Fraction:
    return sum((min(pt / rho, qt) for pt, qt in zip(p, q)), F(0))


def spectr_f(p: Sequence[Fraction], q: Sequence[Fraction], k: int, rho: Fraction) -> Fraction:
    """``f(rho) = 1 - (1 - beta)^k - rho beta``; rho is feasible iff ``f(rho) <= 0``."""
    beta = spectr_beta(p, q, rho)
    return 1 - (1 - beta) ** k - rho * beta


def spectr_raw_residual(p: Sequence[Fraction], q: Sequence[Fraction], k: int, rho: Fraction) -> list[Fraction]:
    """The pre-clip residual ``R_rho = p - gamma min(p/rho, q)`` with ``gamma = A/beta`` (``rho`` if beta = 0)."""
    capped = [min(pt / rho, qt) for pt, qt in zip(p, q)]
    beta = sum(capped, F(0))
    gamma = (1 - (1 - beta) ** k) / beta if beta > 0 else rho
    return [pt - gamma * c for pt, c in zip(p, capped)]


def bisection_brackets(p: Sequence[Fraction], q: Sequence[Fraction], k: int, iterations: int) -> tuple[Fraction, Fraction]:
    """The bracket ``(lo, hi)`` of RHO_STAR (docs/algorithms.md section 3.3) after ``iterations`` steps, exactly."""
    lo, hi = F(1), F(k)
    for _ in range(iterations):
        mid = (lo + hi) / 2
        if spectr_f(p, q, k, mid) <= 0:
            hi = mid
        else:
            lo = mid
    return lo, hi


def rho_grid(p: Sequence[Fraction], q: Sequence[Fraction], k: int, steps: int = 24) -> list[Fraction]:
    """Rational points of [1, k]: a uniform grid plus every breakpoint p(y)/q(y) of beta inside."""
    points = {F(1) + F(k - 1) * F(i, steps) for i in range(steps + 1)}
    points |= {pt / qt for pt, qt in zip(p, q) if qt > 0 and pt > 0 and 1 <= pt / qt <= k}
    return sorted(points)


# ==========================================================================================================
# Theorem files: sections, cited code, cited tests
# ==========================================================================================================
REQUIRED_SECTIONS = ("## Statement", "## Proof", "## Code", "## Tests")
_CODE_NAME = re.compile(r"`(spec_ref(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?:\(\))?`")
_TEST_REF = re.compile(r"`((?:tests|proofs)/[A-Za-z0-9_/]+\.py)::([A-Za-z_][A-Za-z0-9_]*)`")


def theorem_files() -> list[Path]:
    return sorted(PROOFS.glob("T[0-9][0-9]_*.md"))


def section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section (up to the next ``## `` heading)."""
    start = text.index(heading)
    rest = text[start + len(heading):]
    match = re.search(r"^## ", rest, flags=re.MULTILINE)
    return rest[: match.start()] if match else rest


def cited_code(text: str) -> list[str]:
    return sorted(set(_CODE_NAME.findall(section(text, "## Code"))))


def cited_tests(text: str) -> list[tuple[str, str]]:
    return sorted(set(_TEST_REF.findall(section(text, "## Tests"))))


def resolve(dotted: str) -> Any:
    """Import the longest module prefix of ``dotted`` and ``getattr`` the rest; raise if anything is missing."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ModuleNotFoundError(dotted)


def defines_test(path: str, name: str) -> bool:
    file = ROOT / path
    if not file.is_file():
        return False
    return re.search(rf"^\s*(?:async\s+)?def {re.escape(name)}\(", file.read_text(), flags=re.MULTILINE) is not None


def laws_equal(first: Mapping[Hashable, Fraction], second: Mapping[Hashable, Fraction]) -> bool:
    keys = set(first) | set(second)
    return all(first.get(key, F(0)) == second.get(key, F(0)) for key in keys)


def total_variation(first: Mapping[Hashable, Fraction], second: Mapping[Hashable, Fraction]) -> Fraction:
    keys = set(first) | set(second)
    return sum((abs(first.get(key, F(0)) - second.get(key, F(0))) for key in keys), F(0)) / 2


Runner = Callable[[Any], Any]


# ==========================================================================================================
# Tree-level helpers (T03-T07): context-dependent tables, drafted trees, extended-block laws
# ==========================================================================================================
# The context-dependent tables are the tests' own (tests/tables.py): one builder for tests and runner.
table = random_table
as_model = model


def sample_iid_tree(rng: Any, draft: Table, K: int, L: int) -> Any:
    """K i.i.d. paths of length L from the draft table (sampled here, inside the enumerated function)."""
    import numpy as np

    from spec_ref.tree import DraftTree

    paths = []
    for _ in range(K):
        prefix: tuple[int, ...] = ()
        for _ in range(L):
            prefix = prefix + (rng.categorical(np.array(draft[prefix], dtype=object)),)
        paths.append(prefix)
    return DraftTree.from_paths(paths, as_model(draft))


def extend(rng: Any, target: Table, tokens: tuple[int, ...], length: int) -> tuple[int, ...]:
    import numpy as np

    while len(tokens) < length:
        tokens = tokens + (rng.categorical(np.array(target[tokens], dtype=object)),)
    return tokens


def autoregressive_law(target: Table, length: int) -> Law:
    vocab = len(target[()])
    law: Law = {}
    for seq in itertools.product(range(vocab), repeat=length):
        mass = F(1)
        for i in range(length):
            mass *= target[seq[:i]][seq[i]]
        if mass:
            law[seq] = mass
    return law


def extended_law(build: Callable[[Any], Any], step: Callable[[Any, Any], tuple[int, ...]], target: Table, length: int) -> Law:
    """Exact law of: draft a tree with ``build(rng)``, emit a block with ``step(tree, rng)``, extend to ``length``."""

    def run(rng: Any) -> tuple[int, ...]:
        tree = build(rng)
        return extend(rng, target, tuple(step(tree, rng)), length)

    return {k: v for k, v in exact_law(run).items() if v}


def block_law(tree: Any, step: Callable[[Any, Any], tuple[int, ...]]) -> Law:
    """Exact law of the emitted block for a FIXED tree (the verifier's randomness only)."""
    return exact_law(lambda rng: tuple(step(tree, rng)))


def chain_tree(tokens: Sequence[int], draft: Table) -> Any:
    from spec_ref.tree import DraftTree

    return DraftTree.from_paths([tuple(tokens)], as_model(draft))


# ----- a test-local Traversal (docs/algorithms.md section 6.2) with switchable order and update: the mutants' base ------
def traversal_oracle(tree: Any, target: Table, rng: Any, rule: str = "current", order: str = "draw", wr: bool = False) -> tuple[int, ...]:
    """Traversal verification written from the statement of T05, independently of spec_ref.verify.

    ``rule``: "current" (w <- Z/(Z+1-w), the theorem), "initial" (w <- Z/(Z+1-w_initial)) or "draft_mass"
    (w <- min(1, Z/(1-Q(x)))) -- the two wrong updates of docs/algorithms.md section 6.4. ``order``: "draw" (the theorem)
    or "token" (siblings sorted by token id). ``wr``: with-replacement rounds (dups), else WOR.
    """
    import numpy as np

    n = tree.num_nodes
    prefix = [tree.path_tokens(u) for u in range(n)]
    P = [list(target[prefix[u]]) for u in range(n)]
    Q = [None if tree.draft_probs[u] is None else [F(v) for v in tree.draft_probs[u]] for u in range(n)]
    w = [F(1)] * n
    rounds: list[list[tuple[int, bool]]] = []
    for u in range(n):
        seen: list[int] = []
        entries: list[tuple[int, bool]] = []
        for t in tree.draws[u]:
            if t in seen:
                if wr:
                    entries.append((tree.child(u, t), True))
                continue
            seen.append(t)
            entries.append((tree.child(u, t), False))
        if order == "token":
            entries.sort(key=lambda e: tree.tokens[e[0]])
        rounds.append(entries)
    initial = list(w)

    def child_weight(u: int, t: int) -> Fraction:
        q = Q[u]
        return F(0) if q is None or q[t] <= 0 else min(F(1), w[u] * P[u][t] / q[t])

    def refresh(u: int) -> None:
        for c, dup in rounds[u]:
            if not dup:
                w[c] = child_weight(u, tree.tokens[c])
                initial[c] = w[c]
                refresh(c)

    def reject(u: int, t: int) -> None:
        q = Q[u]
        assert q is not None
        mass = pos([w[u] * a - b for a, b in zip(P[u], q)])
        z = sum(mass, F(0))
        if rule == "current":
            d = z + 1 - w[u]
            w[u] = z / d if d > 0 else F(1)
        elif rule == "initial":
            d = z + 1 - initial[u]
            w[u] = min(F(1), z / d) if d > 0 else F(1)
        else:
            w[u] = min(F(1), z / (1 - q[t])) if q[t] < 1 else F(1)
        if z > 0:
            P[u] = [m / z for m in mass]
        if not wr:
            q = list(q)
            q[t] = F(0)
            total = sum(q, F(0))
            Q[u] = [v / total for v in q] if total > 0 else q
        refresh(u)

    refresh(0)
    while True:
        u = 0
        while rounds[u]:
            c, dup = rounds[u][0]
            if dup:
                rounds[u].pop(0)
                reject(u, tree.tokens[c])
                continue
            u = c
        if u == 0:
            return tuple(prefix[0]) + (int(rng.categorical(np.array(P[0], dtype=object))),)
        if rng.bernoulli(w[u]):
            return tuple(prefix[u]) + (int(rng.categorical(np.array(P[u], dtype=object))),)
        parent = tree.parents[u]
        rounds[parent].pop(0)
        reject(parent, tree.tokens[u])
