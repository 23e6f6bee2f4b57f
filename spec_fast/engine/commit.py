"""The commit phase's host-side bookkeeping: one read-back of a step's small tensors, each drafter's
kept entries and pending tokens after the step, and the padded index rows the cache gathers take.

The engine (:meth:`spec_fast.engine.SpeculativeDecoder._commit_phase`) walks the accepted path of every
row with these helpers; none of them launches a model pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from spec_fast.drafts.batch import DraftBatch, HeadTrack
from spec_fast.drafts.dual import DualDraft
from spec_fast.kv_cache import TreeKVCache
from spec_fast.verify.tree import Verified

__all__ = ["read_back", "HostVerified", "verify_greedy_chain_on_host", "advance_head", "aligned",
           "is_block_prefix", "pad_rows"]


_Rows = list[list[int]]
#: :func:`read_back`'s answer: accepted slots, tree tokens, next tokens, accepted counts, tree depths, the routed
#: head (0 unless routed), the head of each slot (dual) and each drafter's entries per slot, all on the host
HostRows = tuple[_Rows, _Rows, list[int], list[int], list[int], list[int], _Rows, list[_Rows]]


@dataclass(frozen=True, eq=False)
class HostVerified(Verified):
    """A verification computed on the host, which keeps what :func:`read_back` would read back of it
    (``rows``), so the commit reads nothing again."""

    rows: HostRows


def verify_greedy_chain_on_host(draft: DraftBatch, best: torch.Tensor, heads: int) -> HostVerified:
    """The greedy verification of chains (``draft.chain``, slot d at depth d, parent d - 1; capped rows'
    deeper slots invalid) from ``best [B, N]`` long, each slot's target argmax, in one read of the step's
    small tensors: the accepted depth is the length of the leading run of levels whose token is the argmax at
    the level above, the next token the argmax at the last accepted level (what
    :func:`spec_fast.verify.verify_greedy` returns on such trees). The commit's rows of ``heads`` drafters that
    all hold ``draft.entries`` come with it."""
    tree = draft.tree
    slots_n = tree.num_slots
    flat = torch.cat([best.to(torch.long), tree.tokens, tree.valid.to(torch.long), tree.depths, draft.entries],
                     dim=1).tolist()
    slots: _Rows = []
    tokens: _Rows = []
    entries: _Rows = []
    nxt, nacc, depths = [], [], []
    for row in flat:
        argmax, row_tokens = row[:slots_n], row[slots_n:2 * slots_n]
        valid, row_depths = row[2 * slots_n:3 * slots_n], row[3 * slots_n:4 * slots_n]
        depth = 0
        while depth + 1 < slots_n and valid[depth + 1] and row_tokens[depth + 1] == argmax[depth]:
            depth += 1
        slots.append([i if i <= depth else -1 for i in range(slots_n)])
        tokens.append(row_tokens)
        entries.append(row[4 * slots_n:])
        nxt.append(argmax[depth])
        nacc.append(depth)
        depths.append(max(row_depths))
    zeros = [0] * len(flat)
    rows: HostRows = (slots, tokens, nxt, nacc, depths, zeros, [[0] * slots_n for _ in flat],
                      [entries] * heads)
    device = best.device
    return HostVerified(torch.tensor(slots, dtype=torch.long, device=device),
                        torch.tensor(nacc, dtype=torch.long, device=device),
                        torch.tensor(nxt, dtype=torch.long, device=device), rows)


def read_back(verified: Verified, draft: DraftBatch, dual: DualDraft | None, entries: Sequence[torch.Tensor]
              ) -> HostRows:
    """The step's small tensors on the host, in one transfer: accepted slots, tree tokens, next tokens,
    accepted counts, tree depths, the routed head (0 unless routed), the head of each slot (dual) and each
    drafter's entries per slot (a :class:`HostVerified`'s own rows, read nothing, where every drafter holds
    ``draft.entries``: no dual draft)."""
    if isinstance(verified, HostVerified) and dual is None:
        return verified.rows
    tree = draft.tree
    column = torch.zeros_like(verified.next_token)
    choice = dual.choice if dual is not None and dual.choice is not None else column
    parts = [verified.accepted_slots, tree.tokens, verified.next_token.unsqueeze(1),
             verified.accepted_depth.unsqueeze(1), tree.depths.max(dim=1).values.unsqueeze(1), choice.unsqueeze(1),
             dual.heads if dual is not None else torch.zeros_like(tree.tokens)]
    parts.extend(entries)
    flat = torch.cat([p.to(torch.long) for p in parts], dim=1).tolist()
    widths = [p.shape[1] for p in parts]
    cut = [sum(widths[:i]) for i in range(len(widths) + 1)]
    cols = [[row[cut[i]:cut[i + 1]] for row in flat] for i in range(len(parts))]
    return (cols[0], cols[1], [r[0] for r in cols[2]], [r[0] for r in cols[3]], [r[0] for r in cols[4]],
            [r[0] for r in cols[5]], cols[6], [cols[7 + h] for h in range(len(entries))])


def advance_head(head: HeadTrack, b: int, path: list[int], tokens: list[int], entries: list[int], next_token: int,
                 drafted: bool) -> list[int]:
    """Row b of one drafter after the step: the block entries it keeps (its pending entries, then the
    accepted nodes it holds until the first it lacks), and its new pending tokens (the accepted tokens it
    lacks, then the next root)."""
    if not drafted:  # a plain step: the drafter saw nothing; everything committed waits for it
        seen = head.pending[b] + [tokens[i] for i in path[1:]]
        absorb = getattr(head.drafter, "absorb", None)
        if absorb is not None:
            # a drafter that needs no pass over committed tokens (retrieval) records them now, as the prefill
            # records a prompt: fed later as pending tokens, each cost a law and a row of [B, W, V] logits
            # at the next drafted step (about 0.1 ms a token, all but the root's unused)
            absorb(head.state, [seen if row == b else [] for row in range(len(head.pending))])
            seen = []
        head.pending[b] = seen + [next_token]
        return []
    width = head.pending_width
    keep = list(range(width - len(head.pending[b]), width))
    missing: list[int] = []
    for i in path[1:]:
        if entries[i] >= 0 and not missing:
            keep.append(entries[i])
        else:
            missing.append(tokens[i])
    head.pending[b] = missing + [next_token]
    return keep


def aligned(state: Any) -> bool:
    """True when every row's context fills the physical context (no padding slots), from the cache's
    host-side flag (no device read); False for states that are not a :class:`TreeKVCache`."""
    return isinstance(state, TreeKVCache) and not state.padded


def is_block_prefix(keep: list[list[int]], counts: list[int], aligned: bool) -> bool:
    """Host-side check for :meth:`TreeKVCache.commit`'s truncation fast path."""
    if not aligned or not counts or any(c != counts[0] for c in counts):
        return False
    return all(row[: counts[0]] == list(range(counts[0])) for row in keep)


def pad_rows(rows: list[list[int]], device: torch.device) -> torch.Tensor:
    """Ragged index rows as one zero-padded ``[B, max(1, longest)]`` long tensor on ``device``."""
    width = max(1, max((len(r) for r in rows), default=1))
    out = torch.zeros(len(rows), width, dtype=torch.long)
    for b, r in enumerate(rows):
        if r:
            out[b, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out.to(device)
