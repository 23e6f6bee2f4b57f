"""Calibrated routing of dual drafts (docs/algorithms.md section 8): verify the head whose deterministic tree
has the larger expected accepted length, under a per-head calibration of a confidence feature to acceptance.

Seed 000 (:func:`spec_ref.dual.route`) scores a head by the mean of its own path probabilities. Those are the
drafter's beliefs, not the target's acceptance: a retrieval draft proposes with probability 1 wherever its
match has one follower, whatever the match is worth. Here every node gets a *class* from a per-head feature,

* ``"probability"`` (model heads): the bin of the node's own draft probability ``q_i = c_i / c_parent``
  (:data:`CALIBRATION_EDGES`);
* ``"match-length"`` (retrieval heads): the length ``m`` of the suffix match whose next-token law proposed
  the node (the context ending at its parent), in :data:`MATCH_LENGTH_EDGES` classes, times whether the
  match had a single follower (``q_i = 1``): a long grounded match and a short chance one no longer share a
  bin,

and the calibration estimates P(match | offered, class) per head and class from two sources:

* a **prior table** ``r0[h][k]`` (:func:`prior_rates` of counts observed offline on calibration prompts
  disjoint from the evaluation prompts; spec_fast ships one per committed drafter), so the first steps are
  not blind; without one every class starts at 1/2;
* the **committed text of this generation** (:func:`update_calibration`): per class, how often a node was
  *offered* (its parent's path is the committed prefix and the committed block reaches its depth) and how
  often it *matched* (its token is the next committed token), counted for both heads whether or not their
  tree was verified (the test needs only the committed text).

The estimate of head ``h``, class ``k`` is a Beta posterior mean whose prior mean is the table's rate
rescaled by this generation's level of the head (calibration-in-the-large):

    f_h = (M_h + c) / (sum_k o_{h,k} r0_{h,k} + c)         (observed over expected matches, c = level_weight)
    a_{h,k} = (m_{h,k} + w * min(1, f_h * r0_{h,k})) / (o_{h,k} + w)        (w = prior_weight)

``f_h`` is shared by all of a head's classes, so one call's evidence moves every class at once: a drafter
whose acceptance differs from the table's on this kind of text (a model head on a passage it should copy)
is re-levelled within a few steps, while the class counts refine the shape. With an empty calibration
``f_h = 1`` and ``a = r0``. A node's calibrated confidence is the product of ``a`` along its path; the head
score is ``E_h = sum_i`` of these over its draft nodes: for a deterministic tree verified greedily or by
NSS a node's path is accepted exactly when the committed tokens equal it, so ``E[a] = sum_i P(path_i
committed)`` and ``E_h`` is the calibrated expected accepted length. ``h* = 1`` if ``E_1 >= E_2``.

**Lossless.** The choice is a function of the two drafts (deterministic functions of the committed text),
of the match lengths (functions of the text) and of the calibration (the fixed table, past drafts and past
committed text), all fixed before any target draw of the step; verifying a deterministic tree so chosen with
greedy or NSS leaves the output law unchanged (proofs/T06_deterministic_trees_and_routing.md). At T > 0 the
test is fair: the token committed at a reached context is a draw of G(p) there whichever tree was verified,
so P(match | offered) is the target probability of the node's token, the chance NSS accepts it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from spec_ref.drafting import ScoredDraftTree
from spec_ref.tree import DraftTree

__all__ = [
    "FEATURES",
    "CALIBRATION_EDGES",
    "MATCH_LENGTH_EDGES",
    "PRIOR_WEIGHT",
    "LEVEL_WEIGHT",
    "num_classes",
    "calibration_bin",
    "match_class",
    "prior_rates",
    "check_routable",
    "RouteCalibration",
    "node_bins",
    "node_classes",
    "calibrated_confidences",
    "CalibratedRouteResult",
    "calibrated_route",
    "head_observations",
    "update_calibration",
]

#: what a head's nodes are classed by: their own draft probability, or the retrieval match behind them
FEATURES = ("probability", "match-length")
#: bin edges over a node's draft probability q: [0, .1), [.1, .2), ..., [.9, 1] (q = 1 in the top bin)
CALIBRATION_EDGES: tuple[float, ...] = tuple(i / 10 for i in range(11))
#: match-length class edges: [0], [1], [2], [3], [4, 5], [6, 7], [8, 11], [12, ...); acceptance of a
#: retrieval proposal rises with the match length, finely at first (measured: docs/algorithms.md section 8)
MATCH_LENGTH_EDGES: tuple[int, ...] = (0, 1, 2, 3, 4, 6, 8, 12)
#: pseudo-offers of the prior per class (w), and of the head's level factor (c); chosen by leave-one-prompt-
#: out simulation on the calibration prompts (docs/algorithms.md section 8), where 2-16 did alike
PRIOR_WEIGHT = 4.0
LEVEL_WEIGHT = 2.0


def num_classes(feature: str, edges: Sequence[float] = CALIBRATION_EDGES) -> int:
    """Classes of a head with ``feature``: ``len(edges) - 1`` probability bins, or two per match-length class."""
    if feature not in FEATURES:
        raise ValueError(f"feature must be one of {FEATURES}, got feature={feature!r}")
    return len(edges) - 1 if feature == "probability" else 2 * len(MATCH_LENGTH_EDGES)


def calibration_bin(q: Any, edges: Sequence[float] = CALIBRATION_EDGES) -> int:
    """The bin ``j`` with ``edges[j] <= q < edges[j + 1]`` (q = 1 in the top bin), for ``q`` in (0, 1].

    ``q`` is compared as a float64 (an exact ``Fraction(1, 10)`` lands in the bin starting at ``0.1``), as
    the engine compares its float64 ratios of float32 confidences."""
    if not 0 < q <= 1:
        raise ValueError(f"q must lie in (0, 1], got q={q!r}")
    value = float(q)
    return sum(1 for e in edges[1:-1] if value >= e)


def match_class(match_length: int, q: Any) -> int:
    """``2 * l + [q == 1]``: ``l`` the :data:`MATCH_LENGTH_EDGES` class of ``match_length``; a match with one
    follower (``q = 1``) is worth more than one of the same length whose followers disagree."""
    if isinstance(match_length, bool) or not isinstance(match_length, (int, np.integer)) or match_length < 0:
        raise ValueError(f"match_length must be an integer >= 0, got match_length={match_length!r}")
    if not 0 < q <= 1:
        raise ValueError(f"q must lie in (0, 1], got q={q!r}")
    level = sum(1 for e in MATCH_LENGTH_EDGES[1:] if match_length >= e)
    return 2 * level + (1 if float(q) >= 1.0 else 0)


def prior_rates(offers: Sequence[int], matches: Sequence[int]) -> tuple[float, ...]:
    """Per class the Laplace rate ``(matches + 1) / (offers + 2)`` of offline counts: a prior table row."""
    o, m = list(offers), list(matches)
    if len(o) != len(m) or any(isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 0 for x in o + m):
        raise ValueError(f"offers and matches must be equal-length rows of integers >= 0, got offers={o!r}, "
                         f"matches={m!r}")
    if any(b > a for a, b in zip(o, m)):
        raise ValueError(f"matches={m!r} exceeds offers={o!r}")
    return tuple((b + 1) / (a + 2) for a, b in zip(o, m))


def check_routable(tree: Any, name: str) -> ScoredDraftTree:
    """``tree`` as a :class:`ScoredDraftTree`, refusing what routing cannot use: sampled trees (choosing a
    tree after seeing its draws breaks the i.i.d. draft law) and trees without confidences."""
    if not isinstance(tree, DraftTree):
        raise ValueError(f"{name} must be a spec_ref.DraftTree, got {type(tree).__name__}")
    if not tree.deterministic:
        raise ValueError(
            f"{name}.process={tree.process!r}: routing on sampled drafts is lossy (choosing a tree after seeing "
            "its draws breaks the i.i.d. draft law); route deterministic top-k trees and verify with NSS or greedy"
        )
    if not isinstance(tree, ScoredDraftTree):
        raise ValueError(
            f"{name} has no confidences: route needs a ScoredDraftTree (from draft_topk_tree or draft_dynatree)"
        )
    return tree


def _counts(name: str, rows: Any, sizes: tuple[int, int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if len(rows) != 2 or any(len(row) != n for row, n in zip(rows, sizes)) or any(
            isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 0 for row in rows for c in row):
        raise ValueError(f"{name} must hold two rows of {sizes[0]} and {sizes[1]} integers >= 0 (one per head), "
                         f"got {name}={rows!r}")
    return (tuple(int(c) for c in rows[0]), tuple(int(c) for c in rows[1]))


@dataclass(frozen=True)
class RouteCalibration:
    """Per head ``h + 1`` and class ``k`` (module docstring): ``offers[h][k]`` and ``matches[h][k]`` counted
    in this generation; ``features[h]`` (:data:`FEATURES`); ``prior[h][k]``, the prior table's acceptance
    rate in (0, 1] (empty row: 1/2 everywhere); ``edges``: the probability bins' ``nbins + 1`` edges from 0
    to 1; ``prior_weight`` (w) and ``level_weight`` (c) > 0. Empty count rows mean zeros."""

    edges: tuple[float, ...] = CALIBRATION_EDGES
    offers: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())
    matches: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())
    features: tuple[str, str] = ("probability", "probability")
    prior: tuple[tuple[float, ...], tuple[float, ...]] = ((), ())
    prior_weight: float = PRIOR_WEIGHT
    level_weight: float = LEVEL_WEIGHT

    def __post_init__(self) -> None:
        edges = tuple(float(e) for e in self.edges)
        if len(edges) < 2 or edges[0] != 0.0 or edges[-1] != 1.0 or any(
                not lo < hi for lo, hi in zip(edges, edges[1:])):
            raise ValueError(f"edges must increase strictly from 0 to 1, got edges={self.edges!r}")
        if len(self.features) != 2 or any(f not in FEATURES for f in self.features):
            raise ValueError(f"features must be two of {FEATURES} (one per head), got features={self.features!r}")
        sizes = (num_classes(self.features[0], edges), num_classes(self.features[1], edges))
        offers = _counts("offers", self.offers if self.offers != ((), ()) else tuple((0,) * n for n in sizes), sizes)
        matches = _counts("matches", self.matches if self.matches != ((), ()) else tuple((0,) * n for n in sizes),
                          sizes)
        for h in range(2):
            if any(m > o for m, o in zip(matches[h], offers[h])):
                raise ValueError(f"matches={matches!r} exceeds offers={offers!r} for head {h + 1}")
        prior = tuple(tuple(float(r) for r in row) if len(row) else (0.5,) * n for row, n in zip(self.prior, sizes))
        if len(self.prior) != 2 or any(len(row) != n for row, n in zip(prior, sizes)) or any(
                not 0.0 < r <= 1.0 for row in prior for r in row):
            raise ValueError(f"prior must hold two rows of {sizes[0]} and {sizes[1]} rates in (0, 1] (one per "
                             f"head, empty for 1/2), got prior={self.prior!r}")
        for name in ("prior_weight", "level_weight"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ValueError(f"{name} must be a finite number > 0, got {name}={value!r}")
            object.__setattr__(self, name, float(value))
        object.__setattr__(self, "edges", edges)
        object.__setattr__(self, "features", tuple(self.features))
        object.__setattr__(self, "offers", offers)
        object.__setattr__(self, "matches", matches)
        object.__setattr__(self, "prior", prior)

    @property
    def num_bins(self) -> int:
        """Probability bins (``len(edges) - 1``)."""
        return len(self.edges) - 1

    def num_classes(self, head: int) -> int:
        return len(self.offers[head - 1])

    def level(self, head: int) -> float:
        """``f_h = (M_h + c) / (sum_k o_k r0_k + c)``: this generation's matches over those the table expects
        for the same offers (summed in class order)."""
        expected = 0.0
        for o, r in zip(self.offers[head - 1], self.prior[head - 1]):
            expected += o * r
        return (sum(self.matches[head - 1]) + self.level_weight) / (expected + self.level_weight)

    def acceptance(self, head: int, cls: int) -> float:
        """``(m + w * min(1, f_h * r0)) / (o + w)``: the estimate of P(match | offered) in one head's class."""
        prior_mean = min(1.0, self.level(head) * self.prior[head - 1][cls])
        return (self.matches[head - 1][cls] + self.prior_weight * prior_mean) / (
            self.offers[head - 1][cls] + self.prior_weight)


def node_bins(tree: ScoredDraftTree, edges: Sequence[float] = CALIBRATION_EDGES) -> tuple[int, ...]:
    """Per node the bin of its own draft probability ``q_i = c_i / c_parent`` (root: -1)."""
    c = tree.confidences
    return (-1,) + tuple(calibration_bin(c[i] / c[tree.parents[i]], edges) for i in range(1, tree.num_nodes))


def node_classes(tree: DraftTree, feature: str = "probability", match_lengths: Sequence[int] | None = None,
                 edges: Sequence[float] = CALIBRATION_EDGES, name: str = "tree") -> tuple[int, ...]:
    """Per node its calibration class (root: -1): :func:`node_bins` for ``"probability"``; for
    ``"match-length"`` :func:`match_class` of ``match_lengths[i]`` (the match length of the law that proposed
    node ``i``, at the context ending at its parent; one entry per node, the root's ignored) and ``q_i``."""
    tree = check_routable(tree, name)
    if feature not in FEATURES:
        raise ValueError(f"feature must be one of {FEATURES}, got feature={feature!r}")
    if feature == "probability":
        return node_bins(tree, edges)
    if match_lengths is None or len(match_lengths) != tree.num_nodes:
        raise ValueError(f"match_lengths must give one match length per node of {name} ({tree.num_nodes}) for "
                         f"feature 'match-length', got match_lengths={match_lengths!r}")
    c = tree.confidences
    return (-1,) + tuple(match_class(match_lengths[i], c[i] / c[tree.parents[i]]) for i in range(1, tree.num_nodes))


def calibrated_confidences(tree: DraftTree, calibration: RouteCalibration, head: int, name: str = "tree",
                           match_lengths: Sequence[int] | None = None) -> tuple[float, ...]:
    """Per node the product over its path of its nodes' class estimates (root 1.0): the calibrated chance
    that the target commits the node's whole path, had this tree been verified."""
    if not isinstance(calibration, RouteCalibration):
        raise ValueError(f"calibration must be a RouteCalibration, got {type(calibration).__name__}")
    if head not in (1, 2):
        raise ValueError(f"head must be 1 or 2, got head={head!r}")
    tree = check_routable(tree, name)
    classes = node_classes(tree, calibration.features[head - 1], match_lengths, calibration.edges, name)
    estimate = [calibration.acceptance(head, k) for k in range(calibration.num_classes(head))]
    out = [1.0]
    for i in range(1, tree.num_nodes):
        out.append(out[tree.parents[i]] * estimate[classes[i]])
    return tuple(out)


@dataclass(frozen=True)
class CalibratedRouteResult:
    """``head`` (1 or 2) chosen, its ``tree``, ``expected_accepted = (E_1, E_2)`` and each head's
    ``calibrated_confidences`` (per node, root 1.0)."""

    head: int
    tree: DraftTree
    expected_accepted: tuple[float, float]
    calibrated_confidences: tuple[tuple[float, ...], tuple[float, ...]]


_NO_LENGTHS: tuple[None, None] = (None, None)


def calibrated_route(tree_a: DraftTree, tree_b: DraftTree, calibration: RouteCalibration,
                     match_lengths: tuple[Sequence[int] | None, Sequence[int] | None] = _NO_LENGTHS
                     ) -> CalibratedRouteResult:
    """Verify the head with the larger calibrated expected accepted length ``E_h`` (module docstring);
    ``h* = 1`` if ``E_1 >= E_2`` (ties to head 1), else 2. ``match_lengths[h]``: per node of head ``h + 1``'s
    tree, needed when its feature is ``"match-length"``.

    The seed's mean confidence is not the right score even when calibrated: it falls when a tree adds a
    deeper node (a chain ``0.6, 0.36`` has mean 0.48, one node at 0.55 has 0.55 though it accepts fewer
    tokens on average), so it prefers small, shallow trees. A head with no draft node scores 0.
    Deterministic: no randomness.
    """
    conf_a = calibrated_confidences(tree_a, calibration, 1, "tree_a", match_lengths[0])
    conf_b = calibrated_confidences(tree_b, calibration, 2, "tree_b", match_lengths[1])
    e_a = sum(conf_a[1:], 0.0)
    e_b = sum(conf_b[1:], 0.0)
    head, tree = (1, tree_a) if e_a >= e_b else (2, tree_b)
    return CalibratedRouteResult(head=head, tree=tree, expected_accepted=(e_a, e_b),
                                 calibrated_confidences=(conf_a, conf_b))


def head_observations(tree: DraftTree, committed: Sequence[int], edges: Sequence[float] = CALIBRATION_EDGES,
                      name: str = "tree", feature: str = "probability", match_lengths: Sequence[int] | None = None
                      ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(offers, matches)`` per class that one head's tree shows against the step's committed block.

    ``committed``: the tokens committed after the root (the accepted draft tokens, then the correction or
    bonus token), length ``a + 1``. A node at depth ``d`` is *offered* when ``d <= len(committed)`` and its
    parent's path equals ``committed[:d - 1]``; it *matches* when also its token is ``committed[d - 1]``.
    Nodes deeper than the block, or below a node off the committed text, are unknown and not counted. This
    needs only the committed text, so it holds for a head whose tree was not verified.
    """
    tree = check_routable(tree, name)
    block = [int(t) for t in committed]
    if not block or any(t < 0 for t in block):
        raise ValueError(f"committed must hold at least one token id >= 0, got committed={list(committed)!r}")
    classes = node_classes(tree, feature, match_lengths, edges, name)
    size = num_classes(feature, edges)
    offers, matches = [0] * size, [0] * size
    on_text = [True] + [False] * (tree.num_nodes - 1)  # node's path equals the committed prefix of its depth
    for i in range(1, tree.num_nodes):
        d = tree.depths[i]
        if d > len(block) or not on_text[tree.parents[i]]:
            continue
        offers[classes[i]] += 1
        if tree.tokens[i] == block[d - 1]:
            matches[classes[i]] += 1
            on_text[i] = True
    return tuple(offers), tuple(matches)


def update_calibration(calibration: RouteCalibration, tree_a: DraftTree, tree_b: DraftTree,
                       committed: Sequence[int],
                       match_lengths: tuple[Sequence[int] | None, Sequence[int] | None] = _NO_LENGTHS
                       ) -> RouteCalibration:
    """The calibration after one step: both heads' :func:`head_observations` added, whichever tree was
    verified (the prior table and weights unchanged)."""
    if not isinstance(calibration, RouteCalibration):
        raise ValueError(f"calibration must be a RouteCalibration, got {type(calibration).__name__}")
    seen = [head_observations(t, committed, calibration.edges, n, f, lengths)
            for t, n, f, lengths in zip((tree_a, tree_b), ("tree_a", "tree_b"), calibration.features, match_lengths)]
    offers = tuple(tuple(o + n for o, n in zip(calibration.offers[h], seen[h][0])) for h in range(2))
    matches = tuple(tuple(m + n for m, n in zip(calibration.matches[h], seen[h][1])) for h in range(2))
    return RouteCalibration(calibration.edges, (offers[0], offers[1]), (matches[0], matches[1]),
                            calibration.features, calibration.prior, calibration.prior_weight,
                            calibration.level_weight)
