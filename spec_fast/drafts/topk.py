"""The budgeted top-k tree proposer (EAGLE-2; the twin of ``spec_ref.draft_topk_tree``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from spec_fast.drafts.batch import DraftBatch, DraftLaw, RowTree, flatten_trees, forward_frontier, pending_forward, ranked_tokens, row_depths
from spec_fast.drafts.dual import DualDraft
from spec_fast.drafts.model import Drafter
from spec_fast.drafts.proposer import SingleHeadProposer, StepRows
from spec_fast.strategies import Strategy

__all__ = ["TopKProposer", "draft_topk_tree"]


def draft_topk_tree(
    drafter: Drafter, state: Any, pending: Sequence[Sequence[int]], roots: Sequence[int],
    depth: int | Sequence[int], top_k: int, budget: int, device: torch.device,
) -> DraftBatch:
    """Budgeted top-k tree (EAGLE-2; the decisions of :func:`spec_ref.draft_topk_tree`): every frontier
    node proposes its ``top_k`` most probable tokens under ``softmax(draft logits)``, and the best
    ``budget`` nodes by confidence, closed under ancestors, survive each level. Deterministic. ``depth``
    may be one depth per row (a row stops growing at its own)."""
    batch = len(pending)
    depths = row_depths(depth, batch)
    depth = max(depths)
    logits, width = pending_forward(drafter, state, pending, device)
    trees = [RowTree(width - 1) for _ in range(batch)]
    frontier: list[list[int]] = [[0] for _ in range(batch)]
    q_of: list[dict[int, torch.Tensor]] = [{} for _ in range(batch)]
    for level in range(depth):
        q = torch.softmax(logits.float(), dim=-1)  # [B, F, V]
        top_vals, top_ids = ranked_tokens(q, min(top_k, q.shape[-1]))
        tv, ti = top_vals.tolist(), top_ids.tolist()
        new_frontier: list[list[int]] = [[] for _ in range(batch)]
        for b, tr in enumerate(trees):
            if level >= depths[b]:
                new_frontier[b] = []
                continue
            for f, node in enumerate(frontier[b]):
                q_of[b][node] = q[b, f]
                for val, tok in zip(tv[b][f], ti[b][f]):
                    if val > 0:
                        tr.add(node, tok, [], tr.score[node] * val)
            keep = tr.best_first(budget)
            for i in range(1, len(tr.tokens)):
                if tr.alive[i] and i not in keep:
                    tr.alive[i] = False
            new_frontier[b] = [i for i in range(1, len(tr.tokens)) if tr.alive[i] and tr.depths[i] == level + 1]
        frontier = new_frontier
        if level + 1 >= depth or all(len(f) == 0 for f in frontier):
            break
        logits = forward_frontier(drafter, state, trees, frontier, device)
    return flatten_trees(trees, q_of, roots, "deterministic", True, width, device)


class TopKProposer(SingleHeadProposer):
    """``topk:k,budget,depth``: the budgeted top-k tree (deterministic; the draft law is not used)."""

    def __init__(self, strategy: Strategy, drafter: Drafter | None) -> None:
        super().__init__(strategy, drafter)
        self.most_draws = strategy.top_k  # a node has up to k children

    def draft(self, rows: StepRows, depth_cap: int, law: DraftLaw, device: torch.device
              ) -> tuple[DraftBatch, DualDraft | None]:
        draft = draft_topk_tree(*self.head_args(rows), rows.depth_caps, self.strategy.top_k, self.strategy.budget,
                                device)
        rows.heads[0].pending_width = draft.pending_width
        return draft, None
