"""Token-level solvers at one node per row, batched (docs/algorithms.md section 3): the twins of
:mod:`spec_ref.solvers` (NSS, naive, SpecTr K-SEQ, SpecInfer, Khisti), consuming each node's uniforms in
the order documented there. :func:`spec_fast.verify.verify_tree` calls them from the top-down driver;
:mod:`spec_fast.verify.otlp` exposes them one node at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from spec_fast._sampling import _WORK, F64, _inverse_cdf, _residual_weights, _rowsum, _Rows, _sub, _take

Tensor = torch.Tensor


@dataclass
class _Node:
    """The current node of every row: p, q ``[R, V]`` float32, draws ``[R, K]``, k ``[R]``, u ``[R, M]``."""

    target: Tensor
    draft: Tensor
    draws: Tensor
    count: Tensor
    u: Tensor
    rows: Tensor  # [R] batch rows
    nodes: Tensor  # [R] node slots


def _solve_nss(node: _Node, ctx: _Rows) -> tuple[Tensor, Tensor]:
    need = torch.ones_like(node.count, dtype=torch.bool)
    y = ctx.draw(need, lambda i: _sub(node.target, i), node.u[:, 0])
    return y, torch.zeros_like(need)


def _solve_naive(node: _Node, ctx: _Rows) -> tuple[Tensor, Tensor]:
    """Naive (3.2): ``u0 * q(x1) < p(x1)`` accepts x1; else ``Cat(Res(p, q))`` with u1. Leaf: ``Cat(p)``, u0."""
    first = node.draws[:, 0]
    leaf = node.count == 0
    u0 = node.u[:, 0].to(torch.float64)
    p_x = _take(node.target, first).to(torch.float64)
    q_x = _take(node.draft, first).to(torch.float64)
    accepted = ~leaf & (u0 * q_x < p_x)
    u_draw = torch.where(leaf, node.u[:, 0], node.u[:, 1] if node.u.shape[1] > 1 else node.u[:, 0])

    def weights(i: Tensor | None) -> Tensor:
        p, q, lf = _sub(node.target, i), _sub(node.draft, i), _sub(leaf, i)
        return _residual_weights(p, q, ~lf)  # a leaf draws from p itself

    y = ctx.draw(~accepted, weights, u_draw)
    return torch.where(accepted, first, y), accepted


def _rho_star(target: Tensor, draft: Tensor, count: Tensor, iterations: int) -> Tensor:
    """SpecTr's rho* per row: the same ``iterations``-step bisection on [1, k] returning the UPPER bracket.

    ``beta(m) = sum min(p/m, q) = (1/m) sum_{p < m q} p + sum_{p >= m q} q``. The ratios ``p/q`` are
    sorted once per row, so each bisection step is a binary search plus two lookups into float64
    cumulative sums instead of a pass over V; the decisions ``1 - (1 - beta)^k <= m * beta`` are those of
    :func:`spec_ref.rho_star` up to float rounding. k <= 1 gives 1.
    """
    rows, vocab = target.shape
    p64 = target.to(torch.float64)
    q64 = draft.to(torch.float64)
    ratio = torch.where(q64 > 0, p64 / q64.clamp_min(torch.finfo(torch.float64).tiny), torch.full_like(p64, float("inf")))
    ratio = torch.where((q64 > 0) | (p64 > 0), ratio, torch.zeros_like(ratio))  # p = q = 0: contributes 0
    sorted_ratio, order = torch.sort(ratio, dim=1)
    p_sorted = p64.gather(1, order)
    q_sorted = q64.gather(1, order)
    zero = torch.zeros(rows, 1, dtype=torch.float64, device=target.device)
    p_below = torch.cat([zero, torch.cumsum(p_sorted, dim=1)], dim=1)  # [R, V+1]: mass of the first i
    q_below = torch.cat([zero, torch.cumsum(q_sorted, dim=1)], dim=1)
    q_total = q_below[:, -1]
    k64 = count.to(torch.float64)
    lo = torch.ones(rows, dtype=torch.float64, device=target.device)
    hi = torch.maximum(k64, lo)
    for _ in range(iterations):
        mid = (lo + hi) / 2
        cut = torch.searchsorted(sorted_ratio, mid.unsqueeze(1), right=False)  # ratios < mid
        beta = p_below.gather(1, cut).squeeze(1) / mid + (q_total - q_below.gather(1, cut).squeeze(1))
        feasible = 1 - (1 - beta) ** k64 <= mid * beta
        hi = torch.where(feasible, mid, hi)
        lo = torch.where(feasible, lo, mid)
    return torch.where(count <= 1, torch.ones_like(hi), hi)


def _solve_spectr(node: _Node, ctx: _Rows, iterations: int) -> tuple[Tensor, Tensor]:
    """SpecTr K-SEQ (3.3): u_j tests x_j with ``u*(rho*q) < p`` for j < k; else ``Cat(R)`` with u_k."""
    rows, k_max = node.draws.shape
    count = node.count
    multi = count >= 2
    rho = torch.ones(rows, dtype=torch.float64, device=count.device)
    idx = ctx.select(multi)
    if idx is None:
        rho = _rho_star(node.target, node.draft, count, iterations)
    elif idx.numel():
        rho[idx] = _rho_star(node.target[idx], node.draft[idx], count[idx], iterations)
    accepted = torch.zeros(rows, dtype=torch.bool, device=count.device)
    choice = torch.zeros(rows, dtype=torch.long, device=count.device)
    for j in range(k_max):
        x = node.draws[:, j]
        p_x = _take(node.target, x).to(torch.float64)
        q_x = _take(node.draft, x).to(torch.float64)
        hit = ~accepted & (j < count) & (node.u[:, j].to(torch.float64) * (rho * q_x) < p_x)
        choice = torch.where(hit, x, choice)
        accepted = accepted | hit
    u_draw = node.u.gather(1, count.clamp(max=node.u.shape[1] - 1).unsqueeze(1)).squeeze(1)

    def weights(i: Tensor | None) -> Tensor:
        p = _sub(node.target, i).to(_WORK)
        q = _sub(node.draft, i).to(_WORK)
        r = _sub(rho, i).unsqueeze(1)
        k = _sub(count, i).to(F64).unsqueeze(1)
        capped = torch.minimum(p / r.to(_WORK), q)
        beta = _rowsum(capped, keepdim=True)
        accept_all = 1 - (1 - beta) ** k
        gamma = torch.where(beta > 0, accept_all / torch.where(beta > 0, beta, torch.ones_like(beta)), r)
        return _residual_weights(p, gamma.to(_WORK) * capped)  # p - gamma*capped, clipped; k = 0 gives p

    y = ctx.draw(~accepted, weights, u_draw)
    return torch.where(accepted, choice, y), accepted


def _normalised_residual(current: Tensor, draft: Tensor) -> Tensor:
    """``Res(current, draft)`` normalised, with the fallback ``current / sum(current)``."""
    mass = (current - draft).clamp_min(0)
    total = mass.sum(dim=1, keepdim=True)
    fallback = current / current.sum(dim=1, keepdim=True)
    return torch.where(total > 0, mass / torch.where(total > 0, total, torch.ones_like(total)), fallback)


def _solve_specinfer(node: _Node, ctx: _Rows, order: str) -> tuple[Tensor, Tensor]:
    """SpecInfer RRS (3.4). Round i: (uniform order) ``integers(k-i)`` picks one of the remaining draws,
    then a uniform tests it against P_i; P_{i+1} = Res(P_i, q). Finally ``Cat(P_k)``."""
    rows, k_max = node.draws.shape
    count = node.count
    device = count.device
    per_round = 2 if order == "uniform" else 1
    accepted = torch.zeros(rows, dtype=torch.bool, device=device)
    choice = torch.zeros(rows, dtype=torch.long, device=device)
    remaining = torch.arange(k_max, device=device).unsqueeze(0) < count.unsqueeze(1)  # [R, K]
    need_chain = count >= 1
    idx = ctx.select(need_chain)
    chain_rows = torch.arange(rows, device=device) if idx is None else idx
    current = node.target[chain_rows].to(_WORK)  # P_i for the chain rows
    draft64 = node.draft[chain_rows].to(_WORK)
    position_in_chain = torch.full((rows,), -1, dtype=torch.long, device=device)
    position_in_chain[chain_rows] = torch.arange(chain_rows.numel(), device=device)
    for i in range(k_max):
        in_round = ~accepted & (i < count)
        left = (count - i).clamp(min=1)
        if order == "uniform":
            u_pick = node.u[:, min(2 * i, node.u.shape[1] - 1)].to(torch.float64)
            pick = torch.minimum((u_pick * left.to(torch.float64)).floor().long(), left - 1)
        else:
            pick = torch.zeros_like(count)
        # position of the pick-th remaining draw
        rank = torch.cumsum(remaining.long(), dim=1) - 1
        slot = ((rank == pick.unsqueeze(1)) & remaining).long().argmax(dim=1)
        x = node.draws.gather(1, slot.unsqueeze(1)).squeeze(1)
        p_x = torch.zeros(rows, dtype=torch.float64, device=device)
        if chain_rows.numel():
            p_x[chain_rows] = current.gather(1, x[chain_rows].clamp(min=0).unsqueeze(1)).squeeze(1).to(F64)
        q_x = _take(node.draft, x).to(torch.float64)
        u_test = node.u[:, min(per_round * i + per_round - 1, node.u.shape[1] - 1)].to(torch.float64)
        hit = in_round & (u_test * q_x < p_x)
        choice = torch.where(hit, x, choice)
        accepted = accepted | hit
        miss = in_round & ~hit
        remaining = remaining & ~(miss.unsqueeze(1) & (torch.arange(k_max, device=device) == slot.unsqueeze(1)))
        if chain_rows.numel():
            advance = miss[chain_rows].unsqueeze(1)
            current = torch.where(advance, _normalised_residual(current, draft64), current)
    u_final = node.u.gather(1, (per_round * count).clamp(max=node.u.shape[1] - 1).unsqueeze(1)).squeeze(1)

    def weights(i: Tensor | None) -> Tensor:
        sel = chain_rows if i is None else i
        has_chain = position_in_chain[sel] >= 0
        chained = current[position_in_chain[sel].clamp(min=0)] if current.shape[0] else node.target[sel].to(_WORK)
        return torch.where(has_chain.unsqueeze(1), chained, node.target[sel].to(_WORK))

    if idx is None:
        y = _inverse_cdf(weights(None), u_final)
    else:
        y = ctx.draw(~accepted, weights, u_final)
    return torch.where(accepted, choice, y), accepted


def _renormalised_beyond_reference_tolerance(rows: np.ndarray) -> np.ndarray:
    """float64 rows ``[R, V]`` handed to the reference LP: rows off 1 by more than the reference's 1e-6
    (a float32 sum over a real vocabulary, within :func:`spec_fast._validate.probability_sum_tolerance`)
    are divided by their sum; the others are passed unchanged, so the LP sees the reference's own input."""
    totals = rows.sum(axis=1, keepdims=True)
    off = np.abs(totals - 1.0) > 1e-6
    return np.where(off & (totals > 0), rows / np.where(totals > 0, totals, 1.0), rows)


def _khisti_plans(target: Tensor, draft: Tensor, count: Tensor, need: Tensor, truncation: int) -> dict[int, Any]:
    """Host LPs (``spec_ref.KhistiSolver.plan``) for the rows in ``need [R]``: row -> SolverPlan.

    One host synchronisation (documented): p and q of those rows are copied to the host in float64, the
    same values the reference validates, so HiGHS sees identical inputs and returns identical weights.
    """
    from spec_ref.solvers import KhistiSolver  # host-side LP routine (same HiGHS call as the reference)

    idx = need.nonzero().squeeze(1).cpu().tolist()
    if not idx:
        return {}
    solver = KhistiSolver(truncation)
    targets = _renormalised_beyond_reference_tolerance(target[idx].to(torch.float64).cpu().numpy())
    drafts = _renormalised_beyond_reference_tolerance(draft[idx].to(torch.float64).cpu().numpy())
    counts = count[idx].cpu().tolist()
    plans: dict[int, Any] = {}
    shared: dict[tuple[bytes, bytes, int], Any] = {}  # rows with identical (p, q, k) share one LP solve
    for n, r in enumerate(idx):
        key = (targets[n].tobytes(), drafts[n].tobytes(), int(counts[n]))
        if key not in shared:
            shared[key] = solver.plan(targets[n], drafts[n], int(counts[n]))
        plans[r] = shared[key]
    return plans


def _khisti_tables(
    draft: Tensor, draws: Tensor, plans: dict[int, Any]
) -> tuple[Tensor, Tensor, Tensor]:
    """``keep [R, K, K]`` (KEEP1 of the champion at draw a vs the challenger at draw t, float64), the
    champion law ``[R, V]`` (float32) and its float64 values at the draws ``[R, K]``; rows without a plan
    (k < 2) get r = q and KEEP1 = 1."""
    rows, k_max = draws.shape
    device = draws.device
    keep = np.ones((rows, k_max, k_max), dtype=np.float64)
    law = draft.clone()
    law_at_draws = _take_all(draft, draws).to(torch.float64).cpu().numpy()
    if plans:
        host_draws = draws.cpu().tolist()
        laws: dict[int, np.ndarray] = {}  # id(plan) -> champion law
        tables: dict[tuple[int, tuple[int, ...]], tuple[np.ndarray, np.ndarray]] = {}
        plan_rows = list(plans)
        for r in plan_rows:
            plan = plans[r]
            tokens = tuple(int(t) for t in host_draws[r][: plan.k])
            key = (id(plan), tokens)
            if key not in tables:
                champion_law = laws.setdefault(id(plan), np.asarray(plan.extras["champion_law"], dtype=np.float64))
                table = np.ones((k_max, k_max), dtype=np.float64)
                for t, pair in enumerate(plan.extras["rounds"], start=1):
                    for a in range(t):
                        table[a, t] = float(pair.keep_first(tokens[a], tokens[t]))
                at_draws = law_at_draws[r].copy()
                at_draws[: plan.k] = champion_law[list(tokens)]
                tables[key] = (table, at_draws)
            keep[r], law_at_draws[r] = tables[key]
        stacked = np.stack([laws[id(plans[r])] for r in plan_rows])
        law[plan_rows] = torch.from_numpy(stacked).to(device=device, dtype=law.dtype)
    return torch.from_numpy(keep).to(device), law, torch.from_numpy(law_at_draws).to(device)


def _take_all(values: Tensor, index: Tensor) -> Tensor:
    """``values[r, index[r, j]]`` for ``values [R, V]``, ``index [R, K]`` (clamped to >= 0)."""
    return values.gather(1, index.clamp(min=0))


def _solve_khisti(node: _Node, ctx: _Rows, truncation: int) -> tuple[Tensor, Tensor]:
    """Khisti (3.5): rounds t = 2..k ``u_{t-2} < KEEP1``; ``u_{k-1} * r(c) < p(c)``; else ``Cat(Res(p, r))``
    with u_k. k = 1 is Naive (r = q); k = 0 is ``Cat(p)`` with u_0."""
    rows, k_max = node.draws.shape
    count = node.count
    device = count.device
    plans = _khisti_plans(node.target, node.draft, count, count >= 2, truncation)
    keep, law, law_at_draws = _khisti_tables(node.draft, node.draws, plans)
    champion_index = torch.zeros(rows, dtype=torch.long, device=device)
    row_ids = torch.arange(rows, device=device)
    for t in range(1, k_max):
        active = t < count
        keep_prob = keep[row_ids, champion_index, t]
        stays = node.u[:, min(t - 1, node.u.shape[1] - 1)].to(torch.float64) < keep_prob
        champion_index = torch.where(active & ~stays, torch.full_like(champion_index, t), champion_index)
    champion = node.draws.gather(1, champion_index.unsqueeze(1)).squeeze(1)
    r_c = law_at_draws.gather(1, champion_index.unsqueeze(1)).squeeze(1)
    p_c = _take(node.target, champion).to(torch.float64)
    u_test = node.u.gather(1, (count - 1).clamp(min=0).unsqueeze(1)).squeeze(1).to(torch.float64)
    leaf = count == 0
    accepted = ~leaf & (u_test * r_c < p_c)
    u_draw = node.u.gather(1, count.clamp(max=node.u.shape[1] - 1).unsqueeze(1)).squeeze(1)

    def weights(i: Tensor | None) -> Tensor:
        p, r, lf = _sub(node.target, i), _sub(law, i), _sub(leaf, i)
        return _residual_weights(p, r, ~lf)

    y = ctx.draw(~accepted, weights, u_draw)
    return torch.where(accepted, champion, y), accepted
