"""Draft-tree construction, batched over ``B`` rows: the twin of :mod:`spec_ref.drafting` and
:func:`spec_ref.draft_dynatree`.

Every builder first feeds each row's *pending* tokens to the drafter (committed tokens its cache lacks,
ending with the row's root token: :func:`pending_forward`), then grows the tree level by level, one
batched drafter pass per level over the new frontier with a tree attention mask, and returns a
:class:`DraftBatch`. The builders and the :mod:`spec_ref` functions whose decisions they reproduce:

=========================  =====================================  ===========================
builder                    tree                                   spec_ref twin
=========================  =====================================  ===========================
:func:`draft_chain`        one path of ``depth`` tokens           ``draft_iid_tree(K=1)``
:func:`draft_iid_tree`     ``K`` i.i.d. paths                     ``draft_iid_tree``
:func:`draft_delayed_tree` trunk ``L1``, then ``K`` branches      ``draft_delayed_tree``
:func:`draft_topk_tree`    budgeted top-k (deterministic)         ``draft_topk_tree``
:func:`draft_dynatree`     DynaTree (deterministic, adaptive)     ``draft_dynatree``
=========================  =====================================  ===========================

The tree bookkeeping of the branching builders is host-side (small per-row Python trees, one read-back of
the frontier's top tokens or draws per level); the chain builder reads nothing back.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from spec_fast.draws import RowStreams, categorical
from spec_fast.drafts.model import Drafter
from spec_fast.flat_tree import FlatTree
from spec_ref.dynatree import DynaTreeParams, branch_count, expands

__all__ = [
    "DraftBatch",
    "pending_forward",
    "draft_root_only",
    "draft_chain",
    "draft_iid_tree",
    "draft_delayed_tree",
    "draft_topk_tree",
    "draft_dynatree",
    "ranked_tokens",
    "row_depths",
    "cap_rows",
]

#: ``[B, F, V]`` draft logits -> ``[B, F, V]`` float32 law the drafter samples from (the engine's choice)
DraftLaw = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True, eq=False)
class DraftBatch:
    """One step's drafted trees, one per row, slot 0 the root.

    * ``tree``: :class:`FlatTree` (``tokens``, ``parents``, ``depths``, ``draws``, ``valid`` ``[B, N]``);
    * ``draft_probs [B, N, V]`` float32: the law each node's draws were sampled from (zero rows for nodes
      without draws); ``None`` for a root-only batch;
    * ``confidences [B, N]`` float32: product of the draft probabilities along the path to the node (root
      1; ``spec_ref.ScoredDraftTree.confidences``); meaningful for deterministic trees only (0 on sampled
      trees);
    * ``entries [B, N]`` long: the drafter's block entry holding each node (-1: none, e.g. the last level,
      which is never forwarded);
    * ``tokens_in [B, N]`` long: the token each slot feeds the target (slot 0: the root token);
    * ``pending_width``: width of the pending block the drafter was fed first (its last entry is the root);
    * ``max_depth``: the largest node depth, known on the host (saves a device read in verification).
    """

    tree: FlatTree
    draft_probs: torch.Tensor | None
    confidences: torch.Tensor
    entries: torch.Tensor
    tokens_in: torch.Tensor
    pending_width: int
    max_depth: int

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
    return drafter.forward(state, ptoks.to(device), ppar.to(device))[:, -1:], width


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
                      draft.max_depth)


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


def draft_chain(
    drafter: Drafter, state: Any, pending: Sequence[Sequence[int]], roots: Sequence[int], depth: int,
    draft_law: DraftLaw, streams: RowStreams, device: torch.device,
) -> DraftBatch:
    """A single path of ``depth`` draft tokens, drafted without reading anything back to the host.

    One inverse-CDF draw per row and level from the row's stream (the draws :func:`draft_iid_tree` with
    K = 1 makes; a one-hot law, the greedy chain's, gives its argmax); the shape is known in advance, so
    the tree is assembled from device tensors. Cut rows to shorter depths with :func:`cap_rows`.
    """
    batch = len(pending)
    logits, width = pending_forward(drafter, state, pending, device)
    tokens: list[torch.Tensor] = []  # [B] per depth
    qs: list[torch.Tensor] = []  # [B, V] per depth
    entries = [width - 1]
    for level in range(depth):
        q = draft_law(logits)[:, 0]
        token = categorical(q, streams.uniforms(level, 1)).squeeze(1)
        tokens.append(token)
        qs.append(q)
        if level + 1 >= depth:
            break
        base = drafter.num_block(state)
        parent = torch.full((batch, 1), entries[-1], dtype=torch.long, device=device)
        logits = drafter.forward(state, token.unsqueeze(1), parent)
        entries.append(base)
    drafted = torch.stack(tokens, dim=1)  # [B, D]
    pad = torch.full((batch, 1), -1, dtype=torch.long, device=device)
    steps = torch.arange(depth + 1, device=device).unsqueeze(0).expand(batch, depth + 1)
    tree = FlatTree(
        tokens=torch.cat([pad, drafted], dim=1), parents=steps - 1, depths=steps.clone(),
        draws=torch.cat([drafted, pad], dim=1).unsqueeze(-1),
        valid=torch.ones(batch, depth + 1, dtype=torch.bool, device=device), process="iid",
    )
    law = torch.stack(qs, dim=1)  # [B, D, V]
    draft_probs = torch.cat([law, torch.zeros_like(qs[0]).unsqueeze(1)], dim=1).float()
    taken = torch.gather(law, 2, drafted.unsqueeze(2)).squeeze(2).float()  # q(x_d) [B, D]
    confidences = torch.cat([torch.ones(batch, 1, device=device), torch.cumprod(taken, dim=1)], dim=1)
    entry_row = torch.tensor(entries + [-1], dtype=torch.long, device=device)
    tokens_in = torch.cat([torch.tensor(list(roots), dtype=torch.long, device=device).unsqueeze(1), drafted], dim=1)
    return DraftBatch(tree, draft_probs, confidences, entry_row.unsqueeze(0).expand(batch, depth + 1).contiguous(),
                      tokens_in, width, depth)


def _forward_frontier(drafter: Drafter, state: Any, trees: list[RowTree], frontier: list[list[int]],
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
        logits = _forward_frontier(drafter, state, trees, frontier, device)
    return _flatten(trees, q_of, roots, "iid", False, width, device)


def draft_iid_tree(
    drafter: Drafter, state: Any, pending: Sequence[Sequence[int]], roots: Sequence[int], depth: int,
    num_paths: int, draft_law: DraftLaw, streams: RowStreams, device: torch.device,
) -> DraftBatch:
    """K i.i.d. paths of ``depth`` tokens (:func:`spec_ref.draft_iid_tree`)."""
    return draft_delayed_tree(drafter, state, pending, roots, depth, num_paths, 0, draft_law, streams, device)


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
        logits = _forward_frontier(drafter, state, trees, frontier, device)
    return _flatten(trees, q_of, roots, "deterministic", True, width, device)


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
        q = torch.softmax(_forward_frontier(drafter, state, trees, expand, device).float(), dim=-1)
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
    return _flatten(trees, [{} for _ in range(batch)], roots, "deterministic", False, width, device), depths


def _flatten(
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
