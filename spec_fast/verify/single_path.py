"""Single-path verifiers on path 0 of a batch of trees (docs/algorithms.md section 5): block verification
and tree verification (``bv``, ``tree_mc``), in the randomness layout of :func:`spec_ref.verify`. Naive
speculative sampling (5.1) is the top-down driver of :mod:`spec_fast.verify` stopping at the first rejection.
"""

from __future__ import annotations

import torch

from spec_fast._sampling import _WORK, F64, _residual_weights, _rowsum, _Rows, _sub
from spec_fast.flat_tree import FlatTree

Tensor = torch.Tensor


def _path_weights(
    tree: FlatTree, target_probs: Tensor, draft_probs: Tensor, path: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Path 0's prefix weights ``w [B, D+1]`` (float64), length ``L [B]`` and drafted tokens ``x [B, D+1]``
    (``x[:, i]`` = token of path node i, -1 past the leaf). ``w_i = min(1, (w_{i-1} p(x_i)) / q(x_i))``."""
    batch, width = path.shape
    device = path.device
    rows = torch.arange(batch, device=device)
    valid = path >= 0
    length = valid.long().sum(dim=1) - 1
    tokens = torch.where(valid, tree.tokens.gather(1, path.clamp(min=0)), torch.full_like(path, -1))
    w = torch.ones(batch, width, dtype=torch.float64, device=device)
    for i in range(1, width):
        parent = path[:, i - 1].clamp(min=0)
        x = tokens[:, i].clamp(min=0)
        p_x = target_probs[rows, parent, x].to(torch.float64)
        q_x = draft_probs[rows, parent, x].to(torch.float64)
        ratio = w[:, i - 1] * p_x / torch.where(q_x > 0, q_x, torch.ones_like(q_x))
        w[:, i] = torch.where(valid[:, i], torch.clamp(ratio, max=1.0), w[:, i - 1])
    return w, length, tokens


def _bv_driver(
    tree: FlatTree, target_probs: Tensor, draft_probs: Tensor, uniforms: Tensor, path: Tensor, ctx: _Rows
) -> tuple[Tensor, Tensor]:
    """Block verification (docs/algorithms.md section 5.2) in spec_ref's layout: node v_i's row holds [u < h_i, extra]."""
    batch, width = path.shape
    device = path.device
    rows = torch.arange(batch, device=device)
    w, length, _ = _path_weights(tree, target_probs, draft_probs, path)
    h = torch.ones(batch, width, dtype=torch.float64, device=device)  # h[:, i] = h_i (i >= 1)
    for i in range(1, width - 1):
        need = i < length
        idx = ctx.select(need)
        sel = rows if idx is None else idx
        if sel.numel() == 0:
            continue
        node = path[sel, i].clamp(min=0)
        p = target_probs[sel, node].to(_WORK)  # a fresh copy: updated in place
        q = draft_probs[sel, node].to(_WORK)
        w_i = w[sel, i]
        z = _rowsum(p.mul_(w_i.to(_WORK).unsqueeze(1)).sub_(q).clamp_min_(0))
        d = z + (1 - w_i)
        h_i = torch.where(d > 0, z / torch.where(d > 0, d, torch.ones_like(d)), torch.ones_like(d))
        h[sel, i] = torch.where(need[sel], h_i, h[sel, i])
    h_last = w.gather(1, length.unsqueeze(1)).squeeze(1)
    if width > 1:  # h_L = w_L
        last = length.clamp(min=1).unsqueeze(1)
        h.scatter_(1, last, torch.where(length > 0, h_last, h.gather(1, last).squeeze(1)).unsqueeze(1))
    tau = torch.zeros(batch, dtype=torch.long, device=device)
    for i in range(width - 1, 0, -1):  # deepest first; tau = the largest accepted index
        node = path[:, i].clamp(min=0)
        u_i = uniforms[rows, node, 0].to(torch.float64)
        hit = (tau == 0) & (i <= length) & (u_i < h[:, i])
        tau = torch.where(hit, torch.full_like(tau, i), tau)
    stop_node = path.gather(1, tau.unsqueeze(1)).squeeze(1)
    u_extra = torch.where(tau > 0, uniforms[rows, stop_node, min(1, uniforms.shape[2] - 1)], uniforms[rows, stop_node, 0])
    full = tau == length
    w_tau = w.gather(1, tau.unsqueeze(1)).squeeze(1)

    def weights(i: Tensor | None) -> Tensor:
        sel = rows if i is None else i
        p = target_probs[sel, stop_node[sel]].to(_WORK)
        q = draft_probs[sel, stop_node[sel]].to(_WORK)
        f = full[sel]
        scale = torch.where(f, torch.ones_like(w_tau[sel]), w_tau[sel]).to(_WORK).unsqueeze(1)
        return _residual_weights(p.mul_(scale), q, ~f)  # tau = L: Cat(p_L); else Res(w_tau p_tau, q_tau)

    y = ctx.draw(torch.ones_like(full), weights, u_extra)
    return stop_node, y


def _tree_mc_driver(
    tree: FlatTree, target_probs: Tensor, draft_probs: Tensor, uniforms: Tensor, path: Tensor, ctx: _Rows
) -> tuple[Tensor, Tensor]:
    """Hu & Huang's tree verification (docs/algorithms.md section 5.3): one inverse-CDF draw over the L x V cells,
    done as row totals then one row, with the root's uniforms [cell draw, bonus draw]."""
    batch, width = path.shape
    device = path.device
    rows = torch.arange(batch, device=device)
    if width == 1:  # every row is a lone root: L = 0, the only draw is Cat(p_0)
        root = torch.zeros(batch, dtype=torch.long, device=device)
        need = torch.ones(batch, dtype=torch.bool, device=device)
        return root, ctx.draw(need, lambda i: target_probs[_sub(rows, i), 0], uniforms[:, 0, 0])
    s, length, tokens = _path_weights(tree, target_probs, draft_probs, path)  # s_j == BV's w_j
    big = width - 1  # cell rows j = 1..big
    scale = torch.ones(batch, width, dtype=torch.float64, device=device)  # scale[:, j] = t_j
    row_mass = torch.zeros(batch, width, dtype=torch.float64, device=device)  # sum_v mass_j(v) - mass_j(x_j)
    for j in range(1, big + 1):
        need = j <= length
        idx = ctx.select(need)
        sel = rows if idx is None else idx
        if sel.numel() == 0:
            continue
        parent = path[sel, j - 1].clamp(min=0)
        p = target_probs[sel, parent].to(_WORK)
        q = draft_probs[sel, parent].to(_WORK)
        s_prev = s[sel, j - 1].unsqueeze(1).to(_WORK)
        diff = p.mul_(s_prev).sub_(q)  # s p - q, in place on the fresh copy
        mass = diff.clamp_min(0)
        excess = -_rowsum(diff.clamp_max_(0))  # sum (q - s p)_+
        x = tokens[sel, j].clamp(min=0)
        t_j = torch.where(excess > 0, (1 - s[sel, j]) / torch.where(excess > 0, excess, torch.ones_like(excess)),
                          torch.ones_like(excess))
        scale[sel, j] = torch.where(need[sel], t_j, scale[sel, j])
        total = _rowsum(mass) - mass.gather(1, x.unsqueeze(1)).squeeze(1).to(F64)
        row_mass[sel, j] = torch.where(need[sel], total, row_mass[sel, j])
    # coef_j = prod_{m=j..L} t_m (cells of row j are rescaled by every later step)
    in_path = torch.arange(width, device=device).unsqueeze(0) <= length.unsqueeze(1)
    logless = torch.where(in_path, scale, torch.ones_like(scale))
    coef = torch.flip(torch.cumprod(torch.flip(logless, [1]), dim=1), [1])
    s_last = s.gather(1, length.unsqueeze(1)).squeeze(1)
    totals = torch.where(in_path, coef * row_mass, torch.zeros_like(coef))
    totals[:, 0] = 0
    if width > 1:  # the "accept all" cell (L, x_L) holds s_L
        totals.scatter_add_(
            1, length.clamp(min=1).unsqueeze(1), torch.where(length > 0, s_last, torch.zeros_like(s_last)).unsqueeze(1)
        )
    u_cell = uniforms[:, 0, 0].to(torch.float64)
    cumulative = torch.cumsum(totals, dim=1)
    grand = cumulative[:, -1].contiguous()
    threshold = u_cell * grand
    row_j = torch.searchsorted(cumulative, threshold.unsqueeze(1).contiguous(), right=True).squeeze(1)
    last_row = torch.searchsorted(cumulative, grand.unsqueeze(1).contiguous(), right=False).squeeze(1)
    row_j = torch.minimum(row_j, last_row).clamp(min=1, max=big)  # max: NaN totals (unvalidated input)
    before = cumulative.gather(1, (row_j - 1).unsqueeze(1)).squeeze(1)
    within = ((threshold - before) / coef.gather(1, row_j.unsqueeze(1)).squeeze(1)).clamp_min(0)
    in_row = torch.zeros(batch, dtype=torch.long, device=device)
    chosen_parent = path.gather(1, (row_j - 1).unsqueeze(1)).squeeze(1).clamp(min=0)
    x_row = tokens.gather(1, row_j.unsqueeze(1)).squeeze(1).clamp(min=0)
    is_last = row_j == length
    has_cells = length > 0
    idx = ctx.select(has_cells)
    sel = rows if idx is None else idx
    if sel.numel():
        p = target_probs[sel, chosen_parent[sel]].to(_WORK)
        q = draft_probs[sel, chosen_parent[sel]].to(_WORK)
        s_prev = s.gather(1, (row_j - 1).unsqueeze(1)).squeeze(1)[sel].unsqueeze(1).to(_WORK)
        mass = (s_prev * p - q).clamp_min(0)
        # the drafted token's cell: 0, or s_L (unscaled, so divide by the row's coefficient) on the last row
        cell_x = torch.where(is_last[sel], s_last[sel] / coef.gather(1, row_j.unsqueeze(1)).squeeze(1)[sel],
                             torch.zeros_like(s_last[sel]))
        mass = mass.to(F64)  # the chosen row only: accumulate it exactly like the row totals
        mass.scatter_(1, x_row[sel].unsqueeze(1), cell_x.unsqueeze(1))
        cum = torch.cumsum(mass, dim=1)
        pick = torch.searchsorted(cum, within[sel].unsqueeze(1).contiguous(), right=True)
        last_pos = torch.searchsorted(cum, cum[:, -1:].contiguous(), right=False)
        in_row[sel] = torch.minimum(pick, last_pos).squeeze(1).clamp(0, mass.shape[1] - 1)
    coupled = has_cells & is_last & (in_row == x_row)
    leaf = path.gather(1, length.unsqueeze(1)).squeeze(1)
    stop_node = torch.where(coupled | ~has_cells, leaf, chosen_parent)
    need_bonus = coupled | ~has_cells
    u_bonus = torch.where(has_cells, uniforms[:, 0, min(1, uniforms.shape[2] - 1)], uniforms[:, 0, 0])
    bonus = ctx.draw(need_bonus, lambda i: target_probs[_sub(rows, i), _sub(stop_node, i)], u_bonus)
    return stop_node, torch.where(need_bonus, bonus, in_row)
