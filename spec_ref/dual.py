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

**Calibrated routing** (:func:`calibrated_route`; docs/algorithms.md section 8). The seed's ``mu_h`` trusts
each drafter's own probabilities; a retrieval draft proposes with probability 1 and wins every step it has
a match. The calibrated rule keeps the seed's :func:`route` unchanged and adds a per-head calibration
(:class:`RouteCalibration`) learned from the decoding history: per bin of a node's own draft probability
``q``, how often such a node was offered and matched the committed text (:func:`update_calibration`, for
both heads whether or not their tree was verified); node confidences become products of Laplace estimates
and the head score is the expected accepted length. The choice depends only on the drafts and the past, so
it stays lossless.

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
from spec_ref.tensorize import TensorizedTree, tensorize_structure
from spec_ref.tree import DraftTree, Model, path_tokens

__all__ = [
    "MergedTree",
    "merge_trees",
    "RouteResult",
    "route",
    "mean_confidence",
    "CALIBRATION_EDGES",
    "RouteCalibration",
    "calibration_bin",
    "node_bins",
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
    tree = _check_tree(tree, name)
    if not tree.deterministic:
        raise ValueError(
            f"{name}.process={tree.process!r}: routing on sampled drafts is lossy (choosing a tree after seeing "
            "its draws breaks the i.i.d. draft law); route deterministic top-k trees and verify with NSS or greedy"
        )
    if not isinstance(tree, ScoredDraftTree):
        raise ValueError(
            f"{name} has no confidences: route needs a ScoredDraftTree (from draft_topk_tree or draft_dynatree)"
        )
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


# ----- calibrated routing ------------------------------------------------------------------------------
#: default bin edges over a node's draft probability q: [0, .1), [.1, .2), ..., [.9, 1] (q = 1 in the top bin)
CALIBRATION_EDGES: tuple[float, ...] = tuple(i / 10 for i in range(11))


@dataclass(frozen=True)
class RouteCalibration:
    """Per head, per bin of the draft probability ``q`` of a node's token: how often such a node was
    *offered* (its parent's path equals the committed text and the committed block reaches its depth) and
    how often it *matched* (its token is the next committed token). ``edges``: the ``nbins + 1`` bin edges,
    from 0 to 1; ``offers[h][j]``, ``matches[h][j]`` for head ``h + 1`` and bin ``j``.
    """

    edges: tuple[float, ...] = CALIBRATION_EDGES
    offers: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())
    matches: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())

    def __post_init__(self) -> None:
        edges = tuple(float(e) for e in self.edges)
        if len(edges) < 2 or edges[0] != 0.0 or edges[-1] != 1.0 or any(
                not lo < hi for lo, hi in zip(edges, edges[1:])):
            raise ValueError(f"edges must increase strictly from 0 to 1, got edges={self.edges!r}")
        nbins = len(edges) - 1
        offers = self.offers if self.offers != ((), ()) else ((0,) * nbins, (0,) * nbins)
        matches = self.matches if self.matches != ((), ()) else ((0,) * nbins, (0,) * nbins)
        for name, counts in (("offers", offers), ("matches", matches)):
            if len(counts) != 2 or any(len(row) != nbins for row in counts) or any(
                    isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 0
                    for row in counts for c in row):
                raise ValueError(f"{name} must hold two rows of {nbins} integers >= 0 (one per head), "
                                 f"got {name}={counts!r}")
        for h in range(2):
            if any(m > o for m, o in zip(matches[h], offers[h])):
                raise ValueError(f"matches={matches!r} exceeds offers={offers!r} for head {h + 1}")
        object.__setattr__(self, "edges", edges)
        object.__setattr__(self, "offers", tuple(tuple(int(c) for c in row) for row in offers))
        object.__setattr__(self, "matches", tuple(tuple(int(c) for c in row) for row in matches))

    @property
    def num_bins(self) -> int:
        return len(self.edges) - 1

    def acceptance(self, head: int, bin_index: int) -> float:
        """Laplace estimate ``(matches + 1) / (offers + 2)`` of P(match | offered) in one head's bin."""
        return (self.matches[head - 1][bin_index] + 1) / (self.offers[head - 1][bin_index] + 2)


def calibration_bin(q: Any, edges: Sequence[float] = CALIBRATION_EDGES) -> int:
    """The bin ``j`` with ``edges[j] <= q < edges[j + 1]`` (q = 1 in the top bin), for ``q`` in (0, 1].

    ``q`` is compared as a float64 (an exact ``Fraction(1, 10)`` lands in the bin starting at ``0.1``), as
    the engine compares its float64 ratios of float32 confidences."""
    if not 0 < q <= 1:
        raise ValueError(f"q must lie in (0, 1], got q={q!r}")
    value = float(q)
    return sum(1 for e in edges[1:-1] if value >= e)


def _scored(tree: Any, name: str) -> ScoredDraftTree:
    mean_confidence(tree, name)  # the same refusals as route: sampled drafts, trees without confidences
    assert isinstance(tree, ScoredDraftTree)
    return tree


def node_bins(tree: ScoredDraftTree, edges: Sequence[float] = CALIBRATION_EDGES) -> tuple[int, ...]:
    """Per node the bin of its own draft probability ``q_i = c_i / c_parent`` (root: -1)."""
    c = tree.confidences
    return (-1,) + tuple(calibration_bin(c[i] / c[tree.parents[i]], edges) for i in range(1, tree.num_nodes))


def calibrated_confidences(tree: DraftTree, calibration: RouteCalibration, head: int,
                           name: str = "tree") -> tuple[float, ...]:
    """Per node the product over its path of its nodes' bin estimates (root 1.0): the calibrated chance
    that the target commits the node's whole path, had this tree been verified."""
    tree = _scored(tree, name)
    if not isinstance(calibration, RouteCalibration):
        raise ValueError(f"calibration must be a RouteCalibration, got {type(calibration).__name__}")
    if head not in (1, 2):
        raise ValueError(f"head must be 1 or 2, got head={head!r}")
    bins = node_bins(tree, calibration.edges)
    out = [1.0]
    for i in range(1, tree.num_nodes):
        out.append(out[tree.parents[i]] * calibration.acceptance(head, bins[i]))
    return tuple(out)


@dataclass(frozen=True)
class CalibratedRouteResult:
    """``head`` (1 or 2) chosen, its ``tree``, ``expected_accepted = (E_1, E_2)`` and each head's
    ``calibrated_confidences`` (per node, root 1.0)."""

    head: int
    tree: DraftTree
    expected_accepted: tuple[float, float]
    calibrated_confidences: tuple[tuple[float, ...], tuple[float, ...]]


def calibrated_route(tree_a: DraftTree, tree_b: DraftTree, calibration: RouteCalibration) -> CalibratedRouteResult:
    """Route on calibrated confidences: verify the head with the larger expected number of accepted tokens.

    Seed 000 scores a head by the mean of its raw confidences ``c_i`` (the drafter's own path probability).
    A drafter's probabilities are not the target's: a retrieval draft proposes with probability 1, so its
    ``mu = 1`` wins every step it has a match, whatever its real acceptance. Here each node's confidence is
    replaced by its *calibrated* path probability ``c~_i`` (:func:`calibrated_confidences`, learned from the
    committed text by :func:`update_calibration`), and the head score is ``E_h = sum_i c~_i`` over the draft
    nodes (root excluded). For a deterministic tree verified greedily or by NSS a node's path is accepted
    exactly when the committed tokens equal it, and the accepted path is one chain, so the accepted length
    is the number of nodes whose path is committed and ``E[a] = sum_i P(path_i committed)``: ``E_h`` is
    the calibrated estimate of the tree's expected accepted tokens, the quantity block efficiency counts.
    The seed's mean is not: it falls when a tree adds a deeper node (a chain ``0.6, 0.36`` has mean 0.48,
    one node at 0.55 has 0.55 though it accepts fewer tokens on average), so it prefers small, shallow trees.

    ``h* = 1`` if ``E_1 >= E_2`` (ties to head 1), else 2. With an empty calibration every bin estimates 1/2,
    so ``c~_i = 2^-depth(i)`` and the rule prefers the tree with more nodes near the root (a head with no
    draft node scores 0), ties to head 1: two full chains of the same depth tie, so head 1 drafts until the
    first committed block has been observed.

    **Lossless.** The choice is a function of the two drafts (deterministic functions of the committed
    text) and of the calibration (a function of past drafts and past committed text), all fixed before any
    target draw of this step; verifying a deterministic tree so chosen with greedy or NSS leaves the output
    law unchanged (greedy output stays equal to greedy decoding). Deterministic: no randomness.
    """
    conf_a = calibrated_confidences(tree_a, calibration, 1, "tree_a")
    conf_b = calibrated_confidences(tree_b, calibration, 2, "tree_b")
    e_a = sum(conf_a[1:], 0.0)
    e_b = sum(conf_b[1:], 0.0)
    head, tree = (1, tree_a) if e_a >= e_b else (2, tree_b)
    return CalibratedRouteResult(head=head, tree=tree, expected_accepted=(e_a, e_b),
                                 calibrated_confidences=(conf_a, conf_b))


def head_observations(tree: DraftTree, committed: Sequence[int], edges: Sequence[float] = CALIBRATION_EDGES,
                      name: str = "tree") -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(offers, matches)`` per bin that one head's tree shows against the step's committed block.

    ``committed``: the tokens committed after the root (the accepted draft tokens, then the correction or
    bonus token), length ``a + 1``. A node at depth ``d`` is *offered* when ``d <= len(committed)`` and its
    parent's path equals ``committed[:d - 1]``; it *matches* when also its token is ``committed[d - 1]``.
    Nodes deeper than the block, or below a node off the committed text, are unknown and not counted. This
    needs only the committed text, so it holds for a head whose tree was not verified: at T > 0 the next
    committed token at a reached context is a draw of the target's law there (NSS on a deterministic tree
    samples p at every visited node), so P(match | offered) is the target probability of the node's token,
    the chance that NSS accepts it, whichever tree was verified.
    """
    tree = _scored(tree, name)
    block = [int(t) for t in committed]
    if not block or any(t < 0 for t in block):
        raise ValueError(f"committed must hold at least one token id >= 0, got committed={list(committed)!r}")
    bins = node_bins(tree, edges)
    nbins = len(edges) - 1
    offers, matches = [0] * nbins, [0] * nbins
    on_text = [True] + [False] * (tree.num_nodes - 1)  # node's path equals the committed prefix of its depth
    for i in range(1, tree.num_nodes):
        d = tree.depths[i]
        if d > len(block) or not on_text[tree.parents[i]]:
            continue
        offers[bins[i]] += 1
        if tree.tokens[i] == block[d - 1]:
            matches[bins[i]] += 1
            on_text[i] = True
    return tuple(offers), tuple(matches)


def update_calibration(calibration: RouteCalibration, tree_a: DraftTree, tree_b: DraftTree,
                       committed: Sequence[int]) -> RouteCalibration:
    """The calibration after one step: both heads' :func:`head_observations` added, whichever tree was
    verified."""
    if not isinstance(calibration, RouteCalibration):
        raise ValueError(f"calibration must be a RouteCalibration, got {type(calibration).__name__}")
    seen = [head_observations(t, committed, calibration.edges, n) for t, n in ((tree_a, "tree_a"), (tree_b, "tree_b"))]
    offers = tuple(tuple(o + n for o, n in zip(calibration.offers[h], seen[h][0])) for h in range(2))
    matches = tuple(tuple(m + n for m, n in zip(calibration.matches[h], seen[h][1])) for h in range(2))
    return RouteCalibration(calibration.edges, (offers[0], offers[1]), (matches[0], matches[1]))


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
