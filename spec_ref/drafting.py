"""Draft-tree construction: i.i.d. K x L trees, delayed (K, L1, L2) trees, budgeted top-k trees.

Three drafting processes (docs/algorithms.md section 1; ``DraftTree.process``):

* :func:`draft_delayed_tree` (``process="iid"``): seed 002 (docs/papers.md) Def. 5.2. A trunk of ``L1`` tokens sampled one
  at a time from q, then ``K`` i.i.d. branches of ``L2`` tokens each from the branch node. ``L1 = 0`` is the
  i.i.d. K x L tree (:func:`draft_iid_tree`). Draws per node, in draw order (docs/algorithms.md section 1):
  a trunk node has ``n_u = 1``; the branch node has ``n_u = K`` (the first tokens of branches 1..K, in
  branch order); a node below it has ``n_u`` = the number of branches through it (their next tokens, in
  branch order).
* :func:`draft_topk_tree` (``process="deterministic"``): seed 000 section 3 / EAGLE-2: top-k expansions up
  to a depth limit, then the best ``budget`` draft nodes by cumulative draft log-score, kept closed under
  ancestors. Deterministic, so it carries no draft distributions (q is a point mass at each drafted token,
  docs/algorithms.md section 2) but it carries each node's *confidence* (the exponentiated cumulative draft
  log-score of seed 000 section 4) for routing (:mod:`spec_ref.dual`).

Deterministic trees are returned as :class:`ScoredDraftTree`, a :class:`~spec_ref.tree.DraftTree` that also
stores ``confidences [N]``: ``confidences[i] = prod_{edges u -> u.t on the path to i} q_u(t)`` (root: 1),
i.e. ``exp(s_i)`` with ``s_i`` the cumulative draft log-score. Storing the product instead of the log keeps
exact (Fraction) mode exact; :attr:`ScoredDraftTree.log_scores` gives the logs.

Node numbering: DFS pre-order with children in draw order (as :meth:`DraftTree.from_paths`), so ancestors
come first.

Theorem: proofs/T06_deterministic_trees_and_routing.md (deterministic trees need NSS).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from spec_ref._validate import Vector, is_exact, probability_vector
from spec_ref.rng import as_source
from spec_ref.tree import DraftTree, Model

__all__ = [
    "ScoredDraftTree",
    "draft_delayed_tree",
    "draft_iid_tree",
    "draft_topk_tree",
    "ranked_tokens",
    "tree_signature",
]

Prefix = tuple[int, ...]


@dataclass(frozen=True, eq=False)
class ScoredDraftTree(DraftTree):
    """A :class:`DraftTree` that also carries ``confidences [N]`` (module docstring).

    ``confidences[i]`` is the product of the draft probabilities along the root-to-``i`` path (root: 1),
    the confidence ``c_i = exp(s_i)`` of seed 000 section 4 and the cumulative path probability
    ``p(u) = exp(l_bar_u)`` of seed 003 section 3.3.
    """

    confidences: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.confidences) != self.num_nodes:
            raise ValueError(
                f"len(confidences)={len(self.confidences)} must equal the number of nodes {self.num_nodes}"
            )
        if self.confidences[0] != 1:
            raise ValueError(f"confidences[0]={self.confidences[0]!r} must be 1 (the root)")
        for i in range(1, self.num_nodes):
            c = self.confidences[i]
            if not 0 < c <= self.confidences[self.parents[i]]:
                raise ValueError(
                    f"confidences[{i}]={c!r} must lie in (0, confidences[parent]={self.confidences[self.parents[i]]!r}]"
                )

    @property
    def log_scores(self) -> tuple[float, ...]:
        """Cumulative draft log-scores ``s_i = log(confidences[i])`` (float; root: 0.0)."""
        return tuple(math.log(c) for c in self.confidences)

    def __repr__(self) -> str:
        return f"ScoredDraftTree(N={self.num_nodes}, depth={self.max_depth}, {self.process}, draws={self.draws})"


# ----- validation helpers ---------------------------------------------------------------------------
def _int_at_least(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {name}={value!r}")
    if int(value) < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {name}={int(value)}")
    return int(value)


class _ModelCache:
    """Calls ``draft_model`` at most once per prefix and validates every output against one V and mode."""

    def __init__(self, model: Model, name: str) -> None:
        if not callable(model):
            raise ValueError(f"{name} must be a function prefix -> probabilities [V], got {model!r}")
        self.model = model
        self.name = name
        self.cache: dict[Prefix, Vector] = {}
        self.vocab_size: int | None = None

    def __call__(self, prefix: Prefix) -> Vector:
        if prefix not in self.cache:
            probs = probability_vector(self.model(prefix), f"{self.name}({prefix})", size=self.vocab_size)
            if self.vocab_size is None:
                self.vocab_size = int(probs.shape[0])
            self.cache[prefix] = probs
        return self.cache[prefix]


def ranked_tokens(probs: Vector) -> list[int]:
    """Tokens of positive probability, by decreasing probability, ties broken by the lower token id."""
    return sorted((t for t in range(probs.shape[0]) if probs[t] > 0), key=lambda t: (-probs[t], t))


def _assemble(
    draws_of: dict[Prefix, list[int]],
    probs_of: dict[Prefix, Vector | None],
    process: str,
    confidence_of: dict[Prefix, Any] | None = None,
    order: str = "dfs",
) -> DraftTree:
    """Flatten ``prefix -> ordered draws`` into a DraftTree (DFS pre-order or BFS, children in draw order)."""

    def children(prefix: Prefix) -> list[Prefix]:
        seen: list[int] = []
        for t in draws_of[prefix]:
            if t not in seen:
                seen.append(t)
        return [prefix + (t,) for t in seen]

    nodes: list[Prefix] = []
    if order == "dfs":
        stack: list[Prefix] = [()]
        while stack:
            prefix = stack.pop()
            nodes.append(prefix)
            stack.extend(reversed(children(prefix)))
    else:
        frontier: list[Prefix] = [()]
        while frontier:
            nodes.extend(frontier)
            frontier = [c for prefix in frontier for c in children(prefix)]
    index = {prefix: i for i, prefix in enumerate(nodes)}
    tokens = tuple(-1 if not pre else pre[-1] for pre in nodes)
    parents = tuple(-1 if not pre else index[pre[:-1]] for pre in nodes)
    draws = tuple(tuple(draws_of[pre]) for pre in nodes)
    probs = tuple(probs_of.get(pre) if draws_of[pre] else None for pre in nodes)
    if confidence_of is None:
        return DraftTree(tokens, parents, draws, probs, process=process)
    confidences = tuple(confidence_of[pre] for pre in nodes)
    return ScoredDraftTree(tokens, parents, draws, probs, process=process, confidences=confidences)


# ----- i.i.d. and delayed trees ---------------------------------------------------------------------
def draft_delayed_tree(draft_model: Model, K: int, L1: int, L2: int, rng: Any) -> DraftTree:
    """Sample a random (K, L1, L2)-delayed tree (seed 002 Def. 5.2); ``L1 = 0`` is the i.i.d. K x L2 tree.

    ``draft_model``: prefix (token ids after the root) -> draft probabilities ``[V]`` (float or Fraction).
    ``K >= 1`` branches, trunk length ``L1 >= 0``, branch length ``L2 >= 0``. ``rng``: a
    ``numpy.random.Generator``, an int seed or a :class:`spec_ref.rng.RandomSource`.

    Randomness budget: exactly ``L1 + K * L2`` calls ``rng.categorical(q_u)``, in this order:
    trunk tokens ``a_1 .. a_{L1}`` (``a_j ~ q(. | a_{<j})``); then branch 1's tokens ``b1_1 .. b1_{L2}``
    (``b1_j ~ q(. | a, b1_{<j})``), then branch 2's, ..., branch K's. Nothing else is drawn.

    The result (``process="iid"``) has ``draft_probs[u] = draft_model(prefix(u))`` at every node with draws
    and draws per node exactly as docs/algorithms.md section 1 says: ``n_u = 1`` on the trunk, ``n_u = K`` at the
    branch node, and below it one draw per branch through the node, in branch order. If ``L2 = 0`` the
    tree is the trunk alone (the branches are empty, whatever K).
    """
    K = _int_at_least(K, "K", 1)
    L1 = _int_at_least(L1, "L1", 0)
    L2 = _int_at_least(L2, "L2", 0)
    source = as_source(rng)
    model = _ModelCache(draft_model, "draft_model")
    draws_of: dict[Prefix, list[int]] = {(): []}

    def draw(prefix: Prefix) -> Prefix:
        q = model(prefix)
        token = int(source.categorical(q))
        draws_of[prefix].append(token)
        child = prefix + (token,)
        draws_of.setdefault(child, [])
        return child

    branch_node: Prefix = ()
    for _ in range(L1):
        branch_node = draw(branch_node)
    for _ in range(K):
        node = branch_node
        for _ in range(L2):
            node = draw(node)
    probs_of: dict[Prefix, Vector | None] = {pre: model.cache.get(pre) for pre in draws_of}
    return _assemble(draws_of, probs_of, "iid")


def draft_iid_tree(draft_model: Model, K: int, L: int, rng: Any) -> DraftTree:
    """The i.i.d. K x L multi-path tree: ``draft_delayed_tree(draft_model, K, 0, L, rng)`` (same budget)."""
    return draft_delayed_tree(draft_model, K, 0, L, rng)


# ----- deterministic budgeted top-k trees -----------------------------------------------------------
def draft_topk_tree(draft_model: Model, depth: int, top_k: int, budget: int) -> ScoredDraftTree:
    """Deterministic top-k tree with a node budget (seed 000 section 3, EAGLE-2 style). No randomness.

    The *full expansion* gives every node at depth ``< depth`` its ``top_k`` most probable next tokens
    under ``draft_model`` (tokens of positive draft probability only; ties broken by the lower token id).
    Each node's score is its confidence ``c = prod q`` along its path, i.e. ``exp`` of the cumulative draft
    log-score. The kept set is the ``budget`` best draft nodes (the root is not counted) *closed under
    ancestors*, chosen best-first: starting from the root's children, repeatedly keep the best not-yet-kept
    node whose parent is kept. Order (the tie rule): higher confidence first, then the lower token id,
    then the earlier-created node (nodes are created when their parent is kept; siblings in rank order).
    Since a child's confidence never exceeds its parent's, the kept set is exactly a set of ``budget`` full
    -expansion nodes of highest confidence (every kept node scores >= every discarded one), and ties never
    break ancestor closure. Only kept nodes are expanded, so ``draft_model`` is called at most
    ``budget + 1`` times.

    Returns a :class:`ScoredDraftTree` with ``process="deterministic"``, ``draft_probs`` all ``None`` (q is
    a point mass at each drafted token: verify with NSS or greedy only, docs/algorithms.md section 2), draws at
    each node = its kept children in rank order (decreasing draft probability, then token id).

    Raises ``ValueError`` for ``depth < 1``, ``top_k < 1`` or ``budget < 1``.
    """
    depth = _int_at_least(depth, "depth", 1)
    top_k = _int_at_least(top_k, "top_k", 1)
    budget = _int_at_least(budget, "budget", 1)
    model = _ModelCache(draft_model, "draft_model")
    confidence_of: dict[Prefix, Any] = {(): Fraction(1)}
    heap: list[tuple[Any, int, int, Prefix]] = []
    created = 0

    def expand(prefix: Prefix) -> None:
        nonlocal created
        q = model(prefix)
        if prefix == ():
            one = Fraction(1) if is_exact(q) else 1.0
            confidence_of[()] = one
        for t in ranked_tokens(q)[:top_k]:
            child = prefix + (t,)
            confidence_of[child] = confidence_of[prefix] * q[t]
            heapq.heappush(heap, (-confidence_of[child], t, created, child))
            created += 1

    expand(())
    kept: list[Prefix] = []
    while heap and len(kept) < budget:
        _, _, _, prefix = heapq.heappop(heap)
        kept.append(prefix)
        if len(prefix) < depth:
            expand(prefix)
    draws_of: dict[Prefix, list[int]] = {(): []}
    for prefix in kept:
        draws_of[prefix] = []
    for prefix in kept:
        draws_of[prefix[:-1]].append(prefix[-1])
    for prefix, draws in draws_of.items():
        if draws:
            rank = {t: r for r, t in enumerate(ranked_tokens(model(prefix)))}
            draws.sort(key=rank.__getitem__)
    tree = _assemble(draws_of, {}, "deterministic", {pre: confidence_of[pre] for pre in draws_of})
    assert isinstance(tree, ScoredDraftTree)
    return tree


def tree_signature(tree: DraftTree) -> tuple[tuple[int, ...], tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """``(tokens, parents, draws)``: a hashable summary of a tree's structure (used by exact-law tests)."""
    return tree.tokens, tree.parents, tree.draws

