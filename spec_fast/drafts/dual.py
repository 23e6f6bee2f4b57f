"""Dual-draft decoding, batched: merged-tree verification (seed 001 (docs/papers.md)) and step-level routing (seed 000).
The twin of :mod:`spec_ref.dual`.

:class:`DualDrafter` pairs any two drafters (model, early exit, trained head, retrieval). Each step both
heads draft a *deterministic* tree from the same root (their own top-k tree, a chain being top-1 with a
budget of its depth), then

* ``mode="merge"``: :func:`merge_trees` joins them under the shared root with head 2's slots shifted by
  head 1's slot count (``phi(i) = n1 + i``), the two subtrees disjoint (block mask, depth positions,
  path matrix as :func:`spec_ref.dual.merge_trees`). At T = 0 one target pass verifies that tree and the
  greedy walk (:func:`spec_fast.verify.verify_greedy`) commits the longest accepted path over both
  subtrees, ties to head 1 (:func:`spec_ref.dual.verify_merged_greedy`). At T > 0 the target verifies the
  token-merged union (:func:`union_tree`, one node per context) with NSS: one target draw per visited
  node shared by every path (docs/algorithms.md section 8); picking the best of several sampled paths instead
  would be lossy.
* ``mode="route"``: :func:`route` scores each head by the mean confidence of its retained draft nodes
  (root excluded) and verifies only the winner's tree (ties to head 1): greedy at T = 0, NSS at T > 0.
* ``mode="route-calibrated"``: :func:`calibrated_route` (:func:`spec_ref.dual_calibration.calibrated_route`)
  scores each head by the expected accepted length of its tree under a per-row, per-head calibration of a
  confidence feature to acceptance (:class:`RouteCalibration`; model heads: draft probability bins, a
  retrieval head: the match length behind each node and whether the match had one follower), starting from
  the head's prior table (``priors``, :func:`load_route_prior`) and updated by :func:`observe_committed`
  from every committed block for both heads, verified or not. The calibration is per generation: it lives
  in the engine's ``DecodeState``, never on the drafter. The choice is fixed by the drafts, the text and
  the past before any target draw of the step, so it is lossless.

Both heads stay in sync with the committed text (seed 000 section 7): after every step each head keeps
the cache entries it holds for the accepted path and receives the rest of the committed tokens as pending
tokens before it drafts again; heads that read the verifier's hidden states receive them for the committed
entries whichever head won.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from spec_fast.drafts.model import Drafter
from spec_fast.drafts.batch import DraftBatch
from spec_fast.flat_tree import FlatTree
from spec_fast.tree_attention import extend_ancestors
from spec_fast.drafts.dual_calibration import (  # re-exported: the twin of spec_ref.dual_calibration
    RouteCalibration, RoutePrior, calibrated_confidences, committed_block, expected_accepted, head_feature,
    head_observations, load_route_prior, node_bins, node_classes, node_match_lengths, update_calibration,
)
from spec_ref import dual_calibration as ref_calibration

__all__ = ["DualDrafter", "DualDraft", "merge_trees", "union_tree", "route", "mean_confidence", "confidence_mean",
           "tree_layout",
           "DUAL_MODES", "RouteCalibration", "RoutePrior", "load_route_prior", "head_feature", "node_match_lengths",
           "node_bins", "node_classes", "calibrated_confidences", "expected_accepted", "calibrated_route",
           "select_heads",
           "committed_block", "head_observations", "update_calibration", "observe_committed"]

DUAL_MODES = ("merge", "route", "route-calibrated")


class DualDrafter(Drafter):
    """Two drafters drafting side by side (module docstring). ``first`` is head 1 (wins ties). ``priors``:
    per head the prior table of ``route-calibrated`` (None: 1/2 per class), e.g.
    ``(load_route_prior("rnn"), load_route_prior("retrieval"))``; each must be for its head's feature."""

    def __init__(self, first: Drafter, second: Drafter, mode: str = "merge",
                 priors: tuple[RoutePrior | None, RoutePrior | None] = (None, None)) -> None:
        if mode not in DUAL_MODES:
            raise ValueError(f"mode must be one of {DUAL_MODES}, got mode={mode!r}")
        for name, head in (("first", first), ("second", second)):
            if not isinstance(head, Drafter) or isinstance(head, DualDrafter):
                raise ValueError(f"{name} must be a single spec_fast Drafter, got {type(head).__name__}")
        if first.vocab_size != second.vocab_size:
            raise ValueError(f"first and second drafters' vocabularies differ: {first.vocab_size} vs {second.vocab_size}")
        self.first = first
        self.second = second
        self.mode = mode
        self.vocab_size = first.vocab_size
        self.wants_target_hidden = bool(first.wants_target_hidden or second.wants_target_hidden)
        self.features = (head_feature(first), head_feature(second))
        if len(priors) != 2 or any(p is not None and not isinstance(p, RoutePrior) for p in priors):
            raise ValueError(f"priors must be two RoutePrior or None (one per head), got priors={priors!r}")
        for name, prior, feature in zip(("first", "second"), priors, self.features):
            if prior is not None and prior.feature != feature:
                raise ValueError(f"priors: the {name} head is classed by {feature!r}, got a table for "
                                 f"{prior.feature!r}")
        self.priors = (priors[0], priors[1])

    def initial_calibration(self) -> ref_calibration.RouteCalibration:
        """Where every ``route-calibrated`` generation starts: no observations, the heads' prior tables."""
        rows = tuple(p.rates if p is not None else () for p in self.priors)
        return ref_calibration.RouteCalibration(features=self.features, prior=(rows[0], rows[1]))

    @property
    def heads(self) -> tuple[Drafter, Drafter]:
        return (self.first, self.second)

    def begin(self, batch_size: int, device: torch.device) -> tuple[Any, Any]:
        return (self.first.begin(batch_size, device), self.second.begin(batch_size, device))

    def forward(self, state: Any, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        raise ValueError("a DualDrafter drafts through its two heads (the engine drives each one); "
                         "call forward on .first or .second")

    def commit(self, state: Any, keep: torch.Tensor, counts: torch.Tensor, prefix_of_block: bool = False) -> None:
        raise ValueError("a DualDrafter's heads keep different entries; commit each head on its own state")

    def num_block(self, state: Any) -> int:
        return self.first.num_block(state[0]) + self.second.num_block(state[1])

    def take_rows(self, state: Any, rows: list[int]) -> Any:
        return (self.first.take_rows(state[0], rows), self.second.take_rows(state[1], rows))

    def join_rows(self, state: Any, joining: Any) -> Any:
        return (self.first.join_rows(state[0], joining[0]), self.second.join_rows(state[1], joining[1]))

    def passes(self, state: Any) -> int:
        return self.first.passes(state[0]) + self.second.passes(state[1])

    def observe_target(self, state: Any, target_hidden: torch.Tensor, keep: torch.Tensor | None = None,
                       counts: torch.Tensor | None = None) -> None:
        self.first.observe_target(state[0], target_hidden, keep, counts)
        self.second.observe_target(state[1], target_hidden, keep, counts)


@dataclass(frozen=True, eq=False)
class DualDraft:
    """The tree one target pass verifies, built from both heads' drafts.

    ``batch``: the tree (merged, union or routed winner) with ``tokens_in`` and confidences;
    ``head_entries``: per head ``[B, N]`` its drafter's block entry holding each slot (-1: none);
    ``heads [B, N]`` long: which head drafted each slot (0 root, 1, 2; a union node both heads drafted: 1);
    ``choice [B]`` long: the routed head (1 or 2), or None when merged;
    ``mean_confidences [B, 2]``: ``(mu_1, mu_2)`` (route only);
    ``expected_accepted [B, 2]`` float64: ``(E_1, E_2)`` (route-calibrated only);
    ``head_drafts``: both heads' own drafts (routes; the calibration compares both with the committed text);
    ``head_match_lengths``: per head its :func:`node_match_lengths` (route-calibrated, retrieval heads);
    ``stopped``: per head, the unfinished chain of a routed head that stopped drafting because it could not win
    (:mod:`spec_fast.drafts.dual_drafting`; its ``head_drafts`` entry holds the levels it drafted), else None;
    ``skipped``: per head, True when a routed head was not drafted at all because it could not win (it saw no
    token this step: everything committed becomes its pending tokens, as on a plain step).
    """

    batch: DraftBatch
    head_entries: tuple[torch.Tensor, torch.Tensor]
    heads: torch.Tensor
    choice: torch.Tensor | None = None
    mean_confidences: torch.Tensor | None = None
    expected_accepted: torch.Tensor | None = None
    head_drafts: tuple[DraftBatch, DraftBatch] | None = None
    head_match_lengths: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)
    stopped: tuple[Any, Any] = (None, None)
    skipped: tuple[bool, bool] = (False, False)


def _pad_slots(x: torch.Tensor, width: int, value: float) -> torch.Tensor:
    """Pad dim 1 of ``x [B, N, ...]`` to ``width`` with ``value``."""
    if x.shape[1] >= width:
        return x
    shape = (x.shape[0], width - x.shape[1]) + tuple(x.shape[2:])
    return torch.cat([x, torch.full(shape, value, dtype=x.dtype, device=x.device)], dim=1)


def _pad_last(x: torch.Tensor, width: int) -> torch.Tensor:
    if x.shape[-1] >= width:
        return x
    pad = torch.full(tuple(x.shape[:-1]) + (width - x.shape[-1],), -1, dtype=x.dtype, device=x.device)
    return torch.cat([x, pad], dim=-1)


def merge_trees(first: DraftBatch, second: DraftBatch) -> DualDraft:
    """The merged tree of seed 001 section 4 (:func:`spec_ref.dual.merge_trees`), device-side.

    Head 1's slots keep their indices; head 2's slot ``i > 0`` becomes ``n1 + i`` with ``n1 = N1 - 1``
    (head 1's slot count less the root; padding slots of head 1 are invalid and stay in place, so the valid
    slots in order are exactly the reference's node order). Parents are remapped the same way, so the
    subtrees share only the root even where both heads proposed the same token.
    """
    a, b = first.tree, second.tree
    batch, n_a = a.tokens.shape
    n1 = n_a - 1
    device = a.tokens.device
    parents_b = b.parents[:, 1:]
    parents = torch.cat([a.parents, torch.where(parents_b > 0, parents_b + n1, parents_b)], dim=1)
    k_a, k_b = a.max_draws, b.max_draws
    draws_a = _pad_last(a.draws, k_a + k_b)
    draws_a[:, 0, k_a:] = b.draws[:, 0]  # the root's draws: head 1's, then head 2's
    draws_b = torch.cat([b.draws[:, 1:], torch.full_like(b.draws[:, 1:, :1], -1).expand(-1, -1, k_a)], dim=2)
    tree = FlatTree(
        tokens=torch.cat([a.tokens, b.tokens[:, 1:]], dim=1), parents=parents,
        depths=torch.cat([a.depths, b.depths[:, 1:]], dim=1), draws=torch.cat([draws_a, draws_b], dim=1),
        valid=torch.cat([a.valid, b.valid[:, 1:]], dim=1), process="deterministic",
    )
    n_b = b.tokens.shape[1] - 1
    none_a = torch.full((batch, n1), -1, dtype=torch.long, device=device)
    none_b = torch.full((batch, n_b), -1, dtype=torch.long, device=device)
    entries = (torch.cat([first.entries, none_b], dim=1),
               torch.cat([second.entries[:, :1], none_a, second.entries[:, 1:]], dim=1))
    heads = torch.cat([torch.zeros(batch, 1, dtype=torch.long, device=device),
                       torch.ones(batch, n1, dtype=torch.long, device=device),
                       torch.full((batch, n_b), 2, dtype=torch.long, device=device)], dim=1)
    merged = DraftBatch(
        tree=tree, draft_probs=None,
        confidences=torch.cat([first.confidences, second.confidences[:, 1:]], dim=1),
        entries=entries[0], tokens_in=torch.cat([first.tokens_in, second.tokens_in[:, 1:]], dim=1),
        pending_width=0, max_depth=max(first.max_depth, second.max_depth),
    )
    return DualDraft(merged, entries, heads)


def union_tree(first: DraftBatch, second: DraftBatch) -> DualDraft:
    """The token-merged union of both heads' trees (one node per context; :meth:`spec_ref.dual.MergedTree.
    union_tree`), the tree NSS verifies at T > 0.

    Laid out like :func:`merge_trees`, except that a head-2 node whose context head 1 also drafted is
    marked invalid and its children hang below head 1's copy (which also records head 2's cache entry).
    Draws per node: its valid children in slot order (head 1's first), each token once.
    """
    merged = merge_trees(first, second)
    tree = merged.batch.tree
    batch, n = tree.tokens.shape
    n1 = first.tree.tokens.shape[1] - 1
    device = tree.tokens.device
    slots = torch.arange(n, device=device)
    # twin[b, i]: the slot that stands for slot i (itself, or head 1's copy of a duplicated head-2 node)
    twin = slots.unsqueeze(0).expand(batch, n).clone()
    max_depth = merged.batch.max_depth
    is_b = (slots > n1).unsqueeze(0) & tree.valid
    is_a = (slots <= n1).unsqueeze(0) & (slots > 0).unsqueeze(0) & tree.valid
    for depth in range(1, max_depth + 1):
        parent_twin = torch.gather(twin, 1, tree.parents.clamp(min=0))  # [B, N]
        level_b = is_b & (tree.depths == depth)
        # same = [B, N(head-2 node), N(head-1 node)]: same token below the same (twinned) parent
        same = (level_b.unsqueeze(2) & is_a.unsqueeze(1)
                & (tree.tokens.unsqueeze(2) == tree.tokens.unsqueeze(1))
                & (parent_twin.unsqueeze(2) == tree.parents.unsqueeze(1)))
        found = same.any(dim=2)
        twin = torch.where(found, same.long().argmax(dim=2), twin)
    duplicate = twin != slots.unsqueeze(0)
    parents = torch.where(tree.parents >= 0, torch.gather(twin, 1, tree.parents.clamp(min=0)), tree.parents)
    valid = tree.valid & ~duplicate
    # head 2's entries move to head 1's copy of its duplicated nodes
    entries_b = merged.head_entries[1]
    moved = torch.full((batch, n + 1), -1, dtype=torch.long, device=device)
    moved.scatter_(1, torch.where(duplicate, twin, torch.full_like(twin, n)), entries_b)
    entries_b = torch.where(duplicate, torch.full_like(entries_b, -1),
                            torch.where(moved[:, :n] >= 0, moved[:, :n], entries_b))
    tree = FlatTree(tree.tokens, torch.where(valid | (slots == 0).unsqueeze(0), parents, -1), tree.depths,
                    _draws_from_children(tree.tokens, parents, valid, tree.max_draws), valid, "deterministic")
    batch_out = DraftBatch(tree, None, merged.batch.confidences, merged.batch.entries, merged.batch.tokens_in, 0,
                           max_depth)
    return DualDraft(batch_out, (merged.head_entries[0], entries_b), torch.where(valid, merged.heads, 0))


def _draws_from_children(tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor, k: int) -> torch.Tensor:
    """``[B, N, K]``: the tokens of each node's first ``k`` valid children in slot order, ``-1`` padded."""
    batch, n = tokens.shape
    slots = torch.arange(n, device=tokens.device)
    child = valid.unsqueeze(1) & (parents.unsqueeze(1) == slots.view(1, n, 1))  # [B, N(parent), N(child)]
    k = max(1, min(k, n))
    order = torch.where(child, slots.view(1, 1, n), torch.full_like(child, n, dtype=torch.long))
    first_k = torch.sort(order, dim=2).values[:, :, :k]  # [B, N, K] child slots, n = none
    padded = torch.cat([tokens, torch.full_like(tokens[:, :1], -1)], dim=1)
    return torch.gather(padded.unsqueeze(1).expand(batch, n, n + 1), 2, first_k)


def mean_confidence(draft: DraftBatch) -> torch.Tensor:
    """``mu [B]``: mean confidence over each row's retained draft nodes (root excluded; 0 without any),
    :func:`spec_ref.dual.mean_confidence`."""
    nodes = draft.tree.valid.clone()
    nodes[:, 0] = False
    return confidence_mean(draft.confidences, nodes)


def confidence_mean(confidences: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
    """``[B]`` float64: the mean of ``confidences [B, N]`` over ``nodes [B, N]`` bool (0 without any). One
    reduction for every caller, so that a bound computed on larger values is larger in floating point too."""
    values = confidences.double()
    total = torch.where(nodes, values, torch.zeros_like(values))
    count = nodes.sum(dim=1)
    return torch.where(count > 0, total.sum(dim=1) / count.clamp(min=1), torch.zeros_like(total[:, 0]))


def route(first: DraftBatch, second: DraftBatch) -> DualDraft:
    """Step-level routing of seed 000 (:func:`spec_ref.dual.route`): per row, head 1's tree if
    ``mu_1 >= mu_2``, else head 2's. Device-side: both trees are padded to one width and selected per row."""
    mu = torch.stack([mean_confidence(first), mean_confidence(second)], dim=1)  # [B, 2]
    return replace(select_heads(first, second, mu[:, 0] >= mu[:, 1]), mean_confidences=mu)


def select_heads(first: DraftBatch, second: DraftBatch, pick_first: torch.Tensor) -> DualDraft:
    """Per row head 1's tree where ``pick_first [B]`` bool, else head 2's, padded to one width."""
    a, b = first.tree, second.tree
    n = max(a.num_slots, b.num_slots)
    k = max(a.max_draws, b.max_draws)

    def pick(x: torch.Tensor, y: torch.Tensor, value: float) -> torch.Tensor:
        x, y = _pad_slots(x, n, value), _pad_slots(y, n, value)
        cond = pick_first.view(-1, *([1] * (x.dim() - 1)))
        return torch.where(cond, x, y)

    tree = FlatTree(
        tokens=pick(a.tokens, b.tokens, -1), parents=pick(a.parents, b.parents, -1),
        depths=pick(a.depths, b.depths, -1), draws=pick(_pad_last(a.draws, k), _pad_last(b.draws, k), -1),
        valid=pick(a.valid, b.valid, False), process="deterministic",
    )
    none = torch.full((a.batch_size, n), -1, dtype=torch.long, device=a.tokens.device)
    entries_a = torch.where(pick_first.unsqueeze(1), _pad_slots(first.entries, n, -1), none)
    entries_b = torch.where(pick_first.unsqueeze(1), none, _pad_slots(second.entries, n, -1))
    # the root entry of each head is its own (both hold the root) -- keep it for both
    entries_a[:, 0] = first.entries[:, 0]
    entries_b[:, 0] = second.entries[:, 0]
    choice = torch.where(pick_first, 1, 2)
    heads = torch.where(tree.valid, choice.unsqueeze(1).expand(-1, n), 0)
    heads[:, 0] = 0
    chosen = DraftBatch(tree, None, pick(first.confidences, second.confidences, 0.0), entries_a,
                        pick(first.tokens_in, second.tokens_in, 0), 0, max(first.max_depth, second.max_depth))
    return DualDraft(chosen, (entries_a, entries_b), heads, choice, head_drafts=(first, second))


# ----- calibrated routing (bookkeeping in spec_fast.drafts.dual_calibration) --------------------------------
def calibrated_route(first: DraftBatch, second: DraftBatch, calibration: RouteCalibration,
                     match_lengths: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)) -> DualDraft:
    """Calibrated routing (:func:`spec_ref.dual_calibration.calibrated_route`): per row head 1's tree if
    ``E_1 >= E_2``, else head 2's, where ``E_h`` is the sum over the head's draft nodes of their calibrated
    path probabilities (the expected accepted length). ``match_lengths[h]``: :func:`node_match_lengths` of a
    head classed by match length. Device-side, no host read."""
    expected = torch.stack([expected_accepted(first, calibration, 1, match_lengths[0]),
                            expected_accepted(second, calibration, 2, match_lengths[1])], dim=1)  # [B, 2]
    return replace(select_heads(first, second, expected[:, 0] >= expected[:, 1]), expected_accepted=expected,
                   head_match_lengths=match_lengths)


def observe_committed(calibration: RouteCalibration, dual: DualDraft, accepted_slots: torch.Tensor,
                      accepted_depth: torch.Tensor, next_token: torch.Tensor, active: list[bool]) -> RouteCalibration:
    """The engine's commit-phase hook: the calibration after this step's committed block (the verified
    tree's accepted tokens, then the next token), for the rows still ``active``."""
    if dual.head_drafts is None:
        raise ValueError("observe_committed needs a routed DualDraft (it compares both heads' drafts)")
    block = committed_block(dual.batch.tree.tokens, accepted_slots, accepted_depth, next_token)
    rows = torch.tensor(active, dtype=torch.bool, device=block.device)
    return update_calibration(calibration, dual.head_drafts[0], dual.head_drafts[1], block, rows,
                              dual.head_match_lengths)


def tree_layout(tree: FlatTree) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the target pass sees of a tree: ``(mask [B, N, N], positions [B, N], path_matrix [B, P, D])``.

    ``mask`` is the ancestor-or-self relation the KV cache builds from the parents
    (:func:`spec_fast.tree_attention.extend_ancestors`, the block of the attention mask); ``positions`` the
    depth positions; ``path_matrix`` one row per leaf (valid node without valid children, increasing slot),
    the slots root to leaf, ``-1`` padded (rows beyond a row's leaf count all ``-1``). Compare with
    :func:`spec_ref.tensorize.tensorize_structure` on the valid slots.
    """
    batch, n = tree.tokens.shape
    device = tree.tokens.device
    parents = torch.where(tree.valid, tree.parents, torch.full_like(tree.parents, -1))
    # the root's own parent is -1: as a block entry it hangs below the context like every padding slot
    mask = extend_ancestors(torch.zeros(batch, 0, 0, dtype=torch.bool, device=device), parents)
    mask = mask & tree.valid.unsqueeze(1) & tree.valid.unsqueeze(2)
    positions = mask.sum(dim=2) - 1
    slots = torch.arange(n, device=device)
    has_child = (tree.valid.unsqueeze(1) & (parents.unsqueeze(1) == slots.view(1, n, 1))).any(dim=2)
    leaf = tree.valid & ~has_child
    width = int(positions.max()) + 1
    num_leaves = int(leaf.sum(dim=1).max())
    leaf_slots = torch.sort(torch.where(leaf, slots, n), dim=1).values[:, :num_leaves]  # [B, P]
    on_path = torch.gather(torch.cat([mask, torch.zeros_like(mask[:, :1])], dim=1), 1,
                           leaf_slots.unsqueeze(2).expand(-1, -1, n))  # [B, P, N]
    order = torch.sort(torch.where(on_path, slots, n), dim=2).values[:, :, :width]
    return mask, positions, torch.where(order < n, order, -1)
