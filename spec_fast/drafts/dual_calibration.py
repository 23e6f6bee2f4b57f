"""Calibrated routing's bookkeeping, batched: the twin of :mod:`spec_ref.dual_calibration` (docs/algorithms.md
section 8). The route itself (:func:`spec_fast.drafts.dual.calibrated_route`) picks a tree with these.

Per row and head, a :class:`RouteCalibration` counts, per class of a node's confidence feature, how often a
node was offered and matched the committed text; the engine keeps one per ``generate`` call in its
``DecodeState``, starting from the prior table of :func:`load_route_prior` (``weights/route_prior.json``,
written by ``scripts/route_prior.py``). Model heads class a node by its draft probability bin; a
:class:`~spec_fast.drafts.retrieval.RetrievalDrafter` by the match length behind the node
(:func:`node_match_lengths`, read from the drafter's state, no extra pass) and whether the match had one
follower. Everything here is device-side except :func:`node_match_lengths`, which builds one small tensor
from the retrieval drafter's host-side lists.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import torch

from spec_fast.drafts.batch import DraftBatch
from spec_fast.drafts.model import Drafter
from spec_fast.drafts.retrieval import RetrievalDrafter
from spec_ref import dual_calibration as ref

__all__ = ["RoutePrior", "ROUTE_PRIOR_PATH", "load_route_prior", "head_feature", "node_match_lengths",
           "RouteCalibration", "node_bins", "node_classes", "calibrated_confidences", "expected_accepted",
           "committed_block", "head_observations", "update_calibration"]

#: the prior tables of the committed drafters (scripts/route_prior.py)
ROUTE_PRIOR_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "weights",
                                "route_prior.json")


@dataclass(frozen=True)
class RoutePrior:
    """One drafter's prior table: its ``feature`` and per class the offline acceptance ``rates``
    (:func:`spec_ref.dual_calibration.prior_rates` of the stored counts)."""

    feature: str
    rates: tuple[float, ...]

    def __post_init__(self) -> None:
        size = ref.num_classes(self.feature)
        if len(self.rates) != size or not all(0.0 < r <= 1.0 for r in self.rates):
            raise ValueError(f"rates must hold {size} rates in (0, 1] for feature {self.feature!r}, "
                             f"got rates={self.rates!r}")


def load_route_prior(name: str, path: str | None = None) -> RoutePrior | None:
    """The prior table of the committed drafter ``name`` (``rnn``, ``eagle``, ``retrieval``, ...), or None
    when the file holds none for it (the calibration then starts at 1/2 per class)."""
    with open(path or ROUTE_PRIOR_PATH, encoding="utf-8") as handle:
        data = json.load(handle)
    entry = data.get("drafters", {}).get(name)
    if entry is None:
        return None
    return RoutePrior(str(entry["feature"]), ref.prior_rates(entry["offers"], entry["matches"]))


def head_feature(drafter: Drafter) -> str:
    """``"match-length"`` for a retrieval drafter (its proposals are point masses whose worth is the match
    behind them), ``"probability"`` for every other drafter."""
    return "match-length" if isinstance(drafter, RetrievalDrafter) else "probability"


def node_match_lengths(drafter: Drafter, state: Any, draft: DraftBatch) -> torch.Tensor | None:
    """``[B, N]`` long for a retrieval drafter, right after it drafted ``draft``: per node the match length
    of the law that proposed it, i.e. at its parent's block entry (-1 on the root and invalid slots); None
    for other drafters. Read from ``state.match_lengths`` before the commit clears it."""
    if not isinstance(drafter, RetrievalDrafter):
        return None
    rows = state.match_lengths
    width = max(1, max(len(r) for r in rows))
    table = torch.tensor([list(r) + [0] * (width - len(r)) for r in rows], dtype=torch.long,
                         device=draft.entries.device)
    tree = draft.tree
    parent_entry = torch.gather(draft.entries, 1, tree.parents.clamp(min=0))
    lengths = torch.gather(table, 1, parent_entry.clamp(min=0))
    known = tree.valid & (tree.parents >= 0) & (parent_entry >= 0)
    return torch.where(known, lengths, torch.full_like(lengths, -1))


@dataclass(frozen=True, eq=False)
class RouteCalibration:
    """Per row and head (:class:`spec_ref.dual_calibration.RouteCalibration`): ``offers [B, 2, C]`` and
    ``matches [B, 2, C]`` long counts, ``C`` the larger head's class count (the other's extra classes stay
    0); ``prior [2, C]`` float64 table rates (1/2 on padding); ``edges [nbins + 1]`` float64 probability bin
    edges; ``features`` and the weights as in the reference."""

    edges: torch.Tensor
    offers: torch.Tensor
    matches: torch.Tensor
    prior: torch.Tensor
    features: tuple[str, str] = ("probability", "probability")
    prior_weight: float = ref.PRIOR_WEIGHT
    level_weight: float = ref.LEVEL_WEIGHT

    @staticmethod
    def start(batch_size: int, device: torch.device, reference: ref.RouteCalibration | None = None
              ) -> RouteCalibration:
        """Every row at ``reference`` (default: no observations, no table: 1/2 per class)."""
        reference = reference if reference is not None else ref.RouteCalibration()
        width = max(len(row) for row in reference.offers)

        def padded(rows: tuple[tuple[Any, ...], tuple[Any, ...]], value: float, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor([list(r) + [value] * (width - len(r)) for r in rows], dtype=dtype, device=device)

        counts = [padded(c, 0, torch.long).unsqueeze(0).repeat(batch_size, 1, 1)
                  for c in (reference.offers, reference.matches)]
        return RouteCalibration(torch.tensor(reference.edges, dtype=torch.float64, device=device), counts[0],
                                counts[1], padded(reference.prior, 0.5, torch.float64), reference.features,
                                reference.prior_weight, reference.level_weight)

    @staticmethod
    def empty(batch_size: int, device: torch.device) -> RouteCalibration:
        """No observations, no table, probability features for both heads."""
        return RouteCalibration.start(batch_size, device)

    def acceptance(self, head: int) -> torch.Tensor:
        """``[B, C]`` float64: ``(m + w min(1, f_h r0)) / (o + w)`` per class, ``f_h = (M + c) / (sum_k o_k
        r0_k + c)`` per row (:meth:`spec_ref.dual_calibration.RouteCalibration.acceptance`)."""
        offers, matches = self.offers[:, head - 1].double(), self.matches[:, head - 1].double()
        prior = self.prior[head - 1].unsqueeze(0)
        c = self.level_weight
        level = (matches.sum(dim=1, keepdim=True) + c) / ((offers * prior).sum(dim=1, keepdim=True) + c)
        return (matches + self.prior_weight * torch.clamp(level * prior, max=1.0)) / (offers + self.prior_weight)


def node_bins(draft: DraftBatch, edges: torch.Tensor) -> torch.Tensor:
    """``[B, N]`` long: the bin of each node's own draft probability ``q_i = c_i / c_parent`` (float64 ratio
    of the float32 confidences, as :func:`spec_ref.dual_calibration.node_bins` on the same values); 0 on the
    root and on invalid slots."""
    q = _own_probability(draft)
    bins = (q.unsqueeze(-1) >= edges[1:-1]).sum(dim=-1)
    nodes = draft.tree.valid & (draft.tree.parents >= 0)
    return torch.where(nodes, bins, torch.zeros_like(bins))


def _own_probability(draft: DraftBatch) -> torch.Tensor:
    c = draft.confidences.double()
    return c / torch.gather(c, 1, draft.tree.parents.clamp(min=0))


def node_classes(draft: DraftBatch, calibration: RouteCalibration, head: int,
                 match_lengths: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, N]`` long: each node's class under head ``head``'s feature
    (:func:`spec_ref.dual_calibration.node_classes`); 0 on the root and on invalid slots."""
    if calibration.features[head - 1] == "probability":
        return node_bins(draft, calibration.edges)
    if match_lengths is None:
        raise ValueError(f"head {head} is classed by match length: pass its node_match_lengths")
    edges = torch.tensor(ref.MATCH_LENGTH_EDGES[1:], dtype=torch.long, device=match_lengths.device)
    level = (match_lengths.unsqueeze(-1) >= edges).sum(dim=-1)
    classes = 2 * level + (_own_probability(draft) >= 1.0).long()
    nodes = draft.tree.valid & (draft.tree.parents >= 0)
    return torch.where(nodes, classes, torch.zeros_like(classes))


def calibrated_confidences(draft: DraftBatch, calibration: RouteCalibration, head: int,
                           match_lengths: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, N]`` float64: per node the product over its path of its classes' estimates (root 1, invalid
    slots 0; :func:`spec_ref.dual_calibration.calibrated_confidences`), root to node in that order."""
    tree = draft.tree
    classes = node_classes(draft, calibration, head, match_lengths)
    factor = torch.gather(calibration.acceptance(head), 1, classes)
    conf = torch.ones_like(factor)
    parents = tree.parents.clamp(min=0)
    for depth in range(1, draft.max_depth + 1):
        conf = torch.where(tree.depths == depth, torch.gather(conf, 1, parents) * factor, conf)
    return torch.where(tree.valid, conf, torch.zeros_like(conf))


def expected_accepted(draft: DraftBatch, calibration: RouteCalibration, head: int,
                      match_lengths: torch.Tensor | None = None) -> torch.Tensor:
    """``[B]`` float64: ``E_h``, the sum of the calibrated confidences of the head's draft nodes."""
    return calibrated_confidences(draft, calibration, head, match_lengths)[:, 1:].sum(dim=1)


def committed_block(tokens: torch.Tensor, accepted_slots: torch.Tensor, accepted_depth: torch.Tensor,
                    next_token: torch.Tensor) -> torch.Tensor:
    """``[B, D + 1]`` long: the tokens committed after the root, -1 padded: the accepted draft tokens
    ``tokens [B, N]`` at ``accepted_slots [B, D + 1]`` (root first), then ``next_token [B]`` at index
    ``accepted_depth [B]``."""
    width = accepted_slots.shape[1]
    drafted = torch.gather(tokens, 1, accepted_slots[:, 1:].clamp(min=0))  # [B, D]
    index = torch.arange(width, device=tokens.device).unsqueeze(0)
    depth = accepted_depth.unsqueeze(1)
    padded = torch.cat([drafted, torch.full_like(drafted[:, :1], -1)], dim=1)
    return torch.where(index < depth, padded, torch.where(index == depth, next_token.unsqueeze(1), -1))


def head_observations(draft: DraftBatch, committed: torch.Tensor, calibration: RouteCalibration, head: int,
                      match_lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(offers, matches)`` ``[B, C]`` long that head ``head``'s tree shows against ``committed [B, L]``
    (-1 padded; :func:`spec_ref.dual_calibration.head_observations`): a node at depth ``d`` is offered when
    the block reaches ``d`` and its parent's path is the committed prefix, and matches when its token is
    the committed token at ``d``."""
    tree = draft.tree
    length = (committed >= 0).sum(dim=1, keepdim=True)  # [B, 1]
    at_depth = torch.gather(committed, 1, (tree.depths - 1).clamp(min=0, max=committed.shape[1] - 1))
    parents = tree.parents.clamp(min=0)
    on_text = torch.zeros_like(tree.valid)
    on_text[:, 0] = True
    offered = torch.zeros_like(tree.valid)
    for depth in range(1, draft.max_depth + 1):
        level = tree.valid & (tree.depths == depth) & (length >= depth) & torch.gather(on_text, 1, parents)
        offered = offered | level
        on_text = on_text | (level & (tree.tokens == at_depth))
    on_text[:, 0] = False
    classes = node_classes(draft, calibration, head, match_lengths)
    one_hot = torch.nn.functional.one_hot(classes, calibration.offers.shape[-1])  # [B, N, C]
    return ((one_hot * offered.unsqueeze(-1)).sum(dim=1), (one_hot * on_text.unsqueeze(-1)).sum(dim=1))


def update_calibration(calibration: RouteCalibration, first: DraftBatch, second: DraftBatch,
                       committed: torch.Tensor, active: torch.Tensor,
                       match_lengths: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)
                       ) -> RouteCalibration:
    """Both heads' observations added on the ``active [B]`` rows
    (:func:`spec_ref.dual_calibration.update_calibration`)."""
    seen = [head_observations(d, committed, calibration, h + 1, match_lengths[h]) for h, d in enumerate((first, second))]
    keep = active.view(-1, 1, 1)
    offers = calibration.offers + torch.stack([seen[0][0], seen[1][0]], dim=1) * keep
    matches = calibration.matches + torch.stack([seen[0][1], seen[1][1]], dim=1) * keep
    return RouteCalibration(calibration.edges, offers, matches, calibration.prior, calibration.features,
                            calibration.prior_weight, calibration.level_weight)
