"""The chain proposer: one path of ``depth`` draft tokens per row (the twin of ``spec_ref.draft_iid_tree``
with K = 1)."""

from __future__ import annotations

from collections.abc import Sequence
import math
from typing import Any

import numpy as np
import torch

from spec_fast._sampling import first_max_index
from spec_fast.draws import RowStreams, categorical
from spec_fast.drafts.batch import DraftBatch, DraftLaw, argmax_law, cap_rows, pending_forward
from spec_fast.drafts.dual import DualDraft
from spec_fast.drafts.model import Drafter
from spec_fast.drafts.proposer import SingleHeadProposer, StepRows
from spec_fast.flat_tree import FlatTree
from spec_fast.verify.tree import Verified

__all__ = ["ChainProposer", "draft_chain"]


def draft_chain(
    drafter: Drafter, state: Any, pending: Sequence[Sequence[int]], roots: Sequence[int], depth: int,
    draft_law: DraftLaw, streams: RowStreams, device: torch.device,
) -> DraftBatch:
    """A single path of ``depth`` draft tokens, drafted without reading anything back to the host.

    One inverse-CDF draw per row and level from the row's stream (the draws :func:`draft_iid_tree` with
    K = 1 makes; a one-hot law, the greedy chain's, gives its argmax, which :func:`argmax_law` takes without
    a draw); the shape is known in advance, so the tree is assembled from device tensors. Cut rows to
    shorter depths with :func:`cap_rows`. A drafter whose :meth:`~Drafter.chain_depths` answers stops the
    chain where no row would draft the next level (the tree is then that much shallower) and cuts each row
    to its own depth.
    """
    batch = len(pending)
    greedy = draft_law is argmax_law
    # a drafter that drafts on the host (retrieval: its law is a few matched ids) drafts a greedy chain there
    greedy_next_rows = getattr(drafter, "greedy_next_rows", None) if greedy else None
    if greedy_next_rows is not None:
        return _greedy_chain_on_host(drafter, greedy_next_rows, state, pending, roots, depth, device)
    sparse_next_rows = getattr(drafter, "sparse_next_rows", None) if not greedy else None
    if sparse_next_rows is not None:
        return _sampled_chain_on_host(drafter, sparse_next_rows, state, pending, roots, depth, draft_law, streams,
                                      device)
    logits, width = pending_forward(drafter, state, pending, device)
    tokens: list[torch.Tensor] = []  # [B] per depth
    qs: list[torch.Tensor] = []  # [B, V] per depth
    entries = [width - 1]
    for level in range(depth):
        if greedy:
            token = first_max_index(logits[:, 0])
        else:
            q = draft_law(logits)[:, 0]
            token = categorical(q, streams.uniforms(level, 1)).squeeze(1)
            qs.append(q)
        tokens.append(token)
        if level + 1 >= depth:
            break
        base = drafter.num_block(state)
        parent = torch.full((batch, 1), entries[-1], dtype=torch.long, device=device)
        logits = drafter.forward(state, token.unsqueeze(1), parent)
        entries.append(base)
        if not _next_level_drafted(drafter, state, entries, level):
            break
    depth = len(tokens)
    drafted = torch.stack(tokens, dim=1)  # [B, D]
    pad = torch.full((batch, 1), -1, dtype=torch.long, device=device)
    steps = torch.arange(depth + 1, device=device).unsqueeze(0).expand(batch, depth + 1)
    tree = FlatTree(
        tokens=torch.cat([pad, drafted], dim=1), parents=steps - 1, depths=steps.clone(),
        draws=torch.cat([drafted, pad], dim=1).unsqueeze(-1),
        valid=torch.ones(batch, depth + 1, dtype=torch.bool, device=device), process="iid",
    )
    draft_probs: torch.Tensor | None
    if greedy:
        # every row is greedy (argmax_law is the law of all-greedy batches alone), so verification compares
        # tokens with the target's argmax and reads no q: the one-hot rows of argmax_law are not built (a
        # [B, depth + 1, V] tensor written, then masked again by cap_rows, at every drafted step); every
        # q(x_d) is 1
        draft_probs = None
        confidences = torch.ones(batch, depth + 1, device=device)
    else:
        law = torch.stack(qs, dim=1)  # [B, D, V]
        draft_probs = torch.cat([law, torch.zeros_like(qs[0]).unsqueeze(1)], dim=1).float()
        taken = torch.gather(law, 2, drafted.unsqueeze(2)).squeeze(2).float()  # q(x_d) [B, D]
        confidences = torch.cat([torch.ones(batch, 1, device=device), torch.cumprod(taken, dim=1)], dim=1)
    # the last level's tokens were forwarded only where the chain ended early (to ask for the next level)
    entry_row = torch.tensor(entries + [-1] * (depth + 1 - len(entries)), dtype=torch.long, device=device)
    tokens_in = torch.cat([torch.tensor(list(roots), dtype=torch.long, device=device).unsqueeze(1), drafted], dim=1)
    draft = DraftBatch(tree, draft_probs, confidences, entry_row.unsqueeze(0).expand(batch, depth + 1).contiguous(),
                       tokens_in, width, depth, chain=True)
    return _cut_to_chain_depths(drafter, state, entries[:depth], draft)


def _next_level_drafted(drafter: Drafter, state: Any, entries: list[int], level: int) -> bool:
    """Whether some row drafts level ``level + 1`` (0-based) of its chain, asked once the tokens of level
    ``level`` were forwarded (``entries``: the block entry of the root and of each forwarded level): the
    drafter's :meth:`~Drafter.chain_depths`, None meaning every row; where no row does, the chain ends."""
    depths = drafter.chain_depths(state, entries)
    return depths is None or max(depths, default=0) >= level + 2


def _pending_block(pending: Sequence[Sequence[int]]) -> tuple[int, list[list[int]], list[list[int]]]:
    """:func:`pending_forward`'s block as host-side rows: its width, and each row's pending chain right-aligned
    (zeros and parents -1 before it) with its parents."""
    width = max(len(p) for p in pending)
    feed = [[0] * (width - len(p)) + [int(t) for t in p] for p in pending]
    feed_parents = [[-1] * (width - len(p) + 1) + list(range(width - len(p), width - 1)) for p in pending]
    return width, feed, feed_parents


def _host_levels(drafter: Drafter, next_rows: Any, pick: Any, state: Any, pending: Sequence[Sequence[int]],
                 depth: int) -> tuple[int, list[list[int]], list[int]]:
    """The levels of a chain drafted on the host by a drafter whose ``next_rows(state, tokens, parents)`` takes
    host-side rows (the pending block first, then each level's tokens behind the last entry), as
    :func:`pending_forward` and :meth:`~Drafter.forward` would take their tensors, with ``chain_depths`` asked
    after each forwarded level: ``pick(found, level)`` turns what ``next_rows`` gave into the level's tokens.
    Returns the block's width, ``levels[d][b]`` and the block entries of the root and of each forwarded level."""
    batch = len(pending)
    width, feed, feed_parents = _pending_block(pending)
    found = next_rows(state, feed, feed_parents)
    levels: list[list[int]] = []
    entries = [width - 1]
    for level in range(depth):
        level_tokens: list[int] = pick(found, level)
        levels.append(level_tokens)
        if level + 1 >= depth:
            break
        base = drafter.num_block(state)
        found = next_rows(state, [[t] for t in level_tokens], [[entries[-1]]] * batch)
        entries.append(base)
        if not _next_level_drafted(drafter, state, entries, level):
            break
    return width, levels, entries


def _greedy_chain_on_host(drafter: Drafter, greedy_next_rows: Any, state: Any, pending: Sequence[Sequence[int]],
                          roots: Sequence[int], depth: int, device: torch.device) -> DraftBatch:
    """:func:`draft_chain` of a greedy chain for a drafter whose ``greedy_next_rows`` takes and gives host-side
    rows (retrieval): the same drafter calls in the same order (the pending block, then one level at a time,
    ``chain_depths`` after each) and the same draft, its tensors built once at the end instead of a few small
    tensor operations per level around a drafter that reads them back anyway."""
    width, levels, entries = _host_levels(drafter, greedy_next_rows, lambda tokens, level: tokens, state, pending,
                                          depth)
    draft = _host_chain(levels, roots, entries, width, None, torch.ones(len(roots), len(levels) + 1, device=device),
                        device)
    return _cut_to_chain_depths(drafter, state, entries[:len(levels)], draft)


def _host_chain(levels: list[list[int]], roots: Sequence[int], entries: list[int], width: int,
                draft_probs: torch.Tensor | None, confidences: torch.Tensor, device: torch.device) -> DraftBatch:
    """The chain drafted level by level on the host (``levels[d][b]``: row b's token at depth d + 1) as a
    :class:`DraftBatch`, its tensors built once: slot d at depth d, its parent d - 1, ``entries`` the block
    entries of the root and of each forwarded level."""
    batch, depth = len(roots), len(levels)
    drafted = [[levels[d][b] for d in range(depth)] for b in range(batch)]
    steps = list(range(depth + 1))
    long = torch.long
    tree = FlatTree(
        tokens=torch.tensor([[-1] + row for row in drafted], dtype=long, device=device),
        parents=torch.tensor([[s - 1 for s in steps]] * batch, dtype=long, device=device),
        depths=torch.tensor([steps] * batch, dtype=long, device=device),
        draws=torch.tensor([[[t] for t in row] + [[-1]] for row in drafted], dtype=long, device=device),
        valid=torch.ones(batch, depth + 1, dtype=torch.bool, device=device), process="iid",
    )
    entry_row = entries + [-1] * (depth + 1 - len(entries))
    return DraftBatch(tree, draft_probs, confidences, torch.tensor([entry_row] * batch, dtype=long, device=device),
                      torch.tensor([[int(r)] + row for r, row in zip(roots, drafted, strict=True)], dtype=long,
                                   device=device), width, depth, chain=True)


def _sampled_chain_on_host(drafter: Drafter, sparse_next_rows: Any, state: Any, pending: Sequence[Sequence[int]],
                           roots: Sequence[int], depth: int, draft_law: DraftLaw, streams: RowStreams,
                           device: torch.device) -> DraftBatch:
    """:func:`draft_chain` for a drafter whose ``sparse_next_rows`` gives each row's law as a few ids and
    weights (retrieval): each level's law is ``draft_law`` of the ``log(weights)`` of the matched ids alone
    (``-inf`` past a row's ids), and the level's token the same inverse-CDF draw with the same uniform, over
    those ids; the dense ``draft_probs`` row holds exactly these values at the ids (zeros elsewhere, where the
    dense logits' law is zero too), so the tokens are drawn from the law the verifier reads. The same drafter
    calls in the same order as the dense path; G over ``[B, 1, V]`` logits and a draw over ``V`` per level
    cost more than the rest of the step's drafting."""
    batch = len(pending)
    vocab = int(getattr(drafter, "vocab_size"))
    qs: list[torch.Tensor] = []  # [B, V] per level
    taken: list[torch.Tensor] = []  # [B] q(x) per level

    def draw(laws: list[tuple[np.ndarray, np.ndarray]], level: int) -> list[int]:
        ids = [np.asarray(i, dtype=np.int64) if len(i) else np.zeros(1, dtype=np.int64) for i, _ in laws]
        logs = [np.log(w).astype(np.float32) if len(w) else np.zeros(1, dtype=np.float32) for _, w in laws]
        columns = max(len(i) for i in ids)
        compact = torch.full((batch, 1, columns), -math.inf)
        at = torch.full((batch, columns), vocab, dtype=torch.long)  # padding lands in a spare column
        for b in range(batch):
            compact[b, 0, :len(logs[b])] = torch.from_numpy(logs[b])
            at[b, :len(ids[b])] = torch.from_numpy(ids[b])
        at = at.to(device)
        q = draft_law(compact.to(device))[:, 0]  # [B, columns]
        pick = categorical(q, streams.uniforms(level, 1))  # [B, 1]
        dense = torch.zeros(batch, vocab + 1, dtype=torch.float32, device=device)
        qs.append(dense.scatter_(1, at, q)[:, :vocab])
        taken.append(q.gather(1, pick).squeeze(1))
        return [int(t) for t in at.gather(1, pick).squeeze(1).tolist()]

    width, levels, entries = _host_levels(drafter, sparse_next_rows, draw, state, pending, depth)
    draft_probs = torch.stack(qs + [torch.zeros_like(qs[0])], dim=1)  # [B, D + 1, V]
    confidences = torch.cat([torch.ones(batch, 1, device=device), torch.cumprod(torch.stack(taken, dim=1), dim=1)],
                            dim=1)
    draft = _host_chain(levels, roots, entries, width, draft_probs, confidences, device)
    return _cut_to_chain_depths(drafter, state, entries[:len(levels)], draft)


def _cut_to_chain_depths(drafter: Drafter, state: Any, entries: list[int], draft: DraftBatch) -> DraftBatch:
    """``draft`` with each row cut to the depth the drafter's :meth:`~Drafter.chain_depths` gives it for the
    block ``entries`` its levels were drawn from (at least one level; unchanged where it answers None)."""
    depths = drafter.chain_depths(state, entries)
    return draft if depths is None else cap_rows(draft, [max(1, d) for d in depths])


class ChainProposer(SingleHeadProposer):
    """``chain:L``: one path per row, drafted on the device (a host-side drafter's greedy chain on the host) and
    cut to each row's depth cap."""

    greedy_argmax = True

    def gate_caps(self, rows: StepRows, caps: list[int]) -> list[int]:
        """``caps`` with 0 for the rows whose drafter answers False to
        :meth:`~spec_fast.drafts.model.Drafter.drafts_first_level` (retrieval where its match forecasts a
        loss)."""
        head = rows.heads[0]
        first_level = head.drafter.drafts_first_level
        return [cap if cap < 1 or first_level(head.state, b, head.pending[b]) else 0 for b, cap in enumerate(caps)]

    def draft(self, rows: StepRows, depth_cap: int, law: DraftLaw, device: torch.device
              ) -> tuple[DraftBatch, DualDraft | None]:
        draft = cap_rows(draft_chain(*self.head_args(rows), depth_cap, law, rows.draft_streams(), device),
                         rows.depth_caps)
        rows.heads[0].pending_width = draft.pending_width
        return draft, None

    def after_commit(self, rows: StepRows, dual: DualDraft | None, verified: Verified, accepted: Sequence[int]
                     ) -> None:
        head = rows.heads[0]
        head.drafter.observe_chain(head.state, accepted, rows.depth_caps)
