"""Traversal verification of a batch of trees (docs/algorithms.md section 6), ``sibling_model`` "wor" or
"wr", in the randomness layout of :func:`spec_ref.verify`. Keeps ``[B, D+1, V]`` float32 state for the
current root-to-leaf stack (P and Q).
"""

from __future__ import annotations

import torch

from spec_fast._sampling import _WORK, _rowsum, _Rows
from spec_fast.flat_tree import FlatTree

Tensor = torch.Tensor


def _round_tables(tree: FlatTree, sibling_model: str) -> tuple[Tensor, Tensor]:
    """``first [B, N, K]`` (draw j is its token's first occurrence) and ``next_round [B, N, K+1]``: the first
    round position >= j (WOR: first occurrences only; WR: every draw), K when none is left."""
    batch, n, k = tree.draws.shape
    device = tree.draws.device
    draws = tree.draws
    earlier = torch.ones(k, k, dtype=torch.bool, device=device).tril(-1)  # [j, j'] j' < j
    same = (draws.unsqueeze(3) == draws.unsqueeze(2)) & earlier  # [B, N, j, j']
    first = (draws >= 0) & ~same.any(dim=3)
    is_round = first if sibling_model == "wor" else draws >= 0
    positions = torch.arange(k + 1, device=device)
    candidate = torch.where(is_round, positions[:k], torch.full_like(draws, k))  # [B, N, K]
    candidate = torch.cat([candidate, torch.full((batch, n, 1), k, dtype=torch.long, device=device)], dim=2)
    next_round = torch.flip(torch.cummin(torch.flip(candidate, [2]), dim=2).values, [2])
    return first, next_round


def _traversal_driver(
    tree: FlatTree,
    target_probs: Tensor,
    draft_probs: Tensor,
    uniforms: Tensor,
    children: Tensor,
    max_depth: int,
    sibling_model: str,
    ctx: _Rows,
) -> tuple[Tensor, Tensor]:
    """Traversal verification (docs/algorithms.md section 6) in true post-order with children in draw order.

    The state (w, P, Q) of a node only changes while it is on the current root-to-leaf stack, so it is
    kept per stack level (``[B, D+1, V]``, written only once a node has rejected a round); a node's weight
    is computed when the walk descends into it, from its parent's current state, which equals the
    reference's eager REFRESH. Each step of the loop does one action per row: a WR duplicate round (an
    automatic REJECT, no draw), a descent into the first remaining round, or a test ``u < w`` of the
    first leaf in post-order (accept, or pop + REJECT at the parent).
    """
    batch, n, k = tree.draws.shape
    vocab = target_probs.shape[2]
    device = tree.tokens.device
    rows = torch.arange(batch, device=device)
    levels = max_depth + 1
    first, next_round = _round_tables(tree, sibling_model)
    stack = torch.zeros(batch, levels, dtype=torch.long, device=device)
    top = torch.zeros(batch, dtype=torch.long, device=device)
    weight = torch.ones(batch, levels, dtype=torch.float64, device=device)
    modified = torch.zeros(batch, levels, dtype=torch.bool, device=device)
    # only read where ``modified`` is set (torch.where never propagates the unselected branch): no zero-fill
    state_p = torch.empty(batch, levels, vocab, dtype=target_probs.dtype, device=device)
    state_q = torch.empty(batch, levels, vocab, dtype=draft_probs.dtype, device=device)
    pointer = next_round[:, :, 0].clone()  # [B, N] next round position of every node
    alive = torch.ones(batch, dtype=torch.bool, device=device)
    final_node = torch.zeros(batch, dtype=torch.long, device=device)
    final_level = torch.zeros(batch, dtype=torch.long, device=device)
    draw_next = torch.zeros(batch, dtype=torch.bool, device=device)  # accepted, bonus still to draw

    def current_pq(sel: Tensor, level: Tensor) -> tuple[Tensor, Tensor]:
        node = stack[sel, level]
        mod = modified[sel, level].unsqueeze(1)
        if ctx.compact:  # gather each row from where it lives instead of selecting between both
            p = target_probs[sel, node].to(_WORK)
            q = draft_probs[sel, node].to(_WORK)
            changed = mod.squeeze(1).nonzero().squeeze(1)
            if changed.numel():
                p[changed] = state_p[sel[changed], level[changed]].to(_WORK)
                q[changed] = state_q[sel[changed], level[changed]].to(_WORK)
            return p, q
        p = torch.where(mod, state_p[sel, level], target_probs[sel, node]).to(_WORK)
        q = torch.where(mod, state_q[sel, level], draft_probs[sel, node]).to(_WORK)
        return p, q

    def current_at(sel: Tensor, level: Tensor, token: Tensor) -> tuple[Tensor, Tensor]:
        node = stack[sel, level]
        mod = modified[sel, level]
        tok = token.clamp(min=0)
        p = torch.where(mod, state_p[sel, level, tok], target_probs[sel, node, tok]).to(torch.float64)
        q = torch.where(mod, state_q[sel, level, tok], draft_probs[sel, node, tok]).to(torch.float64)
        return p, q

    def reject(need: Tensor, level: Tensor, token: Tensor) -> None:
        idx = ctx.select(need)
        sel = rows if idx is None else idx
        if sel.numel() == 0:
            return
        lev = level[sel]
        p, q = current_pq(sel, lev)
        w = weight[sel, lev]
        mass = torch.mul(p, w.to(_WORK).unsqueeze(1)).sub_(q).clamp_min_(0)
        z = _rowsum(mass)
        d = z + (1 - w)
        updated = torch.where(d > 0, z / torch.where(d > 0, d, torch.ones_like(d)), torch.ones_like(d))
        updated = torch.clamp(updated, max=1.0)  # w <- Z/(Z + 1 - w) with the CURRENT w (6.2)
        positive = z > 0
        z_work = torch.where(positive, z, torch.ones_like(z)).to(_WORK).unsqueeze(1)
        # P <- Rm / Z; if Z = 0 then Rm is all zeros and P stays (adding P to zeros is exact)
        new_p = mass.div_(z_work).addcmul_(p, (~positive).to(_WORK).unsqueeze(1))
        if sibling_model == "wor":
            q.scatter_(1, token[sel].clamp(min=0).unsqueeze(1), 0.0)  # q is a fresh copy
            total = _rowsum(q, keepdim=True)
            q.div_(torch.where(total > 0, total, torch.ones_like(total)).to(_WORK))
        apply = need[sel]
        if ctx.compact:  # sel holds exactly the rows that reject
            state_p[sel, lev] = new_p.to(state_p.dtype)
            state_q[sel, lev] = q.to(state_q.dtype)
        else:
            a2 = apply.unsqueeze(1)
            state_p[sel, lev] = torch.where(a2, new_p.to(state_p.dtype), state_p[sel, lev])
            state_q[sel, lev] = torch.where(a2, q.to(state_q.dtype), state_q[sel, lev])
        modified[sel, lev] = modified[sel, lev] | apply
        weight[sel, lev] = torch.where(apply, updated, weight[sel, lev])

    max_steps = 2 * n + n * k + 1
    for _ in range(max_steps):
        if ctx.compact and not bool(alive.any()):
            break
        u_node = stack[rows, top]
        position = pointer[rows, u_node]  # [B]
        has_round = position < k
        pos = position.clamp(max=k - 1) if k > 0 else position
        child = children[rows, u_node, pos] if k > 0 else torch.full_like(u_node, -1)
        dup = has_round & ~first[rows, u_node, pos] if k > 0 else torch.zeros_like(has_round)
        token = tree.draws[rows, u_node, pos] if k > 0 else torch.full_like(u_node, -1)
        # (1) WR duplicate round: automatic rejection at u, advance u's pointer.
        do_dup = alive & has_round & dup
        # (2) descend into the first remaining round.
        do_push = alive & has_round & ~dup
        # (3) u is the first leaf in post-order: root -> accept; else test u < w_u.
        do_test = alive & ~has_round
        at_root = do_test & (top == 0)
        u_test = uniforms[rows, u_node, 0].to(torch.float64)
        w_top = weight[rows, top]
        accept = do_test & ~at_root & (u_test < w_top)
        pop = do_test & ~at_root & ~accept
        done = at_root | accept
        final_node = torch.where(done, u_node, final_node)
        final_level = torch.where(done, top, final_level)
        draw_next = draw_next | done
        alive = alive & ~done
        # descent: w_c = min(1, (w_u P_u(x)) / Q_u(x)), 0 if Q_u(x) = 0
        if bool(do_push.any()) if ctx.compact else True:
            p_x, q_x = current_at(rows, top, token)
            ratio = weight[rows, top] * p_x / torch.where(q_x > 0, q_x, torch.ones_like(q_x))
            w_child = torch.where(q_x > 0, torch.clamp(ratio, max=1.0), torch.zeros_like(ratio))
            new_top = (top + 1).clamp(max=levels - 1)
            stack[rows, new_top] = torch.where(do_push, child, stack[rows, new_top])
            weight[rows, new_top] = torch.where(do_push, w_child, weight[rows, new_top])
            modified[rows, new_top] = modified[rows, new_top] & ~do_push
            top = torch.where(do_push, new_top, top)
        # duplicate: pointer of u advances, REJECT(u, x)
        advance_dup = next_round[rows, u_node, (pos + 1).clamp(max=k)] if k > 0 else position
        pointer[rows, u_node] = torch.where(do_dup, advance_dup, pointer[rows, u_node])
        reject(do_dup, top, token)
        # pop: parent's pointer advances past u's round, REJECT(parent, token(u))
        parent_level = (top - 1).clamp(min=0)
        parent = stack[rows, parent_level]
        parent_pos = pointer[rows, parent].clamp(max=max(k - 1, 0))
        advance_pop = next_round[rows, parent, (parent_pos + 1).clamp(max=k)] if k > 0 else pointer[rows, parent]
        pointer[rows, parent] = torch.where(pop, advance_pop, pointer[rows, parent])
        top = torch.where(pop, parent_level, top)
        reject(pop, top, tree.tokens[rows, u_node])
    # the extra token: Cat(P_u*) with the node's row: first uniform at the root, second otherwise
    u_extra = torch.where(
        final_node == 0, uniforms[rows, final_node, 0], uniforms[rows, final_node, min(1, uniforms.shape[2] - 1)]
    )

    def weights(i: Tensor | None) -> Tensor:
        sel = rows if i is None else i
        p, _ = current_pq(sel, final_level[sel])
        return p

    y = ctx.draw(draw_next, weights, u_extra)
    return final_node, y
