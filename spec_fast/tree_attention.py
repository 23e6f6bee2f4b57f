"""Tree (ancestor) attention masks and depth-based position ids for one batched forward over a draft tree.

A forward during a decoding step sees two kinds of key/value entries:

* the **committed context** of row ``b``: physical cache slots ``[0, context_lengths[b])`` (rows are
  left-aligned; slots past a row's length up to the common physical size are padding and are masked);
* the **block**: entries appended during the current step (the pending tokens and the draft tree nodes),
  ``E`` of them, at physical slots ``[context_size, context_size + E)``. Entry ``e`` may attend to entry
  ``f`` iff ``f`` is an ancestor of ``e`` or ``e`` itself (``ancestors[b, e, f]``).

Position ids are depth based: an entry at block depth ``d`` (0 for an entry attached directly to the
context) has position ``context_lengths[b] + d``, so every tree node is encoded exactly as it would be on
its own path (docs/engine.md section 2: DynaTree's reference code omits this).
"""

from __future__ import annotations

import torch

__all__ = ["extend_ancestors", "tree_attention_mask", "additive_mask"]


def extend_ancestors(
    ancestors: torch.Tensor, parents: torch.Tensor
) -> torch.Tensor:
    """Append ``Q`` new block entries to an ancestor relation.

    Args:
        ancestors: ``[B, E, E]`` bool, ancestor-or-self relation of the existing block entries.
        parents: ``[B, Q]`` long, block index of each new entry's parent (an old entry, or an earlier
            new entry: ``parents[b, j] < E + j``), ``-1`` when the entry hangs directly below the
            committed context.

    Returns:
        ``[B, E + Q, E + Q]`` bool: the relation including the new entries (each is its own ancestor).
    """
    batch, num_old = ancestors.shape[0], ancestors.shape[1]
    num_new = parents.shape[1]
    device = ancestors.device
    total = num_old + num_new
    # each new entry reaches itself and its parent; the relation is then closed by doubling the reach
    # (reach(e) |= reach(f) for every f that e reaches): after k rounds an entry reaches every ancestor up to
    # 2^k steps up, so ceil(log2(total)) rounds close it, whatever the tree. Entry by entry it took four
    # small tensor operations per new entry (0.2 ms for a 5-node chain on one CPU thread).
    reach = torch.zeros(batch, total, total, dtype=torch.float32, device=device)
    reach[:, :num_old, :num_old] = ancestors.to(torch.float32)
    new = torch.arange(num_old, total, device=device)
    reach[:, new, new] = 1.0
    has_parent = parents >= 0  # [B, Q]
    parent_edge = torch.nn.functional.one_hot(parents.clamp(min=0), total).to(torch.float32)  # [B, Q, total]
    reach[:, num_old:] += parent_edge * has_parent.unsqueeze(-1).to(torch.float32)
    for _ in range(max(1, (total - 1).bit_length())):
        # counts of paths, not booleans: clamped back to 0/1 each round (exact in float32 below 2^24 entries)
        reach = torch.bmm(reach, reach).clamp_(max=1.0)
    return reach > 0


def tree_attention_mask(
    context_lengths: torch.Tensor, context_size: int, ancestors: torch.Tensor, num_query: int
) -> torch.Tensor:
    """Boolean attention mask for the last ``num_query`` block entries.

    Args:
        context_lengths: ``[B]`` long, committed entries per row (``<= context_size``).
        context_size: physical number of context slots before the block.
        ancestors: ``[B, E, E]`` bool ancestor-or-self relation of all block entries (queries are the last
            ``num_query`` of them).
        num_query: number of query entries ``Q``.

    Returns:
        ``[B, 1, Q, context_size + E]`` bool, True where attention is allowed.
    """
    batch, num_entries = ancestors.shape[0], ancestors.shape[1]
    device = ancestors.device
    slots = torch.arange(context_size, device=device)
    context_part = (slots.unsqueeze(0) < context_lengths.unsqueeze(1))  # [B, S]
    context_part = context_part.unsqueeze(1).expand(batch, num_query, context_size)
    block_part = ancestors[:, num_entries - num_query :, :]  # [B, Q, E]
    return torch.cat([context_part, block_part], dim=2).unsqueeze(1)


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[B, 1, Q, K]`` bool mask -> additive float mask (0 where allowed, ``finfo.min`` elsewhere).

    A float mask works for both the SDPA and the eager attention of HF models (eager adds the mask);
    ``finfo.min`` rather than ``-inf`` keeps fully masked padding rows finite.
    """
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    low = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=mask.device)
    return torch.where(mask, zero, low)
