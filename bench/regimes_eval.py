"""Exact block efficiency of every verifier on recorded node laws (NumPy only; used by bench/study_regimes.py).

A *shared draw* at a root (:class:`spec_fast.nde.selector_data.DelayedDraws`: a spine and extra branches below
every trunk prefix) gives every ``(K, L1, L2)`` delayed tree of the action space at once (the (K, L1, L2)
tree is the (K, L1, L2max) tree cut at depth L1 + L2). For every node with draws the study records the
target law p and the draft law q. This module turns them into exact expectations:

* :func:`reduce_pair` -- the exact vocabulary reduction of one node: keep the tokens where p or q is
  positive, plus the ``pad`` lowest-id tokens where both are 0. Verifiers never draft or output a token of
  zero mass under both laws, and every residual treats them as zeros; Khisti's pair LP ranks tokens by
  ``p - q1 q2`` (ties by the lower id) and keeps the top ``s``, where zero tokens can enter only as the
  lowest-id ones, so ``pad >= s`` (Khisti's truncation, 5) keeps its LP and its law unchanged. Tests
  check every method against :func:`spec_ref.efficiency.expected_block_efficiency` on the full vocabulary.
* :func:`ot_depth_mass` -- eq. 3 of seed 002 (docs/algorithms.md section 4) split by depth: the reach
  mass of every depth of a tree for an OT method (NSS, NaiveTree, SpecTr, SpecInfer, Khisti), with one
  plan per (node, number of draws) shared by every tree of a draw. ``E[tau + 1 | tree] = sum``; the
  acceptance at depth d is ``mass[d] / mass[d - 1]``.
* :func:`traversal_depth_law` -- Traversal's exact law of the accepted depth on a tree. Traversal tests one
  node at a time (``U < w``) and, on a rejection, moves deterministically to the next test, so its accepted
  node is a chain of tests: P(node i) = prod_{j < i} (1 - w_j) w_i, the root last. One run of
  :func:`spec_ref.verify` with a source that rejects every test records the (node, w) chain exactly.
* :func:`tree_of` -- a (K, L1, L2) tree of a draw as a :class:`spec_ref.DraftTree` on the union of its
  nodes' reduced vocabularies (for naive/BV closed forms, Traversal and Monte Carlo runs of
  :func:`spec_ref.verify`). Leaves carry no recorded law (the accepted depth never reads it): they get a
  point mass, which only the bonus token would see.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from spec_fast.nde.selector_data import DelayedDraws, delayed_tree_paths
from spec_ref.drafting import _assemble
from spec_ref.tree import DraftTree
from spec_ref.verify import OT_METHODS, ot_solver, verify

Prefix = tuple[int, ...]
#: Khisti's pair-LP truncation (spec_ref's default) and so the zero-mass padding of :func:`reduce_pair`
PAD = 5


@dataclass(frozen=True)
class NodeLaw:
    """One node's laws on its reduced vocabulary: ``kept`` (sorted token ids), ``p`` and ``q`` over them."""

    kept: npt.NDArray[np.int64]
    p: npt.NDArray[np.float64]
    q: npt.NDArray[np.float64]

    def local(self, tokens: tuple[int, ...]) -> tuple[int, ...]:
        index = np.searchsorted(self.kept, tokens)
        if np.any(index >= self.kept.size) or np.any(self.kept[np.minimum(index, self.kept.size - 1)] != tokens):
            raise ValueError(f"tokens={tokens} are not all in the node's reduced vocabulary")
        return tuple(int(i) for i in index)


def reduce_pair(p: npt.NDArray[np.float64], q: npt.NDArray[np.float64], pad: int = PAD) -> NodeLaw:
    """The exact reduction of one node's (p, q) (module docstring)."""
    if p.shape != q.shape or p.ndim != 1:
        raise ValueError(f"p and q must be vectors of one size, got shapes {p.shape} and {q.shape}")
    support = np.flatnonzero((p > 0) | (q > 0))
    zeros: list[int] = []
    cursor = 0
    for token in support.tolist() + [p.size]:
        while cursor < token and len(zeros) < pad:
            zeros.append(cursor)
            cursor += 1
        cursor = token + 1
        if len(zeros) >= pad:
            break
    kept = np.union1d(support, np.asarray(zeros, dtype=np.int64)).astype(np.int64)
    return NodeLaw(kept, p[kept] / p[kept].sum(), q[kept] / q[kept].sum())


def action_draws(draws: DelayedDraws, K: int, L1: int) -> dict[Prefix, list[int]]:
    """``prefix -> ordered draws`` of the (K, L1, L2max) tree of a shared draw (Def. 5.2 draws per node)."""
    trunk, branches = delayed_tree_paths(draws, K, L1, draws.max_branch_length)
    out: dict[Prefix, list[int]] = {}
    for j in range(L1):
        out[trunk[:j]] = [trunk[j]]
    for branch in branches:
        for j in range(len(branch)):
            out.setdefault(trunk + branch[:j], []).append(branch[j])
    return out


def ot_depth_mass(draws_of: Mapping[Prefix, list[int]], laws: Mapping[Prefix, NodeLaw], method: str,
                  cache: dict[Any, Any] | None = None) -> npt.NDArray[np.float64]:
    """Reach mass by depth (index 0: the root, 1) of ``method`` on the tree ``draws_of`` (module docstring).

    ``cache`` (one dict per draw and method) keeps the solver plans and branching laws across trees."""
    if method not in OT_METHODS:
        raise ValueError(f"method must be one of {OT_METHODS}, got method={method!r}")
    cache = {} if cache is None else cache
    solver = ot_solver(method, {})
    depth = max((len(prefix) + 1 for prefix in draws_of), default=0)
    mass = np.zeros(depth + 1)
    mass[0] = 1.0
    reach: dict[Prefix, float] = {(): 1.0}
    for prefix in sorted(draws_of, key=len):
        node = tuple(draws_of[prefix])
        key = (prefix, node)
        if key not in cache:
            law = laws[prefix]
            local = law.local(node)
            if method == "nss":
                values = law.p
            else:
                plan_key = (prefix, len(node))
                if plan_key not in cache:
                    cache[plan_key] = solver.plan(law.p, law.q, len(node))
                values = solver.branching_planned(cache[plan_key], local)
            cache[key] = {t: float(values[i]) for t, i in zip(node, local)}
        branching = cache[key]
        for token in dict.fromkeys(node):
            child = reach[prefix] * branching[token]
            reach[prefix + (token,)] = child
            mass[len(prefix) + 1] += child
    return mass


def tree_of(draws_of: Mapping[Prefix, list[int]], laws: Mapping[Prefix, NodeLaw]) -> tuple[DraftTree, Any]:
    """``(tree, target_model)`` of ``draws_of`` on the union of its nodes' reduced vocabularies."""
    union = np.unique(np.concatenate([laws[prefix].kept for prefix in draws_of] + [np.zeros(1, dtype=np.int64)]))

    def spread(prefix: Prefix, which: str) -> npt.NDArray[np.float64]:
        law = laws[prefix]
        out = np.zeros(union.size)
        out[np.searchsorted(union, law.kept)] = getattr(law, which)
        return out

    local = {int(t): i for i, t in enumerate(union.tolist())}
    full: dict[Prefix, list[int]] = {tuple(local[t] for t in prefix): [local[t] for t in node]
                                     for prefix, node in draws_of.items()}
    for prefix, node in list(full.items()):
        for token in node:
            full.setdefault(prefix + (token,), [])
    inverse = {v: k for k, v in local.items()}
    original = {prefix: tuple(inverse[t] for t in prefix) for prefix in full}
    q_of: dict[Prefix, Any] = {prefix: spread(original[prefix], "q") for prefix, node in full.items() if node}
    point = np.zeros(union.size)
    point[0] = 1.0
    p_of = {prefix: spread(original[prefix], "p") if full[prefix] else point for prefix in full}
    tree = _assemble(full, q_of, "iid")
    return tree, lambda prefix: p_of[tuple(prefix)]


class _Accepted(Exception):
    """A Traversal test with w >= 1: the walk stops there with certainty."""


class _RejectingSource:
    """A :class:`spec_ref.rng.RandomSource` whose every ``U < w`` test fails, recording ``(node, w)``."""

    def __init__(self) -> None:
        self.node = 0
        self.tests: list[tuple[int, float]] = []

    def substream(self, index: int) -> _RejectingSource:
        self.node = index
        return self

    def uniform(self) -> _RejectingSource:
        return self

    def __lt__(self, threshold: Any) -> bool:
        self.tests.append((self.node, float(threshold)))
        if float(threshold) >= 1.0:
            raise _Accepted
        return False

    def categorical(self, weights: Any) -> int:
        return int(np.flatnonzero(np.asarray(weights) > 0)[0])

    def bernoulli(self, probability: Any) -> bool:
        raise TypeError("Traversal draws no Bernoulli")

    def integers(self, n: int) -> int:
        raise TypeError("Traversal draws no integers")


def traversal_depth_law(tree: DraftTree, target_model: Any) -> npt.NDArray[np.float64]:
    """P(accepted depth = d), d = 0..max depth, of Traversal (WOR siblings) on ``tree``, exactly."""
    source = _RejectingSource()
    try:
        verify(tree, target_model, "traversal", source)
    except _Accepted:
        pass
    law = np.zeros(tree.max_depth + 1)
    left = 1.0
    for node, w in source.tests:
        w = min(max(w, 0.0), 1.0)
        law[tree.depths[node]] += left * w
        left *= 1.0 - w
    law[0] += left
    return law
