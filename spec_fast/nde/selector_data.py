"""Block-efficiency targets of the NDE selector's offline dataset: E_hat[tau(c, a) + 1] for every action.

At a root c the dataset needs, for every ``a = (K, L1, L2)`` of eq. (8), the estimate of eq. (3) over
random ``(K, L1, L2)``-delayed trees (seed 002 (docs/papers.md) Def. 5.2, section 5). Drawing every action's trees apart
would cost 324 drafts and target passes per root; instead one *shared draw* serves all of them
(:class:`DelayedDraws`):

* a **spine** ``a_1 .. a_{L1max + L2max}`` drawn token by token from q (``a_j ~ q(. | a_{<j})``);
* for every trunk length ``L1``, ``K_max - 1`` **extra branches** of ``L2max`` tokens drawn from q below
  ``a_{1:L1}``.

The ``(K, L1, L2)`` tree of a shared draw is the trunk ``a_{1:L1}``, branch 1 = ``a_{L1+1 : L1+L2}`` (the
spine's own continuation, which *is* a draw of ``L2`` tokens from q below the trunk) and branches
``2..K`` = the first ``K - 1`` extra branches of ``L1``, cut to ``L2`` tokens. Every action's tree is
therefore exactly distributed as Def. 5.2 says (trees of different actions are correlated, which changes
no action's expectation), and the ``(K, L1, L2)`` tree is the ``(K, L1, L2max)`` tree cut at depth
``L1 + L2``: eq. (3)'s reach probabilities of the nodes above the cut do not depend on what lies below it,
so one pass over the ``(K, L1, L2max)`` tree gives all ``L2`` at once (cumulative sums by depth).
Branching laws ``B_u(t | D_u)`` are computed with :mod:`spec_ref`'s OT solvers (the eq. 3 machinery of
:mod:`spec_ref.efficiency`), once per distinct ``(node, draws)`` pair.

Vocabulary compression (exact, :data:`COMPRESSIBLE`): for NSS, NaiveTree, SpecTr and SpecInfer the law at a
drafted token only depends on the other tokens through sums over tokens of draft mass 0 -- those are never
drafted, ``(P - q)_+ = P`` and ``min(p / rho, q) = 0`` on them, so every residual treats them linearly --
so they are merged into one bucket token (``V`` -> ``|supp q| + 1``). Khisti's pair LP ranks single tokens
by ``p - q1 q2`` and keeps the top ``s``, which a bucket would change, so Khisti always runs on the full V.

**Rao-Blackwellised targets** (``estimator="rao_blackwell"``, what the dataset uses). Eq. (3) sums the reach
probabilities of every node; grouping the children by parent, ``E[tau + 1 | tree] = 1 + sum_u reach(u) *
A_u(D_u)`` over the nodes ``u`` that have draws, where ``A_u(D_u) = sum_{t in D_u} B_u(t | D_u)`` is the
probability that verification at ``u`` descends. Given the tree down to ``u`` and its number of draws
``m_u``, the draws ``D_u`` are ``m_u`` fresh i.i.d. samples of ``q_u`` (Def. 5.2; the number of paths through a
branch node is fixed by the tokens above it), so replacing ``A_u(D_u)`` by its expectation
``P(Y in D_u) = Solver.acceptance(p_u, q_u, m_u)`` (seed 002 appendix C, spec_ref's closed forms) keeps the
estimate unbiased for the expectation over drafts that eq. (3)'s selector wants, and lowers its variance
(Rao-Blackwell): the last level of every tree is averaged exactly, so ``(K, 0, 1)`` is exact
(``1 + P(Y in D_root)``) and only deeper levels still depend on the draw. Khisti's acceptance has no closed
form (enumeration over ``V^m`` tuples), so Khisti nodes with ``m >= 2`` keep the realised ``A_u(D_u)``
(still unbiased); with ``m = 1`` every OT solver is the single-draft rule, ``sum min(p, q)``.
``estimator="realised"`` is eq. (3) on the drawn trees as they are (tested against
:func:`spec_ref.efficiency.expected_block_efficiency`).

:func:`action_efficiencies` is the pure part (numpy, float64); ``scripts/selector_dataset.py`` draws the
shared trees with the real models and runs one target pass over their union per root.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from spec_ref.selector import action_space
from spec_ref.verify import OT_METHODS, ot_solver

__all__ = ["COMPRESSIBLE", "ESTIMATORS", "DelayedDraws", "delayed_tree_paths", "action_efficiencies"]

#: Methods whose branching laws are unchanged by merging the tokens of draft mass 0 (module docstring).
COMPRESSIBLE = ("nss", "naive_tree", "spectr", "specinfer")
#: Estimators of :func:`action_efficiencies` (module docstring).
ESTIMATORS = ("realised", "rao_blackwell")

Prefix = tuple[int, ...]
ProbabilityModel = Callable[[Prefix], Any]


@dataclass(frozen=True)
class DelayedDraws:
    """One shared draw at a root (module docstring): ``spine`` has ``max_trunk + max_branch_length``
    tokens; ``extra[L1][k]`` (``L1 = 0..max_trunk``, ``k = 0..max_branches - 2``) has ``max_branch_length``."""

    spine: tuple[int, ...]
    extra: tuple[tuple[tuple[int, ...], ...], ...]
    max_branches: int = 4
    max_trunk: int = 8
    max_branch_length: int = 8

    def __post_init__(self) -> None:
        if len(self.spine) != self.max_trunk + self.max_branch_length:
            raise ValueError(f"spine must hold {self.max_trunk + self.max_branch_length} tokens, got {len(self.spine)}")
        if len(self.extra) != self.max_trunk + 1 or any(len(row) != self.max_branches - 1 for row in self.extra):
            raise ValueError(
                f"extra must be [{self.max_trunk + 1}][{self.max_branches - 1}] branches, got "
                f"{[len(row) for row in self.extra]}"
            )
        if any(len(branch) != self.max_branch_length for row in self.extra for branch in row):
            raise ValueError(f"every extra branch must hold {self.max_branch_length} tokens")


def delayed_tree_paths(draws: DelayedDraws, K: int, L1: int, L2: int) -> tuple[Prefix, list[Prefix]]:
    """``(trunk, branches)`` of the ``(K, L1, L2)`` tree of a shared draw (module docstring)."""
    if not (1 <= K <= draws.max_branches and 0 <= L1 <= draws.max_trunk and 0 <= L2 <= draws.max_branch_length):
        raise ValueError(f"action (K, L1, L2)=({K}, {L1}, {L2}) is outside the draw's action space")
    trunk = draws.spine[:L1]
    branches = [draws.spine[L1 : L1 + L2]] + [draws.extra[L1][k][:L2] for k in range(K - 1)]
    return trunk, branches


def action_efficiencies(
    draws: DelayedDraws,
    target_model: ProbabilityModel,
    draft_model: ProbabilityModel,
    method: str,
    options: Mapping[str, Any] | None = None,
    compress: bool = True,
    estimator: str = "realised",
) -> npt.NDArray[np.float64]:
    """``E[tau + 1 | tree(a)]`` (eq. 3) of every action's tree of one shared draw, ``[A]`` float64 in
    :func:`spec_ref.selector.action_space` order. ``target_model`` / ``draft_model``: prefix (tokens after
    the root) -> p / q ``[V]`` (float64) at every node that has draws; ``method``: an OT method of
    :mod:`spec_ref.verify` (nss, naive_tree, spectr, specinfer, khisti). ``compress``: merge the tokens of
    draft mass 0 for the methods of :data:`COMPRESSIBLE` (module docstring; the result is the same).
    ``estimator``: ``"realised"`` (eq. 3 on the drawn trees) or ``"rao_blackwell"`` (module docstring: the
    same expectation over drafts, lower variance)."""
    if method not in OT_METHODS:
        raise ValueError(f"method must be one of the OT methods {OT_METHODS}, got method={method!r}")
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}, got estimator={estimator!r}")
    solver = ot_solver(method, dict(options or {}))
    plans: dict[tuple[Prefix, int], Any] = {}
    supports: dict[Prefix, npt.NDArray[np.int64] | None] = {}
    compress = compress and method in COMPRESSIBLE

    def support(prefix: Prefix) -> npt.NDArray[np.int64] | None:
        """Tokens of positive draft mass at ``prefix`` (None: no compression)."""
        if prefix not in supports:
            supports[prefix] = np.flatnonzero(np.asarray(draft_model(prefix)) > 0) if compress else None
        return supports[prefix]

    def compressed(prefix: Prefix) -> tuple[Any, Any]:
        p, q = np.asarray(target_model(prefix), dtype=np.float64), np.asarray(draft_model(prefix), dtype=np.float64)
        kept = support(prefix)
        if kept is None:
            return p, q
        outside = np.ones(p.shape[0], dtype=bool)
        outside[kept] = False
        return np.append(p[kept], p[outside].sum()), np.append(q[kept], 0.0)

    laws: dict[tuple[Prefix, tuple[int, ...]], dict[int, float]] = {}
    acceptances: dict[tuple[Prefix, int], float] = {}

    def plan(prefix: Prefix, count: int) -> Any:
        if (prefix, count) not in plans:
            plans[(prefix, count)] = solver.plan(*compressed(prefix), count)
        return plans[(prefix, count)]

    def expected_acceptance(prefix: Prefix, count: int) -> float | None:
        """``P(Y in D_u)`` for ``count`` fresh draws at ``prefix`` (None: Khisti with count >= 2)."""
        if method == "khisti" and count >= 2:
            return None
        key = (prefix, count)
        if key not in acceptances:
            if method == "khisti":  # one draw: the single-draft rule (seed 002 footnote 2)
                p, q = compressed(prefix)
                acceptances[key] = float(np.minimum(p, q).sum())
            else:
                acceptances[key] = float(solver.acceptance_planned(plan(prefix, count)))
        return acceptances[key]

    def law(prefix: Prefix, node_draws: tuple[int, ...]) -> dict[int, float]:
        key = (prefix, node_draws)
        if key not in laws:
            if method == "nss":
                full = np.asarray(target_model(prefix), dtype=np.float64)
            else:
                kept = support(prefix)
                local = node_draws if kept is None else tuple(int(i) for i in np.searchsorted(kept, node_draws))
                reduced = solver.branching_planned(plan(prefix, len(node_draws)), local)
                laws[key] = {t: float(reduced[i]) for t, i in zip(node_draws, local)}
                return laws[key]
            laws[key] = {t: float(full[t]) for t in set(node_draws)}
        return laws[key]

    actions = action_space(draws.max_branches, draws.max_trunk, draws.max_branch_length)
    index = {a: i for i, a in enumerate(actions)}
    out = np.zeros(len(actions), dtype=np.float64)
    l2_max = draws.max_branch_length
    for k in range(1, draws.max_branches + 1):
        for l1 in range(draws.max_trunk + 1):
            trunk, branches = delayed_tree_paths(draws, k, l1, l2_max)
            draws_of: dict[Prefix, list[int]] = {}
            for j in range(l1):
                draws_of[trunk[:j]] = [trunk[j]]  # trunk nodes: one draw each (Def. 5.2)
            for branch in branches:
                for j in range(l2_max):
                    draws_of.setdefault(trunk + branch[:j], []).append(branch[j])
            reach: dict[Prefix, float] = {(): 1.0}
            # by_depth[d + 1] = sum over the nodes u of depth d that have draws of reach(u) * A_u: the
            # reach mass of depth d + 1 (realised) or its expectation given the tree down to depth d
            by_depth = np.zeros(l1 + l2_max + 1, dtype=np.float64)
            by_depth[0] = 1.0
            for prefix in sorted(draws_of, key=len):  # parents before children
                node_draws = tuple(draws_of[prefix])
                node_law = law(prefix, node_draws)
                realised = 0.0
                for token in dict.fromkeys(node_draws):
                    child_reach = reach[prefix] * node_law[token]
                    reach[prefix + (token,)] = child_reach
                    realised += child_reach
                expected = expected_acceptance(prefix, len(node_draws)) if estimator == "rao_blackwell" else None
                by_depth[len(prefix) + 1] += realised if expected is None else reach[prefix] * expected
            cumulative = np.cumsum(by_depth)
            for l2 in range(l2_max + 1):
                out[index[(k, l1, l2)]] = cumulative[l1 + l2]
    return out
