"""Prefill: the prompts enter the target cache (with the first step's root logits) and each drafter.

The prefill runs the whole prompt, so the first step takes the root's logits from it and forwards only
the drafted nodes (:meth:`spec_fast.engine.SpeculativeDecoder._target_phase`).
"""

from __future__ import annotations

from typing import Any

import torch

from spec_fast.drafts.model import Drafter
from spec_fast.engine.prefix_cache import PrefixCache
from spec_fast.kv_cache import TreeKVCache

__all__ = ["chain_block", "prefill_target", "prefill_target_reusing", "prefill_drafter"]


def chain_block(prompts: list[list[int]], device: torch.device, drop_last: bool = True
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Each prompt (all but its last token with ``drop_last``) as a right-padded chain block:
    ``(tokens [B, W], parents [B, W], lengths [B], W)``."""
    cut = 1 if drop_last else 0
    lengths = [len(p) - cut for p in prompts]
    width = max(lengths)
    tokens = torch.zeros(len(prompts), width, dtype=torch.long)
    parents = torch.full((len(prompts), width), -1, dtype=torch.long)
    for b, p in enumerate(prompts):
        if lengths[b] > 0:
            tokens[b, : lengths[b]] = torch.tensor(p[: len(p) - cut], dtype=torch.long)
            parents[b, 1 : lengths[b]] = torch.arange(lengths[b] - 1)
    return tokens.to(device), parents.to(device), torch.tensor(lengths, device=device), width


def prefill_target(
    state: TreeKVCache, prompts: list[list[int]], device: torch.device, hidden: bool = False, previous: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None, tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
           tuple[torch.Tensor, torch.Tensor] | None]:
    """Prefill the target with every prompt token and commit them.

    Returns ``(root_logits [B, V], root_hidden [B, 1, H] or None, observe, before)``: the logits (and, with
    ``hidden``, the final hidden state) at each prompt's last token, the root of the first step; and
    ``observe = (hidden [B, W, H], keep [B, W], counts [B])`` of the entries before the root for
    :meth:`Drafter.observe_target` (None without ``hidden`` or when no prompt has an entry before it).
    Only the logits from the shortest prompt's root onwards are computed (HF ``logits_to_keep``).
    ``previous`` (needs ``hidden``) also returns as ``before`` the logits ``[B, V]`` and final hidden state
    ``[B, H]`` at the token before each root (the root's own for a one-token prompt), for the NDE selector.
    """
    tokens, parents, lengths, width = chain_block(prompts, device, drop_last=False)
    root_index = lengths - 1  # [B]
    lowest_root = min(len(p) for p in prompts) - 1
    if previous:
        lowest_root = max(lowest_root - 1, 0)
    # prompts of one length: every row one chain (with padding after a shorter prompt, it is not)
    out = state.forward(tokens, parents, output_hidden_states=hidden, logits_to_keep=width - lowest_root,
                        chain=len({len(p) for p in prompts}) == 1)
    keep = torch.arange(width, device=device).expand(len(prompts), width)
    state.commit(keep, lengths)
    rows = torch.arange(len(prompts), device=device)
    root_logits = out.logits[rows, root_index - lowest_root]  # [B, V]
    if not hidden:
        return root_logits, None, None, None
    states = out.hidden_states[-1]  # [B, W, H]
    root_hidden = states[rows, root_index].unsqueeze(1)
    observe = (states, keep, root_index) if width > 1 else None  # root_index = entries before the root
    before = None
    if previous:
        prev_index = (root_index - 1).clamp(min=0)
        before = (out.logits[rows, prev_index - lowest_root], states[rows, prev_index])
    return root_logits, root_hidden, observe, before


def prefill_target_reusing(state: TreeKVCache, prompts: list[list[int]], device: torch.device,
                           prefix_cache: PrefixCache) -> tuple[torch.Tensor, list[int]]:
    """:func:`prefill_target` (without hidden states) through ``prefix_cache``: each prompt's longest cached
    prefix is loaded instead of computed, the pass forwards the rest, and every prompt's entries are stored
    for later prompts (:mod:`spec_fast.engine.prefix_cache`). Returns ``(root_logits [B, V], reused)``:
    ``reused[b]`` = prompt b's tokens whose entries were reused."""
    dtype = getattr(state.model, "kv_cache_dtype", torch.float32)
    matches = [prefix_cache.lookup(p, dtype) for p in prompts]
    if any(m.length > 0 for m in matches):
        state.load_context([m.layers if m.length > 0 else None for m in matches])
    # the rest of each prompt, behind its loaded context (positions follow the rows' lengths)
    root_logits = prefill_target(state, [p[m.length:] for p, m in zip(prompts, matches)], device)[0]
    for b, prompt in enumerate(prompts):
        prefix_cache.store(prompt, state.key_values(b))
    return root_logits, [m.length for m in matches]


def prefill_drafter(drafter: Drafter, state: Any, prompts: list[list[int]], device: torch.device) -> bool:
    """Feed every prompt token but the root to ``drafter``; True when that took a pass."""
    absorb = getattr(drafter, "absorb", None)
    if absorb is not None:  # a drafter that needs no pass over a prompt (retrieval) just records it
        absorb(state, [p[:-1] for p in prompts])
        return False
    tokens, parents, lengths, width = chain_block(prompts, device)
    if width > 0:
        drafter.forward(state, tokens, parents)
        drafter.commit(state, torch.arange(width, device=device).expand(len(prompts), width), lengths)
    return width > 0
