"""The vocabulary every proposer shares: a drafted batch of trees (:class:`DraftBatch`), one drafter's
per-request state (:class:`HeadTrack`), the host-side row trees of the branching builders (:class:`RowTree`),
the pending-token forward every builder starts with (:func:`pending_forward`), and the helpers that cap,
pass over the frontier and flatten row trees into a :class:`DraftBatch`.

The tree builders, one module per strategy, and the :mod:`spec_ref` functions whose decisions they
reproduce (each is the twin of :mod:`spec_ref.drafting` / :func:`spec_ref.draft_dynatree`):

==============================================  =====================================  ===========================
builder                                         tree                                   spec_ref twin
==============================================  =====================================  ===========================
:func:`spec_fast.drafts.chain.draft_chain`      one path of ``depth`` tokens           ``draft_iid_tree(K=1)``
:func:`spec_fast.drafts.delayed.draft_iid_tree` ``K`` i.i.d. paths                     ``draft_iid_tree``
:func:`spec_fast.drafts.delayed.draft_delayed_tree` trunk ``L1``, then ``K`` branches  ``draft_delayed_tree``
:func:`spec_fast.drafts.topk.draft_topk_tree`   budgeted top-k (deterministic)         ``draft_topk_tree``
:func:`spec_fast.drafts.dynatree.draft_dynatree` DynaTree (deterministic, adaptive)    ``draft_dynatree``
==============================================  =====================================  ===========================

Every builder first feeds each row's *pending* tokens to the drafter (committed tokens its cache lacks,
ending with the row's root token: :func:`pending_forward`), then grows the tree level by level, one
batched drafter pass per level over the new frontier with a tree attention mask. The tree bookkeeping of
the branching builders is host-side (small per-row Python trees, one read-back of the frontier's top
tokens or draws per level); the chain builder reads nothing back.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from spec_fast._sampling import first_max_index
from spec_fast.drafts.model import Drafter
from spec_fast.flat_tree import FlatTree

__all__ = ["DraftBatch", "DraftLaw", "argmax_law", "HeadTrack", "RowTree", "pending_forward", "draft_root_only",
           "ranked_tokens", "row_depths", "cap_rows", "forward_frontier", "flatten_trees"]

#: ``[B, F, V]`` draft logits -> ``[B, F, V]`` float32 law the drafter samples from (the engine's choice)
DraftLaw = Callable[[torch.Tensor], torch.Tensor]


def argmax_law(logits: torch.Tensor) -> torch.Tensor:
    """The draft law of greedy chains: one-hot at each row's first maximum (``[..., V]`` float32). Any
    inverse-CDF draw from it is that argmax, so a builder handed this very function may take the argmax
    without drawing."""
    return torch.zeros_like(logits, dtype=torch.float32).scatter_(-1, first_max_index(logits, keepdim=True), 1.0)


@dataclass(frozen=True, eq=False)
class DraftBatch:
    """One step's drafted trees, one per row, slot 0 the root.

    * ``tree``: :class:`FlatTree` (``tokens``, ``parents``, ``depths``, ``draws``, ``valid`` ``[B, N]``);
    * ``draft_probs [B, N, V]`` float32: the law each node's draws were sampled from (zero rows for nodes
      without draws); ``None`` where verification reads no law: a root-only batch, a greedy chain (every
      row at temperature 0);
    * ``confidences [B, N]`` float32: product of the draft probabilities along the path to the node (root
      1; ``spec_ref.ScoredDraftTree.confidences``); meaningful for deterministic trees only (0 on sampled
      trees);
    * ``entries [B, N]`` long: the drafter's block entry holding each node (-1: none, e.g. the last level,
      which is never forwarded);
    * ``tokens_in [B, N]`` long: the token each slot feeds the target (slot 0: the root token);
    * ``pending_width``: width of the pending block the drafter was fed first (its last entry is the root);
    * ``max_depth``: the largest node depth, known on the host (saves a device read in verification);
    * ``chain``: every row's tree is a chain, slot d at depth d (the chain builder's, capped or not), which
      lets greedy verification compare each level's token with the argmax above it directly.
    """

    tree: FlatTree
    draft_probs: torch.Tensor | None
    confidences: torch.Tensor
    entries: torch.Tensor
    tokens_in: torch.Tensor
    pending_width: int
    max_depth: int
    chain: bool = False

    @property
    def tokens(self) -> torch.Tensor:
        return self.tree.tokens

    @property
    def parents(self) -> torch.Tensor:
        return self.tree.parents

    @property
    def depths(self) -> torch.Tensor:
        return self.tree.depths


class RowTree:
    """Python bookkeeping of one row's tree while it is drafted (host side, small)."""

    def __init__(self, root_entry: int) -> None:
        self.tokens: list[int] = [-1]
        self.parents: list[int] = [-1]
        self.depths: list[int] = [0]
        self.draws: list[list[int]] = [[]]
        self.entry: list[int] = [root_entry]
        self.paths: list[list[int]] = [[]]
        self.score: list[float] = [1.0]
        self.alive: list[bool] = [True]

    def add(self, parent: int, token: int, paths: list[int], score: float) -> int:
        for child in range(len(self.tokens)):
            if self.parents[child] == parent and self.tokens[child] == token and self.alive[child]:
                self.paths[child].extend(paths)
                return child
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.draws.append([])
        self.entry.append(-1)
        self.paths.append(list(paths))
        self.score.append(score)
        self.alive.append(True)
        return len(self.tokens) - 1

    def best_first(self, budget: int) -> set[int]:
        """The ``budget`` best alive non-root nodes, closed under ancestors, chosen best-first exactly as
        :func:`spec_ref.draft_topk_tree` does: from the root's children, repeatedly the best available node
        (higher confidence, then lower token id, then earlier pushed; children are pushed in rank order
        when their parent is kept). A plain sort would be the same without ties, but a law with
        probability 1 (a retrieval draft) gives a child its parent's confidence, and a lower token id must
        not let it overtake its own parent."""
        children: dict[int, list[int]] = {}
        for i in range(1, len(self.tokens)):
            if self.alive[i]:
                children.setdefault(self.parents[i], []).append(i)
        heap: list[tuple[float, int, int, int]] = []
        pushed = 0

        def push(node: int) -> None:
            nonlocal pushed
            for child in sorted(children.get(node, []), key=lambda c: (-self.score[c], self.tokens[c])):
                heapq.heappush(heap, (-self.score[child], self.tokens[child], pushed, child))
                pushed += 1

        push(0)
        kept: set[int] = set()
        while heap and len(kept) < budget:
            node = heapq.heappop(heap)[3]
            kept.add(node)
            push(node)
        return kept


def ranked_tokens(q: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk(q, k)`` over the last dim of ``q [..., V]`` with ties broken towards the lower token id
    (:func:`spec_ref.drafting.ranked_tokens`' rule; ``torch.topk`` leaves that unspecified, and retrieval
    drafts produce exact ties): the first ``k`` entries of a stable descending sort, without sorting all
    of V. Returns ``(values [..., k], ids [..., k])``."""
    kth = torch.topk(q, k, dim=-1).values[..., -1:]
    above = q > kth
    tied = q == kth
    room = k - above.sum(dim=-1, keepdim=True)
    chosen = above | (tied & (torch.cumsum(tied.long(), dim=-1) <= room))
    # exactly k chosen per row: take them, then order by (value desc, id asc) with two stable sorts
    ids = torch.topk(torch.where(chosen, q, torch.full_like(q, -1.0)), k, dim=-1).indices
    ids = torch.sort(ids, dim=-1).values
    vals = torch.gather(q, -1, ids)
    vals, order = torch.sort(vals, dim=-1, descending=True, stable=True)
    return vals, torch.gather(ids, -1, order)


def pending_forward(drafter: Drafter, state: Any, pending: Sequence[Sequence[int]],
                    device: torch.device) -> tuple[torch.Tensor, int]:
    """Feed each row's pending tokens (left-padded chain ending at the root token) to the drafter.

    Returns ``(root_logits [B, 1, V], width)``; the root of row b is block entry ``width - 1``.
    """
    batch = len(pending)
    width = max(len(p) for p in pending)
    ptoks = torch.zeros(batch, width, dtype=torch.long)
    ppar = torch.full((batch, width), -1, dtype=torch.long)
    for b, p in enumerate(pending):
        off = width - len(p)
        ptoks[b, off:] = torch.tensor(list(p), dtype=torch.long)
        ppar[b, off + 1:] = torch.arange(off, width - 1)
    return drafter.forward_last(state, ptoks.to(device), ppar.to(device)), width


def row_depths(depth: int | Sequence[int], batch: int) -> list[int]:
    """A builder's ``depth`` argument as one depth per row (an int: every row the same)."""
    return [int(depth)] * batch if isinstance(depth, int) else [int(d) for d in depth]


def cap_rows(draft: DraftBatch, depths: Sequence[int]) -> DraftBatch:
    """``draft`` with row b cut to its nodes of depth ``<= depths[b]`` (the rest invalid, the draws of its
    new leaves removed): the tree the row would have drafted to that depth, for builders whose levels do
    not depend on deeper ones (chains; dual heads' top-1 chains)."""
    if all(d >= draft.max_depth for d in depths):
        return draft
    tree = draft.tree
    cap = torch.tensor(list(depths), dtype=torch.long, device=tree.depths.device).unsqueeze(1)  # [B, 1]
    valid = tree.valid & (tree.depths <= cap)
    leaf = tree.depths >= cap
    draws = torch.where(leaf.unsqueeze(2), torch.full_like(tree.draws, -1), tree.draws)
    probs = draft.draft_probs
    if probs is not None:
        probs = probs * (~leaf).unsqueeze(2).to(probs.dtype)
    capped = FlatTree(tree.tokens, tree.parents, tree.depths, draws, valid, tree.process)
    return DraftBatch(capped, probs, draft.confidences, draft.entries, draft.tokens_in, draft.pending_width,
                      draft.max_depth, draft.chain)


def draft_root_only(roots: Sequence[int], process: str, device: torch.device) -> DraftBatch:
    """No draft (a plain step): the root alone."""
    batch = len(roots)
    tree = FlatTree(
        tokens=torch.full((batch, 1), -1, dtype=torch.long, device=device),
        parents=torch.full((batch, 1), -1, dtype=torch.long, device=device),
        depths=torch.zeros(batch, 1, dtype=torch.long, device=device),
        draws=torch.full((batch, 1, 1), -1, dtype=torch.long, device=device),
        valid=torch.ones(batch, 1, dtype=torch.bool, device=device),
        process=process,
    )
    return DraftBatch(
        tree=tree, draft_probs=None, confidences=torch.ones(batch, 1, device=device),
        entries=torch.full((batch, 1), -1, dtype=torch.long, device=device),
        tokens_in=torch.tensor(list(roots), dtype=torch.long, device=device).unsqueeze(1), pending_width=0,
        max_depth=0,
    )



@dataclass
class HeadTrack:
    """One drafter's per-call state: its cache/state, the pending tokens per row, the last pending width."""

    drafter: Drafter
    state: Any
    pending: list[list[int]]
    pending_width: int = 0
    prefilled: bool = False


def forward_frontier(drafter: Drafter, state: Any, trees: list[RowTree], frontier: list[list[int]],
                      device: torch.device) -> torch.Tensor:
    """One batched drafter pass over every row's frontier nodes (padding entries hang below the context
    and are never kept); records each node's block entry. Returns logits ``[B, F, V]``."""
    batch = len(trees)
    fw = max(1, max(len(f) for f in frontier))
    base = drafter.num_block(state)
    ftoks = torch.zeros(batch, fw, dtype=torch.long)
    fpar = torch.full((batch, fw), -1, dtype=torch.long)
    for b, tr in enumerate(trees):
        for j, node in enumerate(frontier[b]):
            ftoks[b, j] = tr.tokens[node]
            fpar[b, j] = tr.entry[tr.parents[node]]
            tr.entry[node] = base + j
    return drafter.forward(state, ftoks.to(device), fpar.to(device))


def flatten_trees(
    trees: list[RowTree], q_of: list[dict[int, torch.Tensor]], roots: Sequence[int], process: str,
    rank_draws: bool, pending_width: int, device: torch.device,
) -> DraftBatch:
    """Row trees -> :class:`DraftBatch` (alive nodes in creation order). ``rank_draws``: the draws of a
    node are its kept children in rank order (decreasing confidence, then id), as for top-k trees."""
    batch = len(trees)
    kept = [[i for i in range(len(tr.tokens)) if tr.alive[i]] for tr in trees]
    if rank_draws:
        for b, tr in enumerate(trees):
            for i in kept[b]:
                tr.draws[i] = []
            for i in sorted(kept[b][1:], key=lambda i: (-tr.score[i], tr.tokens[i], i)):
                tr.draws[tr.parents[i]].append(tr.tokens[i])
    n = max(len(k) for k in kept)
    kmax = max(1, max(len(tr.draws[i]) for b, tr in enumerate(trees) for i in kept[b]))
    vocab = next((q.shape[-1] for rows in q_of for q in rows.values()), 0)
    tokens = torch.full((batch, n), -1, dtype=torch.long)
    tokens_in = torch.zeros(batch, n, dtype=torch.long)
    parents = torch.full((batch, n), -1, dtype=torch.long)
    depths = torch.full((batch, n), -1, dtype=torch.long)
    draws = torch.full((batch, n, kmax), -1, dtype=torch.long)
    valid = torch.zeros(batch, n, dtype=torch.bool)
    entries = torch.full((batch, n), -1, dtype=torch.long)
    confidences = torch.zeros(batch, n, dtype=torch.float32)
    draft_probs = torch.zeros(batch, n, max(vocab, 1), dtype=torch.float32, device=device)
    for b, tr in enumerate(trees):
        slot = {node: s for s, node in enumerate(kept[b])}
        for s, node in enumerate(kept[b]):
            tokens[b, s] = tr.tokens[node]
            tokens_in[b, s] = tr.tokens[node] if s > 0 else roots[b]
            parents[b, s] = slot[tr.parents[node]] if s > 0 else -1
            depths[b, s] = tr.depths[node]
            if tr.draws[node]:
                draws[b, s, : len(tr.draws[node])] = torch.tensor(tr.draws[node])
            valid[b, s] = True
            entries[b, s] = tr.entry[node]
            confidences[b, s] = tr.score[node]
            if node in q_of[b]:
                draft_probs[b, s] = q_of[b][node]
    tree = FlatTree(tokens.to(device), parents.to(device), depths.to(device), draws.to(device), valid.to(device),
                    process)
    return DraftBatch(tree, draft_probs if vocab else None, confidences.to(device), entries.to(device),
                      tokens_in.to(device), pending_width, max(max(tr.depths) for tr in trees))
