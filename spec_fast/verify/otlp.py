"""The five token-level OTLP solvers of docs/algorithms.md section 3, batched over ``B`` rows, equal to spec_ref.solvers.

Every function takes ``target_probs [B, V]`` (p) and ``draft_probs [B, V]`` (q) float32 tensors; draws are
``draft_tokens [B, K]`` long in draw order, ``-1`` padded (row b has ``k_b`` = its number of non-negative
entries, which must come first). Solver names and options are those of ``spec_ref.SOLVERS`` /
``spec_ref.verify``: ``nss, naive, spectr (spectr_iterations), specinfer (specinfer_order), khisti
(khisti_truncation)``.

* :func:`solver_sample` -> ``[B]`` tokens from ``uniforms [B, M]`` consumed in the budget of
  ``spec_ref/solvers.py`` (identical to one node of :func:`spec_fast.verify_tree`);
* :func:`solver_branching` -> ``[B, V]`` float64: the exact law of the output given the draws
  (docs/algorithms.md section 3, with the corrected Alg 14 for SpecInfer and the tournament DP for Khisti);
* :func:`solver_acceptance` -> ``[B]`` float64: ``P(Y in {X_1..X_k})`` with ``k`` i.i.d. draws from q
  (closed forms; Khisti by enumerating the ``V**k`` draft tuples, as the reference does).

Khisti's pair LPs run on the host through :class:`spec_ref.KhistiSolver` (one synchronisation per call).
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from spec_fast._sampling import _Rows
from spec_fast._validate import check_probabilities, check_token_ids, check_uniforms
from spec_fast.verify.solvers import (
    _khisti_plans,
    _khisti_tables,
    _Node,
    _normalised_residual,
    _rho_star,
    _solve_khisti,
    _solve_naive,
    _solve_nss,
    _solve_specinfer,
    _solve_spectr,
)

__all__ = ["SOLVER_NAMES", "solver_sample", "solver_branching", "solver_acceptance"]

SOLVER_NAMES = ("nss", "naive", "spectr", "specinfer", "khisti")
Tensor = torch.Tensor


def _check(
    solver: str, target_probs: Tensor, draft_probs: Tensor, draft_tokens: Tensor | None = None,
    uniforms: Tensor | None = None,
) -> None:
    """Shapes, then values (spec_fast/_validate.py): finite, non-negative, normalised p and q, token ids in
    [0, V) with -1 padding after the draws, uniforms in [0, 1)."""
    if solver not in SOLVER_NAMES:
        raise ValueError(f"solver={solver!r} must be one of {SOLVER_NAMES}")
    if target_probs.dim() != 2 or draft_probs.shape != target_probs.shape:
        raise ValueError(
            f"target_probs.shape={tuple(target_probs.shape)} and draft_probs.shape={tuple(draft_probs.shape)} "
            "must both be (B, V)"
        )
    check_probabilities("target_probs", target_probs)
    check_probabilities("draft_probs", draft_probs)
    if draft_tokens is not None:
        if draft_tokens.dim() != 2 or draft_tokens.shape[0] != target_probs.shape[0]:
            raise ValueError(f"draft_tokens.shape={tuple(draft_tokens.shape)} must be (B, K) with B={target_probs.shape[0]}")
        check_token_ids("draft_tokens", draft_tokens, int(target_probs.shape[1]), padding=torch.ones_like(draft_tokens, dtype=torch.bool))
    if uniforms is not None:
        check_uniforms("uniforms", uniforms)


def _at_least_one_column(draft_tokens: Tensor) -> Tensor:
    """``[B, max(K, 1)]``: a K = 0 batch gets one padding column (every row is then a leaf)."""
    if draft_tokens.shape[1] > 0:
        return draft_tokens
    return torch.full((draft_tokens.shape[0], 1), -1, dtype=torch.long, device=draft_tokens.device)


def _accept_probability(draft_mass: Tensor, target_mass: Tensor) -> Tensor:
    """P(u * draft < target): 0 if target <= 0, 1 if draft <= 0 < target, else min(1, target/draft)."""
    safe = torch.where(draft_mass > 0, draft_mass, torch.ones_like(draft_mass))
    ratio = torch.clamp(target_mass / safe, max=1.0)
    return torch.where(target_mass > 0, torch.where(draft_mass > 0, ratio, torch.ones_like(ratio)), torch.zeros_like(ratio))


def solver_sample(
    solver: str, target_probs: Tensor, draft_probs: Tensor, draft_tokens: Tensor, uniforms: Tensor, **options: Any
) -> Tensor:
    """``[B]`` output tokens; ``uniforms [B, M]`` in the solver's budget order (``spec_ref/solvers.py``)."""
    _check(solver, target_probs, draft_probs, draft_tokens, uniforms)
    draft_tokens = _at_least_one_column(draft_tokens)
    rows = torch.arange(target_probs.shape[0], device=target_probs.device)
    node = _Node(target_probs, draft_probs, draft_tokens, (draft_tokens >= 0).sum(dim=1), uniforms, rows, rows * 0)
    ctx = _Rows(target_probs.device.type == "cpu")
    if solver == "nss":
        y, _ = _solve_nss(node, ctx)
    elif solver == "naive":
        y, _ = _solve_naive(node, ctx)
    elif solver == "spectr":
        y, _ = _solve_spectr(node, ctx, int(options.get("spectr_iterations", 64)))
    elif solver == "specinfer":
        y, _ = _solve_specinfer(node, ctx, str(options.get("specinfer_order", "uniform")))
    else:
        y, _ = _solve_khisti(node, ctx, int(options.get("khisti_truncation", 5)))
    return y


def _spectr_plan(p: Tensor, q: Tensor, count: Tensor, iterations: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """rho [B], beta [B], accept_all [B] and the normalised residual law [B, V] (float64)."""
    rho = _rho_star(p, q, count, iterations)
    p64, q64 = p.to(torch.float64), q.to(torch.float64)
    capped = torch.minimum(p64 / rho.unsqueeze(1), q64)
    beta = capped.sum(dim=1)
    k64 = count.to(torch.float64)
    accept_all = 1 - (1 - beta) ** k64
    gamma = torch.where(beta > 0, accept_all / torch.where(beta > 0, beta, torch.ones_like(beta)), rho)
    mass = (p64 - gamma.unsqueeze(1) * capped).clamp_min(0)
    total = mass.sum(dim=1, keepdim=True)
    law = torch.where(total > 0, mass / torch.where(total > 0, total, torch.ones_like(total)), p64 / p64.sum(1, keepdim=True))
    return rho, beta, accept_all, law


def _specinfer_chain(p: Tensor, q: Tensor, k_max: int) -> list[Tensor]:
    chain = [p.to(torch.float64)]
    q64 = q.to(torch.float64)
    for _ in range(k_max):
        chain.append(_normalised_residual(chain[-1], q64))
    return chain


def solver_branching(
    solver: str, target_probs: Tensor, draft_probs: Tensor, draft_tokens: Tensor, **options: Any
) -> Tensor:
    """``[B, V]`` float64: the law of the solver's output given the draws ``draft_tokens [B, K]``."""
    _check(solver, target_probs, draft_probs, draft_tokens)
    draft_tokens = _at_least_one_column(draft_tokens)
    batch, vocab = target_probs.shape
    k_max = draft_tokens.shape[1]
    count = (draft_tokens >= 0).sum(dim=1)
    p64 = target_probs.to(torch.float64)
    q64 = draft_probs.to(torch.float64)
    leaf = (count == 0).unsqueeze(1)
    tokens = draft_tokens.clamp(min=0)
    if solver == "nss":
        return p64.clone()
    if solver == "naive":
        a = _accept_probability(q64.gather(1, tokens[:, :1]), p64.gather(1, tokens[:, :1]))  # [B, 1]
        law = (1 - a) * _normalised_residual(p64, q64)
        law = law.scatter_add(1, tokens[:, :1], a)
        return torch.where(leaf, p64, law)
    if solver == "spectr":
        rho, _, _, residual_law = _spectr_plan(target_probs, draft_probs, count, int(options.get("spectr_iterations", 64)))
        law = torch.zeros_like(p64)
        survive = torch.ones(batch, dtype=torch.float64, device=p64.device)
        for j in range(k_max):
            x = tokens[:, j : j + 1]
            a = _accept_probability(rho * q64.gather(1, x).squeeze(1), p64.gather(1, x).squeeze(1))
            a = torch.where(j < count, a, torch.zeros_like(a))
            law = law.scatter_add(1, x, (survive * a).unsqueeze(1))
            survive = survive * (1 - a)
        return torch.where(leaf, p64, law + survive.unsqueeze(1) * residual_law)
    if solver == "specinfer":
        return _specinfer_branching(p64, q64, tokens, count, str(options.get("specinfer_order", "uniform")))
    plans = _khisti_plans(target_probs, draft_probs, count, count >= 2, int(options.get("khisti_truncation", 5)))
    keep, champion_law, law_at_draws = _khisti_tables(draft_probs, draft_tokens, plans)
    champion_law64 = champion_law.to(torch.float64)
    for r, plan in plans.items():  # the exact float64 law of the host plan
        champion_law64[r] = torch.as_tensor(plan.extras["champion_law"].astype(float), dtype=torch.float64)
    pi = torch.zeros(batch, k_max, dtype=torch.float64, device=p64.device)
    pi[:, 0] = 1
    for t in range(1, k_max):
        active = (t < count).unsqueeze(1)
        stay = pi[:, :t] * keep[:, :t, t]
        moved = (pi[:, :t] * (1 - keep[:, :t, t])).sum(dim=1)
        new = pi.clone()
        new[:, :t] = stay
        new[:, t] = moved
        pi = torch.where(active, new, pi)
    a = _accept_probability(law_at_draws, p64.gather(1, tokens))  # [B, K]
    mass = torch.where(torch.arange(k_max, device=p64.device) < count.unsqueeze(1), pi * a, torch.zeros_like(pi))
    law = torch.zeros_like(p64).scatter_add(1, tokens, mass)
    residual = _normalised_residual(p64, champion_law64)
    return torch.where(leaf, p64, law + (1 - mass.sum(dim=1, keepdim=True)) * residual)


def _specinfer_branching(p64: Tensor, q64: Tensor, tokens: Tensor, count: Tensor, order: str) -> Tensor:
    """Corrected Alg 14 (docs/algorithms.md section 3.4) as a DP over the bitmask of remaining draw positions."""
    batch, k_max = tokens.shape
    if k_max > 12:
        raise ValueError(f"specinfer branching enumerates 2**K masks; K={k_max} > 12 is too many")
    chain = torch.stack(_specinfer_chain(p64, q64, k_max), dim=1)  # [B, K+1, V]
    rows = torch.arange(batch, device=p64.device)
    q_at = q64.gather(1, tokens)  # [B, K]
    laws: dict[int, Tensor] = {}
    for mask in sorted(range(1 << k_max), key=lambda m: bin(m).count("1")):
        size = bin(mask).count("1")
        rejections = (count - size).clamp(min=0)  # i = k - |S|
        if mask == 0:
            laws[0] = chain[rows, count]
            continue
        positions = [j for j in range(k_max) if mask >> j & 1]
        if order == "draw":
            positions = positions[:1]
        total = torch.zeros_like(p64)
        current = chain[rows, rejections]  # P_i
        for j in positions:
            a = _accept_probability(q_at[:, j], current.gather(1, tokens[:, j : j + 1]).squeeze(1))
            part = (1 - a).unsqueeze(1) * laws[mask & ~(1 << j)]
            total = total + part.scatter_add(1, tokens[:, j : j + 1], a.unsqueeze(1))
        laws[mask] = total / len(positions)
    full = (1 << count) - 1  # [B]
    stacked = torch.stack([laws[m] for m in range(1 << k_max)], dim=1)  # [B, 2**K, V]
    return stacked[rows, full]


def solver_acceptance(
    solver: str, target_probs: Tensor, draft_probs: Tensor, k: int | Tensor, **options: Any
) -> Tensor:
    """``[B]`` float64: P(output in {X_1..X_k}) for ``k`` i.i.d. draws from q (int or ``[B]`` tensor)."""
    _check(solver, target_probs, draft_probs)
    batch, vocab = target_probs.shape
    device = target_probs.device
    count = torch.as_tensor(k, device=device).expand(batch).to(torch.long)
    k64 = count.to(torch.float64).unsqueeze(1)
    p64 = target_probs.to(torch.float64)
    q64 = draft_probs.to(torch.float64)
    zero = count == 0
    if solver == "nss":
        return (p64 * (1 - (1 - q64) ** k64)).sum(dim=1)
    if solver == "naive":
        value = torch.minimum(p64, q64).sum(1) + ((p64 - q64).clamp_min(0) * (1 - (1 - q64) ** (k64 - 1).clamp_min(0))).sum(1)
        return torch.where(zero, torch.zeros_like(value), value)
    if solver == "spectr":
        rho, beta, accept_all, residual_law = _spectr_plan(target_probs, draft_probs, count, int(options.get("spectr_iterations", 64)))
        safe = torch.where(beta < 1, 1 - beta, torch.ones_like(beta)).unsqueeze(1)
        rejected_law = (q64 - p64 / rho.unsqueeze(1)).clamp_min(0) / safe
        hit = (residual_law * (1 - (1 - rejected_law) ** k64)).sum(1)
        value = torch.where(beta >= 1, torch.ones_like(beta), accept_all + (1 - accept_all) * hit)
        return torch.where(zero, torch.zeros_like(value), value)
    if solver == "specinfer":
        k_max = int(count.max())
        chain = _specinfer_chain(p64, q64, k_max)
        miss = torch.ones(batch, dtype=torch.float64, device=device)
        for i in range(k_max):
            factor = 1 - torch.minimum(chain[i], q64).sum(1)
            miss = torch.where(i < count, miss * factor, miss)
        return 1 - miss
    # khisti: no closed form; sum the branching law over every ordered draft tuple (as the reference does)
    k_int = int(count.max())
    if not bool((count == k_int).all()):
        raise ValueError("khisti acceptance needs the same k for every row")
    if vocab**k_int > 4096:
        raise ValueError(f"khisti acceptance enumerates V**k={vocab}**{k_int} tuples; more than 4096")
    total = torch.zeros(batch, dtype=torch.float64, device=device)
    if k_int == 0:
        return total
    for tup in itertools.product(range(vocab), repeat=k_int):
        tokens = torch.tensor(tup, device=device).expand(batch, k_int)
        weight = q64.gather(1, tokens).prod(dim=1)
        usable = weight > 0
        if not bool(usable.any()):
            continue
        rows = usable.nonzero().squeeze(1)
        law = solver_branching("khisti", target_probs[rows], draft_probs[rows], tokens[rows], **options)
        hit = law[:, sorted(set(tup))].sum(1)
        total[rows] += weight[rows] * hit
    return total
