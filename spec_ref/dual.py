"""Dual-draft trees: the merged tree of seed 001 (docs/papers.md) and step-level routing of seed 000.

Conventions (docs/algorithms.md section 8). Node 0 of every tree is the root: the context ending in the root
token s_{t+1} that the previous verification produced. Draft nodes hang below it; prefixes given to
``target_model`` are the drafted tokens after the root.

**Merge** (:func:`merge_trees`, seed 001 section 4.1). Head 1's nodes keep their indices; head 2's node
``i > 0`` becomes ``phi(i) = n1 + i`` (``phi(0) = 0``), where ``n1`` is head 1's number of non-root nodes;
parents are remapped through phi, so the two subtrees share only the root. The attention mask, depth
positions and path matrix are those of :func:`spec_ref.tensorize.tensorize_structure` on the merged
parents; the mask has the block form ``[[1, 0, 0], [1, M1, 0], [1, 0, M2]]``.

*Duplicate tokens under the root* (docs/algorithms.md section 8 leaves the choice open). **Choice: keep both.**
The merged structure keeps the two subtrees disjoint even when both heads propose the same token (as the
block mask of seed 001 section 4.2 requires); :func:`verify_merged_greedy` then runs a DFS over *all*
matching children and keeps the longest accepted path, ties to head 1. For a sampling verifier, which
needs one node per context, :meth:`MergedTree.union_tree` gives the token-merged union as a
:class:`~spec_ref.tree.DraftTree` (duplicates merged, draw lists concatenated head 1 first).

*Sampling on dual-draft trees* (docs/algorithms.md section 8, which corrects the loose wording of seed 000 6.2
and seed 001 6.2): these are one-hot-draft rejections, i.e. NSS on a deterministic tree, with one target
draw per visited node shared by all paths. Run ``verify(merged.union_tree(), target_model, "nss", rng)``;
choosing the best of several independently sampled paths afterwards is lossy.

*Greedy alignment* (docs/algorithms.md section 8): the first drafted level u_1 is checked against the target
argmax at the root (the context ending in s_{t+1}); seed 000 6.1 writes ``u_j = z_hat_{t+j}``, which is
the same once positions are aligned so that z_hat_{t+j} is predicted from the context ending at u_{j-1}.

**Lossy combinations are refused** with ``ValueError`` (docs/testing.md sections 0 (item 8) and 7):

* merging sampled (i.i.d.) trees whose draft distributions differ at a context both heads drew from:
  the merged node would need one shared q for draws that came from two different q's;
* merging trees of different draft processes, or trees drafted without replacement;
* routing on sampled drafts: picking the tree after seeing its draws makes them no longer i.i.d. from q
  (measured TV up to 0.23); routing needs deterministic (top-k) trees, verified with NSS or greedy.

**Routing** (:func:`route`, seed 000 sections 4-5): node confidence ``c_{h,i} = exp(s_{h,i})`` (the
product of draft probabilities along the path, :class:`~spec_ref.drafting.ScoredDraftTree`), head score
``mu_h`` = mean confidence over the retained draft nodes (root excluded; ``mu_h = 0`` when a head has no
draft node), ``h* = argmax mu_h`` with ties to head 1. Each step commits ``A_k = 1 + a`` tokens (the root
token plus ``a`` accepted draft tokens; seed 000 section 9): :func:`tokens_per_step`.

**Calibrated routing** lives in :mod:`spec_ref.dual_calibration` and is re-exported here
(:func:`calibrated_route`, :class:`RouteCalibration`, :func:`update_calibration`, ...): each head's nodes are
classed by a confidence feature (draft probability bins for model heads, match-length classes for a
retrieval head), calibrated to acceptance by a prior table plus the committed text of the generation, and
the head with the larger expected accepted length is verified. The seed's :func:`route` is unchanged.

Theorems: proofs/T06_deterministic_trees_and_routing.md (routing), proofs/T07_merge_and_greedy.md (merge, greedy).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from spec_ref._validate import Vector, probability_vector
from spec_ref.drafting import ScoredDraftTree, _assemble
from spec_ref.dual_calibration import (  # re-exported: the calibrated route of docs/algorithms.md section 8
    CALIBRATION_EDGES,
    FEATURES,
    LEVEL_WEIGHT,
    MATCH_LENGTH_EDGES,
    PRIOR_WEIGHT,
    CalibratedRouteResult,
    RouteCalibration,
    calibrated_confidences,
    calibrated_route,
    calibration_bin,
    check_routable,
    head_observations,
    match_class,
    node_bins,
    node_classes,
    num_classes,
    prior_rates,
    update_calibration,
)
from spec_ref.tensorize import TensorizedTree, tensorize_structure
from spec_ref.tree import DraftTree, Model, path_tokens

__all__ = [
    "MergedTree",
    "merge_trees",
    "RouteResult",
    "route",
    "mean_confidence",
    "FEATURES",
    "CALIBRATION_EDGES",
    "MATCH_LENGTH_EDGES",
    "PRIOR_WEIGHT",
    "LEVEL_WEIGHT",
    "RouteCalibration",
    "num_classes",
    "calibration_bin",
    "match_class",
    "prior_rates",
    "check_routable",
    "node_bins",
    "node_classes",
    "calibrated_confidences",
    "CalibratedRouteResult",
    "calibrated_route",
    "head_observations",
    "update_calibration",
    "MergedGreedyResult",
    "verify_merged_greedy",
    "tokens_per_step",
    "mean_tokens_per_step",
]


def _same_distribution(a: Vector, b: Vector) -> bool:
    return a.shape == b.shape and all(a[i] == b[i] for i in range(a.shape[0]))


@dataclass(frozen=True, eq=False)
class MergedTree:
    """The merged dual-draft tree of seed 001 (module docstring).

    ``tokens [N]``, ``parents [N]`` (root -1), ``heads [N]`` (0 for the root, else 1 or 2), ``phi``
    (head-2 index -> merged index, ``phi[0] = 0``), ``num_head_nodes = (n1, n2)``, ``layout`` (mask,
    positions, path matrix), the two source trees, and ``process`` (shared by both heads).
    """

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    heads: tuple[int, ...]
    phi: tuple[int, ...]
    num_head_nodes: tuple[int, int]
    layout: TensorizedTree
    tree_a: DraftTree
    tree_b: DraftTree
    process: str

    @property
    def num_nodes(self) -> int:
        return len(self.tokens)

    def children(self, node: int) -> tuple[int, ...]:
        """Children of ``node`` in merged node order (head 1's before head 2's)."""
        return tuple(i for i in range(1, self.num_nodes) if self.parents[i] == node)

    def path_tokens(self, node: int) -> tuple[int, ...]:
        return path_tokens(self.tokens, self.parents, node)

    def union_tree(self) -> DraftTree:
        """The token-merged union as one :class:`DraftTree` (one node per context).

        Draws per context: head 1's draws there, then head 2's (draw order kept within each head). On a
        deterministic tree the union keeps each token once (head 1's order first). Sampled trees were
        checked at merge time to share q at every common context, so ``draft_probs`` is well defined.
        """
        draws_of: dict[tuple[int, ...], list[int]] = {(): []}
        probs_of: dict[tuple[int, ...], Vector | None] = {}
        for tree in (self.tree_a, self.tree_b):
            for u in range(tree.num_nodes):
                prefix = tree.path_tokens(u)
                draws_of.setdefault(prefix, [])
                for t in tree.draws[u]:
                    if self.process == "deterministic" and t in draws_of[prefix]:
                        continue
                    draws_of[prefix].append(t)
                if tree.draft_probs[u] is not None and prefix not in probs_of:
                    probs_of[prefix] = tree.draft_probs[u]
        return _assemble(draws_of, probs_of, self.process)


def _check_tree(tree: Any, name: str) -> DraftTree:
    if not isinstance(tree, DraftTree):
        raise ValueError(f"{name} must be a spec_ref.DraftTree, got {type(tree).__name__}")
    return tree


def merge_trees(tree_a: DraftTree, tree_b: DraftTree) -> MergedTree:
    """Merge two heads' trees under their shared root (seed 001 section 4; module docstring).

    Head 1 = ``tree_a`` (indices kept), head 2 = ``tree_b`` (``phi(i) = n1 + i``). Refuses (``ValueError``)
    different draft processes, ``without_replacement`` trees, and sampled trees whose ``draft_probs``
    differ at a context both drew from (one shared q for two heads' draws is lossy).
    """
    tree_a = _check_tree(tree_a, "tree_a")
    tree_b = _check_tree(tree_b, "tree_b")
    if tree_a.process != tree_b.process:
        raise ValueError(
            f"tree_a.process={tree_a.process!r} and tree_b.process={tree_b.process!r} differ: one verifier "
            "cannot be lossless for both draft processes"
        )
    if tree_a.process == "without_replacement":
        raise ValueError(
            "tree_a.process='without_replacement': the union of two without-replacement draws is neither "
            "i.i.d. nor without replacement, so no verifier is lossless on the merge"
        )
    if tree_a.process == "iid":
        contexts_a = {tree_a.path_tokens(u): u for u in range(tree_a.num_nodes) if tree_a.draws[u]}
        for v in range(tree_b.num_nodes):
            prefix = tree_b.path_tokens(v)
            if not tree_b.draws[v] or prefix not in contexts_a:
                continue
            q_a = tree_a.draft_probs[contexts_a[prefix]]
            q_b = tree_b.draft_probs[v]
            assert q_a is not None and q_b is not None  # DraftTree guarantees q on sampled nodes with draws
            if not _same_distribution(q_a, q_b):
                raise ValueError(
                    f"tree_a and tree_b drew at context {prefix} from different draft distributions "
                    f"(q_a={list(q_a)}, q_b={list(q_b)}): merging i.i.d. trees of heads with different q "
                    "under one shared q is lossy; verify each head's tree separately"
                )
    n1 = tree_a.num_nodes - 1
    n2 = tree_b.num_nodes - 1
    phi = (0,) + tuple(n1 + i for i in range(1, n2 + 1))
    tokens = tree_a.tokens + tree_b.tokens[1:]
    parents = tree_a.parents + tuple(phi[tree_b.parents[i]] for i in range(1, n2 + 1))
    heads = (0,) + (1,) * n1 + (2,) * n2
    return MergedTree(
        tokens=tokens,
        parents=parents,
        heads=heads,
        phi=phi,
        num_head_nodes=(n1, n2),
        layout=tensorize_structure(tokens, parents),
        tree_a=tree_a,
        tree_b=tree_b,
        process=tree_a.process,
    )


# ----- routing ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RouteResult:
    """``head`` (1 or 2) chosen, its ``tree``, and ``mean_confidences = (mu_1, mu_2)``."""

    head: int
    tree: DraftTree
    mean_confidences: tuple[Any, Any]


def mean_confidence(tree: DraftTree, name: str = "tree") -> Any:
    """``mu_h``: mean confidence over the retained draft nodes (root excluded; 0 if there are none).

    Refuses sampled trees (routing on sampled drafts is lossy) and trees without confidences.
    """
    tree = check_routable(tree, name)
    scores = tree.confidences[1:]
    if not scores:
        return 0
    total = sum(scores[1:], scores[0])
    return total / len(scores)


def route(tree_a: DraftTree, tree_b: DraftTree) -> RouteResult:
    """Step-level routing of seed 000: verify only the head with the larger mean confidence.

    ``h* = 1`` if ``mu_1 >= mu_2`` (ties go to head 1), else 2. Deterministic: no randomness.
    """
    mu_a = mean_confidence(tree_a, "tree_a")
    mu_b = mean_confidence(tree_b, "tree_b")
    if mu_a >= mu_b:
        return RouteResult(head=1, tree=tree_a, mean_confidences=(mu_a, mu_b))
    return RouteResult(head=2, tree=tree_b, mean_confidences=(mu_a, mu_b))


def tokens_per_step(accepted_length: int) -> int:
    """``A_k = 1 + a`` (seed 000 section 9): the root token plus ``a`` accepted draft tokens."""
    if isinstance(accepted_length, bool) or not isinstance(accepted_length, (int, np.integer)) or accepted_length < 0:
        raise ValueError(f"accepted_length must be an integer >= 0, got {accepted_length!r}")
    return 1 + int(accepted_length)


def mean_tokens_per_step(accepted_lengths: Sequence[int]) -> Fraction:
    """``tau = sum_k A_k / #steps`` (seed 000 section 9), exactly, as a Fraction."""
    lengths = list(accepted_lengths)
    if not lengths:
        raise ValueError("accepted_lengths=[] is empty: tau needs at least one step")
    return Fraction(sum(tokens_per_step(a) for a in lengths), len(lengths))


# ----- greedy longest-match verification on the merged tree --------------------------------------------
@dataclass(frozen=True)
class MergedGreedyResult:
    """Greedy verification of a merged tree.

    ``node``: the deepest accepted merged node (0 if none); ``head``: its head (0 when ``a = 0``);
    ``accepted_length`` a; ``path_nodes``: merged indices root..node; ``accepted_tokens`` u_{1:a};
    ``bonus_token``: the target argmax after u_a (the next step's root token); ``tokens``: the emitted
    block ``u_{1:a} + (bonus,)``.
    """

    node: int
    head: int
    accepted_length: int
    path_nodes: tuple[int, ...]
    accepted_tokens: tuple[int, ...]
    bonus_token: int
    tokens: tuple[int, ...]


def _argmax_lowest(probs: Vector) -> int:
    best = 0
    for t in range(1, probs.shape[0]):
        if probs[t] > probs[best]:
            best = t
    return best


def verify_merged_greedy(merged: MergedTree, target_model: Model) -> MergedGreedyResult:
    """Greedy (T = 0) longest match over the merged tree (seed 001 6.1; docs/algorithms.md section 8).

    ``target_model``: prefix -> target probabilities ``[V]``; the greedy token at a node is its argmax,
    ties broken by the lowest id. A DFS from the root visits *every* child whose token equals the greedy
    token of its parent (both heads' copies of a duplicated token), and keeps the deepest accepted node;
    ties go to the node found first, i.e. head 1, then lower merged index. Equivalent to greedy matching
    of every candidate path (row of the path matrix) in context and taking the longest, first row on ties.
    No randomness.
    """
    if not isinstance(merged, MergedTree):
        raise ValueError(f"merged must be a MergedTree from merge_trees, got {type(merged).__name__}")
    if not callable(target_model):
        raise ValueError(f"target_model must be a function prefix -> probabilities [V], got {target_model!r}")
    greedy: dict[tuple[int, ...], int] = {}

    def greedy_at(node: int) -> int:
        prefix = merged.path_tokens(node)
        if prefix not in greedy:
            greedy[prefix] = _argmax_lowest(probability_vector(target_model(prefix), f"target_model({prefix})"))
        return greedy[prefix]

    children = [list(merged.children(u)) for u in range(merged.num_nodes)]

    def deepest(node: int) -> tuple[int, int]:
        """(accepted depth below node, deepest accepted node) from ``node``."""
        best = (0, node)
        token = greedy_at(node)
        for child in children[node]:
            if merged.tokens[child] == token:
                length, end = deepest(child)
                if length + 1 > best[0]:
                    best = (length + 1, end)
        return best

    length, end = deepest(0)
    path: list[int] = []
    node = end
    while node >= 0:
        path.append(node)
        node = merged.parents[node]
    path_nodes = tuple(reversed(path))
    accepted = merged.path_tokens(end)
    bonus = greedy_at(end)
    return MergedGreedyResult(
        node=end,
        head=merged.heads[end],
        accepted_length=length,
        path_nodes=path_nodes,
        accepted_tokens=accepted,
        bonus_token=bonus,
        tokens=accepted + (bonus,),
    )
