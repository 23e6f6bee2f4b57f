"""The delayed (K, L1, L2) and i.i.d. tree proposers (seed 002 (docs/papers.md) Def. 5.2; the twins of
``spec_ref.draft_delayed_tree`` and ``spec_ref.draft_iid_tree``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from spec_fast.draws import RowStreams, categorical
from spec_fast.drafts.batch import DraftBatch, DraftLaw, RowTree, flatten_trees, forward_frontier, pending_forward, row_depths
from spec_fast.drafts.dual import DualDraft
from spec_fast.drafts.model import Drafter
from spec_fast.drafts.proposer import SingleHeadProposer, StepRows
from spec_fast.strategies import Strategy

__all__ = ["DelayedProposer", "draft_delayed_tree", "draft_iid_tree"]


def draft_delayed_tree(
    drafter: Drafter, state: Any, pending: Sequence[Sequence[int]], roots: Sequence[int],
    depth: int | Sequence[int], num_paths: int, trunk: int, draft_law: DraftLaw, streams: RowStreams,
    device: torch.device, root: tuple[torch.Tensor, int] | None = None, root_law: torch.Tensor | None = None,
) -> DraftBatch:
    """Delayed (K, L1, L2) tree (seed 002 (docs/papers.md) Def. 5.2): ``trunk`` = L1 tokens drawn one at a time, then
    ``num_paths`` = K i.i.d. branches to ``depth``; children merged by token, draw order kept (the draws
    of :func:`spec_ref.draft_delayed_tree`). ``trunk = 0`` is the i.i.d. K x L tree. ``root``: the
    ``(root_logits [B, 1, V], width)`` of a :func:`pending_forward` the caller already ran (the NDE
    selector reads them before it picks the shape); ``root_law [B, 1, V]``: ``draft_law`` of those root
    logits when the caller has it already. ``depth`` may be one depth per row (a row stops growing at its
    own; its draws do not depend on the other rows')."""
    batch = len(pending)
    depths = row_depths(depth, batch)
    depth = max(depths)
    logits, width = root if root is not None else pending_forward(drafter, state, pending, device)
    trees = [RowTree(width - 1) for _ in range(batch)]
    frontier: list[list[int]] = [[0] for _ in range(batch)]
    q_of: list[dict[int, torch.Tensor]] = [{} for _ in range(batch)]
    for tr in trees:
        tr.paths[0] = list(range(num_paths))
    for level in range(depth):
        q = root_law if level == 0 and root_law is not None else draft_law(logits)  # [B, F, V]
        fmax = q.shape[1]
        draws_needed = 1 if level < trunk else num_paths
        uniforms = streams.uniforms(level, fmax * draws_needed).reshape(batch * fmax, draws_needed)
        samples = categorical(q.reshape(batch * fmax, -1), uniforms)
        drawn: list[list[list[int]]] = samples.reshape(batch, fmax, draws_needed).tolist()
        new_frontier: list[list[int]] = [[] for _ in range(batch)]
        for b, tr in enumerate(trees):
            if level >= depths[b]:
                continue
            for f, node in enumerate(frontier[b]):
                q_of[b][node] = q[b, f]
                if level < trunk:
                    token = drawn[b][f][0]
                    tr.draws[node].append(token)
                    new_frontier[b].append(tr.add(node, token, tr.paths[node], 0.0))
                    continue
                for j, path in enumerate(tr.paths[node]):
                    token = drawn[b][f][j]
                    tr.draws[node].append(token)
                    child = tr.add(node, token, [path], 0.0)
                    if child not in new_frontier[b]:
                        new_frontier[b].append(child)
        frontier = new_frontier
        if level + 1 >= depth:
            break
        logits = forward_frontier(drafter, state, trees, frontier, device)
    return flatten_trees(trees, q_of, roots, "iid", False, width, device)


def draft_iid_tree(
    drafter: Drafter, state: Any, pending: Sequence[Sequence[int]], roots: Sequence[int], depth: int,
    num_paths: int, draft_law: DraftLaw, streams: RowStreams, device: torch.device,
) -> DraftBatch:
    """K i.i.d. paths of ``depth`` tokens (:func:`spec_ref.draft_iid_tree`)."""
    return draft_delayed_tree(drafter, state, pending, roots, depth, num_paths, 0, draft_law, streams, device)


class DelayedProposer(SingleHeadProposer):
    """``iid:K,L`` and ``delayed:K,L1,L2``: K i.i.d. branches below a trunk of L1 tokens (L1 = 0: i.i.d.)."""

    def __init__(self, strategy: Strategy, drafter: Drafter | None) -> None:
        super().__init__(strategy, drafter)
        self.most_draws = strategy.num_paths  # a branching node draws K children

    def draft(self, rows: StepRows, depth_cap: int, law: DraftLaw, device: torch.device
              ) -> tuple[DraftBatch, DualDraft | None]:
        draft = draft_delayed_tree(*self.head_args(rows), rows.depth_caps, self.strategy.num_paths,
                                   self.strategy.trunk, law, rows.draft_streams(), device)
        rows.heads[0].pending_width = draft.pending_width
        return draft, None
