"""The DynaTree proposer (seed 003 (docs/papers.md); the twin of ``spec_ref.draft_dynatree``).

Each row keeps its own acceptance history (:class:`DynaTreeRows`): the step's parameters are the strategy's
adjusted by that history (:func:`spec_ref.dynatree.adjusted_params`), and the row's accepted count updates it
after the commit (:func:`spec_ref.dynatree.update_history`). A row's tree is a function of its own context
and history, whatever else shares the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from spec_fast.drafts.batch import DraftBatch, DraftLaw, RowTree, flatten_trees, forward_frontier, pending_forward, ranked_tokens, row_depths
from spec_fast.drafts.dual import DualDraft
from spec_fast.drafts.model import Drafter
from spec_fast.drafts.proposer import ProposerRows, SingleHeadProposer, StepRows
from spec_fast.strategies import Strategy
from spec_fast.verify.tree import Verified
from spec_ref.dynatree import (
    DynaTreeHistory, DynaTreeParams, adjusted_params, branch_count, expands, update_history,
)

__all__ = ["DynaTreeProposer", "DynaTreeRows", "draft_dynatree"]


def draft_dynatree(
    drafter: Drafter, state: Any, pending: Sequence[Sequence[int]], roots: Sequence[int],
    depth: int | Sequence[int], params: Sequence[DynaTreeParams], active: Sequence[bool], device: torch.device,
) -> tuple[DraftBatch, list[int]]:
    """DynaTree drafting (the decisions of :func:`spec_ref.draft_dynatree`), one draft pass per level.

    ``params[b]``: row b's parameters after its history adjustment (:func:`spec_ref.dynatree.adjusted_params`);
    ``depth`` (tokens left) lowers D_max for this step only. The reference pops a FIFO frontier; all nodes
    of one depth precede the next depth in it, so expanding level by level in creation order makes the
    same decisions. The budget is checked node by node as in the reference. Returns the batch and each
    row's tree depth (the history's ``pending_depth``). ``depth`` may be one depth per row.
    """
    batch = len(pending)
    depths = row_depths(depth, batch)
    depth = max(depths)
    logits, width = pending_forward(drafter, state, pending, device)
    q = torch.softmax(logits.float(), dim=-1)  # [B, 1, V]
    u0 = q[:, 0].argmax(dim=-1).tolist()  # first maximum = lowest id on ties
    p0 = q[:, 0].max(dim=-1).values.tolist()
    trees = [RowTree(width - 1) for _ in range(batch)]
    size = [1] * batch
    level: list[list[int]] = []
    for b, tr in enumerate(trees):
        if depths[b] < 1:
            level.append([])
            continue
        tr.draws[0].append(u0[b])
        level.append([tr.add(0, u0[b], [], p0[b])])
    tree_depth = 1  # DraftTree depth of `level`; seed depth d(u) = tree_depth - 1
    while tree_depth < depth:
        expand: list[list[int]] = []
        for b, tr in enumerate(trees):
            prm = params[b]
            rows = []
            if active[b] and size[b] < prm.node_budget and tree_depth < depths[b]:
                rows = [u for u in level[b] if expands(prm, tr.score[u], tree_depth - 1)]
            expand.append(rows)
        if not any(expand):
            break
        q = torch.softmax(forward_frontier(drafter, state, trees, expand, device).float(), dim=-1)
        bmax = max(max(p.branch_max, p.branch_mid, p.branch_min) for p in params)
        top_vals, top_ids = ranked_tokens(q, min(bmax, q.shape[-1]))
        tv, ti = top_vals.tolist(), top_ids.tolist()
        next_level: list[list[int]] = [[] for _ in range(batch)]
        for b, tr in enumerate(trees):
            prm = params[b]
            for j, u in enumerate(expand[b]):
                if size[b] >= prm.node_budget:
                    break
                branches = branch_count(prm, tv[b][j][0])
                for val, tok in zip(tv[b][j][:branches], ti[b][j][:branches]):
                    if size[b] >= prm.node_budget or val <= 0:
                        break
                    p_v = tr.score[u] * val
                    if p_v < prm.prune_threshold:
                        break
                    tr.draws[u].append(tok)
                    next_level[b].append(tr.add(u, tok, [], p_v))
                    size[b] += 1
        level = next_level
        tree_depth += 1
    depths = [max(tr.depths) for tr in trees]
    return flatten_trees(trees, [{} for _ in range(batch)], roots, "deterministic", False, width, device), depths


@dataclass(frozen=True)
class DynaTreeRows:
    """Per row: its DynaTree acceptance history (``pending_depth`` set on the steps the row drafted)."""

    history: list[DynaTreeHistory]

    def take_rows(self, rows: list[int]) -> DynaTreeRows:
        return DynaTreeRows([self.history[b] for b in rows])

    def join(self, other: ProposerRows) -> DynaTreeRows:
        assert isinstance(other, DynaTreeRows)
        return DynaTreeRows(self.history + other.history)


class DynaTreeProposer(SingleHeadProposer):
    """``dynatree:...``: confidence-aware branching, dynamic depth and pruning, adjusted per row by its history."""

    def __init__(self, strategy: Strategy, drafter: Drafter | None) -> None:
        super().__init__(strategy, drafter)
        self.params = strategy.dynatree_params()
        self.window = strategy.dynatree_window

    def begin(self, batch: int, device: torch.device,
              previous: tuple[torch.Tensor, torch.Tensor] | None) -> ProposerRows:
        return DynaTreeRows([DynaTreeHistory(window=self.window) for _ in range(batch)])

    def draft(self, rows: StepRows, depth_cap: int, law: DraftLaw, device: torch.device
              ) -> tuple[DraftBatch, DualDraft | None]:
        state = rows.proposal
        assert isinstance(state, DynaTreeRows)
        params = [adjusted_params(self.params, h) for h in state.history]
        draft, depths = draft_dynatree(*self.head_args(rows), rows.depth_caps, params, rows.active, device)
        for b, history in enumerate(state.history):
            if rows.active[b] and depths[b] >= 1:  # a root-only row took a plain step, as alone
                state.history[b] = DynaTreeHistory(window=history.window, acceptance=history.acceptance,
                                                   pending_depth=depths[b])
        rows.heads[0].pending_width = draft.pending_width
        return draft, None

    def after_commit(self, rows: StepRows, dual: DualDraft | None, verified: Verified, accepted: Sequence[int]
                     ) -> None:
        state = rows.proposal
        assert isinstance(state, DynaTreeRows)
        for b, history in enumerate(state.history):
            if rows.active[b] and history.pending_depth is not None:
                state.history[b] = update_history(history, accepted[b])
