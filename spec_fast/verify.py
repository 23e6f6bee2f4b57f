"""Batched torch verification kernels, draw for draw equal to :func:`spec_ref.verify`.

``verify_tree(method, tree, target_probs, draft_probs, uniforms, **options) -> TreeVerifyOutput`` verifies a
batch of ``B`` flattened draft trees (:class:`spec_fast.FlatTree`, ``N`` slots, slot 0 the root) at once.

Inputs (``K`` = ``tree.max_draws``, ``M`` >= :func:`uniforms_per_node`):

* ``target_probs [B, N, V]`` float32: p_u = G(target logits) at every slot (padding slots: anything finite);
* ``draft_probs  [B, N, V]`` float32: q_u the draws at u were *actually* sampled from (ignored by nss,
  greedy, dynatree);
* ``uniforms     [B, N, M]`` float32 in [0, 1): row ``uniforms[b, u]`` is node u's substream. This is
  exactly the layout of ``spec_ref.NodeReplaySource(uniforms[b])``, consumed left to right in the order
  documented in :mod:`spec_ref.verify` (module docstring, "Randomness layout") and, per solver, in
  :mod:`spec_ref.solvers`. :func:`spec_fast.rng.counter_uniforms` or :func:`draw_uniforms` make them.

Methods: ``naive_tree, nss, spectr, specinfer, khisti`` (top-down OT driver, docs/algorithms.md section 4), ``naive,
bv, tree_mc`` (path 0, docs/algorithms.md section 5), ``traversal`` (docs/algorithms.md section 6; ``sibling_model`` "wor"/"wr"),
``greedy`` and ``dynatree`` (docs/algorithms.md section 8; no randomness; on a merged tree both are the same walk).
Options as in :func:`spec_ref.verify`: ``spectr_iterations`` (64), ``specinfer_order`` ("uniform"/"draw"),
``khisti_truncation`` (5), ``sibling_model`` ("wor"/"wr"); plus for every method

* ``max_depth``: the largest node depth in the batch (the ``D`` of the outputs). If omitted it is read
  with one ``int(tree.depths.max())``: pass it to avoid that host-device sync;
* ``compact``: restrict every ``[rows, V]`` computation to the rows that still need it (boolean-mask
  compaction and early exit once every row has stopped). These read tensor values on the host, so the
  default is ``True`` on CPU (where there is no device to synchronise with) and ``False`` elsewhere, where
  every loop runs its fixed number of steps over all rows with masks;
* ``validate`` (default ``True``): refuse NaN/inf/negative/unnormalised probabilities, token ids outside
  ``[0, V)`` and uniforms outside ``[0, 1)`` with a ``ValueError`` (one host sync). The engine passes
  ``False``: its inputs come from the decoding operator, and every emitted index is clamped to ``[0, V)``.

Numerics (docs/algorithms.md section 9, ``spec_ref/_sampling.py``): probabilities are float32 tensors. Every scalar
test is evaluated in float64 on the gathered float32 values, in the reference's form and operand order
(``u * q < p``, SpecTr ``u * (rho * q) < p``, BV/Traversal ``u < h``). ``[rows, V]`` arithmetic (residuals,
weighted differences) runs in float32, updated in place on fresh copies (large fresh tensors cost page
faults on CPU); row reductions use torch's float32 cascade summation and are cast to float64. Residuals
are ``(a - b)_+`` with the fallback to ``a`` when their mass is ``<= 0``. Categorical draws use the inverse
CDF "smallest ``i`` with ``cumsum[i] > u * total``" with float64 prefix sums (two-level, chunk totals then
one chunk, for ``V >= 8192``), which never returns a zero-weight index. Results equal ``spec_ref`` except
where a uniform lies within float rounding (~1e-7 relative) of a threshold.

Memory: ``traversal`` keeps ``[B, D+1, V]`` float32 state for the current root-to-leaf stack (P and Q).

Khisti's pair LPs run on the host through :class:`spec_ref.KhistiSolver` (the same HiGHS call, so the
tournament weights are identical), once per visited node with two or more draws; that needs the node's p
and q on the host (one synchronisation per depth), the rest of Khisti stays on the device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from spec_fast._validate import check_probabilities, check_token_ids, check_uniforms
from spec_fast.flat_tree import FlatTree

__all__ = [
    "METHODS",
    "TreeVerifyOutput",
    "verify_tree",
    "verify_greedy",
    "uniforms_per_node",
    "draw_uniforms",
    "child_slots",
    "path_zero_slots",
]

OT_METHODS = ("naive_tree", "nss", "spectr", "specinfer", "khisti")
PATH_METHODS = ("naive", "bv", "tree_mc")
GREEDY_METHODS = ("greedy", "dynatree")
#: Every method :func:`verify_tree` accepts (the same names as :data:`spec_ref.METHODS`).
METHODS = OT_METHODS + PATH_METHODS + ("traversal",) + GREEDY_METHODS

_METHOD_OPTIONS: dict[str, tuple[str, ...]] = {
    "spectr": ("spectr_iterations",),
    "specinfer": ("specinfer_order",),
    "khisti": ("khisti_truncation",),
    "traversal": ("sibling_model",),
}
_COMMON_OPTIONS = ("max_depth", "compact", "validate")
_DETERMINISTIC_OK = ("nss", "greedy", "dynatree")
#: The reference's limit (``spec_ref.KhistiSolver.MAX_DRAWS``), checked before any work.
KHISTI_MAX_DRAWS = 256

Tensor = torch.Tensor
#: dtype of the [rows, V] arithmetic (residuals, partial sums); reductions accumulate in float64 and every
#: scalar test is evaluated in float64.
_WORK = torch.float32
F64 = torch.float64


@dataclass(frozen=True, eq=False)
class TreeVerifyOutput:
    """One verification step per row (docs/algorithms.md section 1, "Output of one verification step").

    ``accepted_slots [B, D+1]``: slots of the accepted path from the root (slot 0), ``-1`` padded;
    ``num_accepted [B]``: tau, the number of accepted drafted tokens (= depth of the accepted node);
    ``next_token [B]``: the correction or bonus token;
    ``emitted [B, D+1]``: the accepted drafted tokens then ``next_token``, ``-1`` padded;
    ``accepted_node [B]``: the accepted node u* (= ``accepted_slots[b, tau]``).
    """

    accepted_slots: Tensor
    num_accepted: Tensor
    next_token: Tensor
    emitted: Tensor
    accepted_node: Tensor


def uniforms_per_node(method: str, max_draws: int, **options: Any) -> int:
    """``M``: the number of uniforms one node's substream needs for ``method`` with ``K = max_draws``.

    nss 1; naive_tree, naive, bv, traversal, tree_mc 2; spectr and khisti K+1; specinfer 2K+1 (uniform
    order) or K+1 (``specinfer_order="draw"``); greedy, dynatree 0. Never less than one per sampled node.
    """
    if method not in METHODS:
        raise ValueError(f"method={method!r} must be one of {METHODS}")
    if isinstance(max_draws, bool) or not isinstance(max_draws, int) or max_draws < 0:
        raise ValueError(f"max_draws must be an integer >= 0, got max_draws={max_draws!r}")
    if method in GREEDY_METHODS:
        return 0
    if method == "nss":
        return 1
    if method in ("naive_tree", "naive", "bv", "traversal", "tree_mc"):
        return 2
    if method == "specinfer" and options.get("specinfer_order", "uniform") == "uniform":
        return 2 * max_draws + 1
    return max_draws + 1


def draw_uniforms(
    method: str, tree: FlatTree, generator: torch.Generator | None = None, **options: Any
) -> Tensor:
    """``[B, N, M]`` float32 uniforms from a ``torch.Generator`` (the production sampling path).

    ``torch.rand`` float32 values lie on the 2**-24 grid, like :func:`spec_fast.rng.counter_uniforms`.
    """
    m = uniforms_per_node(method, tree.max_draws, **options)
    device = tree.tokens.device
    return torch.rand(
        (tree.batch_size, tree.num_slots, m), generator=generator, device=device, dtype=torch.float32
    )


# ========================================================================================================
# Tree structure helpers
# ========================================================================================================
def child_slots(tree: FlatTree) -> Tensor:
    """``[B, N, K]`` long: the child slot of draw ``j`` at node ``u`` (``-1`` for padding draws)."""
    batch, n, k = tree.draws.shape
    device = tree.tokens.device
    parents = tree.parents.clamp(min=0)  # [B, N]
    parent_draws = tree.draws.gather(1, parents.unsqueeze(2).expand(batch, n, k))  # [B, N(child), K]
    is_child = (tree.parents >= 0) & tree.valid  # [B, N]
    match = (parent_draws == tree.tokens.unsqueeze(2)) & is_child.unsqueeze(2)  # [B, N(child), K]
    target = parents.unsqueeze(2) * k + torch.arange(k, device=device)  # flat (parent, j)
    target = torch.where(match, target, torch.full_like(target, n * k))  # dummy column for non-matches
    source = torch.arange(n, device=device).view(1, n, 1).expand(batch, n, k)
    out = torch.full((batch, n * k + 1), -1, dtype=torch.long, device=device)
    out.scatter_(1, target.reshape(batch, -1), source.reshape(batch, -1))
    return out[:, : n * k].view(batch, n, k)


def path_zero_slots(tree: FlatTree, children: Tensor, max_depth: int) -> Tensor:
    """``[B, D+1]`` long: path 0 (follow ``draws[u, 0]`` from the root), ``-1`` after its leaf."""
    batch = tree.batch_size
    device = tree.tokens.device
    rows = torch.arange(batch, device=device)
    nodes = torch.full((batch, max_depth + 1), -1, dtype=torch.long, device=device)
    nodes[:, 0] = 0
    current = torch.zeros(batch, dtype=torch.long, device=device)
    for depth in range(1, max_depth + 1):
        nxt = children[rows, current.clamp(min=0), 0]
        nxt = torch.where(current >= 0, nxt, torch.full_like(nxt, -1))
        nodes[:, depth] = nxt
        current = nxt
    return nodes


# ========================================================================================================
# Sampling primitives (spec_ref/_sampling.py conventions)
# ========================================================================================================
def _rowsum(values: Tensor, keepdim: bool = False) -> Tensor:
    """Row sums ``[R]`` (or ``[R, 1]``) as float64. The reduction runs in the input dtype (torch's cascade
    summation, relative error ~1e-7 in float32) and is cast afterwards: ``sum(dtype=float64)`` would first
    materialise a float64 copy of the whole ``[R, V]`` tensor."""
    return values.sum(dim=1, keepdim=keepdim).to(F64)


#: Vocabularies from this size on use the two-level inverse CDF (chunk totals, then one chunk).
_CHUNKED_CDF_MIN_VOCAB = 8192
_CDF_CHUNK = 1024


def _inverse_cdf(weights: Tensor, u: Tensor) -> Tensor:
    """Smallest index with ``cumsum > u * total`` per row; never a zero-weight index.

    ``weights [R, V]`` non-negative with positive row sums; ``u [R]``. Returns ``[R]`` long. Cumulative sums
    are float64. For large V the search is two-level: float64 prefix sums of per-chunk float64 totals pick
    the chunk, then one ``[R, chunk]`` float64 prefix sum picks the index (boundaries within ~1e-13 of the
    mass of the reference's sequential float64 cumsum at V = 262144).
    """
    rows, vocab = weights.shape
    u64 = u.to(F64).unsqueeze(1)
    if vocab < _CHUNKED_CDF_MIN_VOCAB:
        cumulative = torch.cumsum(weights, dim=1, dtype=F64)  # [R, V]
        total = cumulative[:, -1:].contiguous()  # [R, 1]
        index = torch.searchsorted(cumulative, u64 * total, right=True)
        # If rounding pushes u * total onto the total, take the last index of positive weight: the first
        # index whose partial sum reaches the total.
        last_positive = torch.searchsorted(cumulative, total, right=False)
        # NaN weights (unvalidated input) make searchsorted return V: the clamp keeps every id in [0, V)
        return torch.minimum(index, last_positive).squeeze(1).clamp_(0, vocab - 1)
    size = _CDF_CHUNK
    full = vocab // size
    # Chunk totals accumulate in float64: float32 totals move every boundary by ~1e-7 of the mass (and a
    # float32 cumulative sum over V = 151936 by ~1e-5), enough to change the token for a uniform next to a
    # CDF boundary. Summing in float64 keeps the two-level search within ~1e-13 of the reference's
    # sequential float64 cumsum.
    sums = [weights[:, : full * size].reshape(rows, full, size).sum(dim=2, dtype=F64)]
    if full * size < vocab:
        sums.append(weights[:, full * size :].sum(dim=1, keepdim=True, dtype=F64))
    chunk_sums = torch.cat(sums, dim=1)  # [R, C] float64
    chunk_cum = torch.cumsum(chunk_sums, dim=1)
    total = chunk_cum[:, -1:].contiguous()
    threshold = u64 * total
    chunk = torch.searchsorted(chunk_cum, threshold, right=True)
    last_chunk = torch.searchsorted(chunk_cum, total, right=False)
    chunk = torch.minimum(chunk, last_chunk)  # [R, 1], a chunk of positive total
    before = torch.where(chunk > 0, chunk_cum.gather(1, (chunk - 1).clamp(min=0)), torch.zeros_like(threshold))
    columns = chunk * size + torch.arange(size, device=weights.device).unsqueeze(0)  # [R, size]
    inside = columns < vocab
    zero = torch.zeros((), dtype=weights.dtype, device=weights.device)
    values = torch.where(inside, weights.gather(1, columns.clamp(max=vocab - 1)), zero)
    within = torch.cumsum(values, dim=1, dtype=F64)
    pick = torch.searchsorted(within, (threshold - before).contiguous(), right=True)
    last_in_chunk = torch.searchsorted(within, within[:, -1:].contiguous(), right=False)
    return (chunk * size + torch.minimum(pick, last_in_chunk)).squeeze(1).clamp_(0, vocab - 1)


def _residual_weights(base: Tensor, subtract: Tensor, subtract_rows: Tensor | None = None) -> Tensor:
    """``(base - subtract)_+`` per row, or ``base`` where that mass is ``<= 0`` (the current target).

    ``subtract_rows [R]`` bool (optional): only these rows subtract; the others get exactly ``base``.
    Built as one new ``[R, V]`` tensor updated in place.
    """
    if subtract_rows is None:
        mass = base - subtract
    else:
        mass = torch.addcmul(base, subtract, -subtract_rows.to(base.dtype).unsqueeze(1))
    mass.clamp_min_(0)
    empty = (_rowsum(mass) <= 0).to(base.dtype).unsqueeze(1)
    return mass.addcmul_(base, empty)  # an empty row is all zeros: adding base gives exactly base


def _take(values: Tensor, index: Tensor) -> Tensor:
    """``values[r, index[r]]`` for ``values [R, V]``, ``index [R]`` (clamped to >= 0)."""
    return values.gather(1, index.clamp(min=0).unsqueeze(1)).squeeze(1)


class _Rows:
    """Row selection for ``[rows, V]`` work: all rows (device path) or the rows that need it (compact)."""

    def __init__(self, compact: bool) -> None:
        self.compact = compact

    def select(self, need: Tensor) -> Tensor | None:
        """Indices of the rows of ``need [R]`` to compute, or None for "all rows, masked"."""
        if not self.compact:
            return None
        return need.nonzero().squeeze(1)

    def draw(self, need: Tensor, weights_fn: Callable[[Tensor | None], Tensor], u: Tensor) -> Tensor:
        """Inverse-CDF draws ``[R]`` for the rows in ``need`` (others: 0); ``weights_fn(idx) -> [r, V]``."""
        idx = self.select(need)
        if idx is None:
            return _inverse_cdf(weights_fn(None), u)
        out = torch.zeros(need.shape[0], dtype=torch.long, device=need.device)
        if idx.numel():
            out[idx] = _inverse_cdf(weights_fn(idx), u[idx])
        return out


def _sub(t: Tensor, idx: Tensor | None) -> Tensor:
    return t if idx is None else t[idx]


# ========================================================================================================
# Token-level solvers at one node per row (docs/algorithms.md section 3; budgets in spec_ref/solvers.py)
# ========================================================================================================
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


# ========================================================================================================
# Drivers
# ========================================================================================================
def _gather_node(
    tree: FlatTree, target_probs: Tensor, draft_probs: Tensor, uniforms: Tensor, rows: Tensor, nodes: Tensor
) -> _Node:
    draws = tree.draws[rows, nodes]
    return _Node(
        target=target_probs[rows, nodes],
        draft=draft_probs[rows, nodes],
        draws=draws,
        count=(draws >= 0).sum(dim=1),
        u=uniforms[rows, nodes],
        rows=rows,
        nodes=nodes,
    )


def _ot_driver(
    method: str,
    tree: FlatTree,
    target_probs: Tensor,
    draft_probs: Tensor,
    uniforms: Tensor,
    children: Tensor,
    max_depth: int,
    ctx: _Rows,
    options: dict[str, Any],
) -> tuple[Tensor, Tensor]:
    """Top-down OT driver (docs/algorithms.md section 4); ``method == "naive"`` stops at the first rejection (5.1)."""
    batch = tree.batch_size
    device = tree.tokens.device
    current = torch.zeros(batch, dtype=torch.long, device=device)
    alive = torch.ones(batch, dtype=torch.bool, device=device)
    next_token = torch.full((batch,), -1, dtype=torch.long, device=device)
    all_rows = torch.arange(batch, device=device)
    for _ in range(max_depth + 1):
        idx = ctx.select(alive)
        rows = all_rows if idx is None else idx
        if rows.numel() == 0:
            break
        node = _gather_node(tree, target_probs, draft_probs, uniforms, rows, current[rows])
        if method == "nss" or tree.process == "deterministic":
            y, accepted = _solve_nss(node, ctx)
        elif method in ("naive_tree", "naive"):
            y, accepted = _solve_naive(node, ctx)
        elif method == "spectr":
            y, accepted = _solve_spectr(node, ctx, int(options.get("spectr_iterations", 64)))
        elif method == "specinfer":
            y, accepted = _solve_specinfer(node, ctx, str(options.get("specinfer_order", "uniform")))
        else:
            y, accepted = _solve_khisti(node, ctx, int(options.get("khisti_truncation", 5)))
        match = node.draws == y.unsqueeze(1)  # [R, K]
        has_child = match.any(dim=1)
        if method == "naive":
            has_child = has_child & accepted
        j = match.long().argmax(dim=1)
        child = children[rows, node.nodes, j]
        row_alive = alive[rows]
        stop = row_alive & ~has_child
        next_token[rows] = torch.where(stop, y, next_token[rows])
        current[rows] = torch.where(row_alive & has_child, child, current[rows])
        alive[rows] = row_alive & has_child
    return current, next_token


def _greedy_driver(tree: FlatTree, target_scores: Tensor, max_depth: int) -> tuple[Tensor, Tensor]:
    """Greedy (docs/algorithms.md section 8): the deepest node whose every token equals the argmax of the target
    scores (probabilities or raw logits) at its parent, lowest id on ties; among equally deep such nodes
    the lowest slot. With children merged by token there is one such path; on a merged dual tree whose
    heads both proposed a token this is the longest match over both subtrees, ties to head 1 (lower slots),
    as :func:`spec_ref.dual.verify_merged_greedy`. One pass of tensor ops per depth, no host reads."""
    best = target_scores.argmax(dim=-1)  # [B, N], first maximum = lowest id
    parent = tree.parents.clamp(min=0)
    matches = tree.valid & (tree.parents >= 0) & (tree.tokens == torch.gather(best, 1, parent))
    accepted = tree.parents < 0  # the root (and padding, which no valid node has as parent)
    accepted = accepted & tree.valid
    for depth in range(1, max_depth + 1):
        level = matches & (tree.depths == depth) & torch.gather(accepted, 1, parent)
        accepted = accepted | level
    depth_of = torch.where(accepted, tree.depths, torch.full_like(tree.depths, -1))
    node = depth_of.argmax(dim=1)  # first maximum: the lowest slot among the deepest accepted nodes
    return node, torch.gather(best, 1, node.unsqueeze(1)).squeeze(1)


def verify_greedy(tree: FlatTree, target_scores: Tensor, max_depth: int | None = None) -> TreeVerifyOutput:
    """Exact greedy verification (docs/algorithms.md section 8) of ``tree`` against ``target_scores [B, N, V]`` (raw
    target logits or probabilities; only their argmax is read). Same as ``verify_tree("greedy", ...)``
    without the unused draft and uniform inputs; also correct on trees with duplicate sibling tokens
    (merged dual trees, :func:`_greedy_driver`). ``max_depth`` skips one host read when given."""
    if target_scores.dim() != 3 or target_scores.shape[:2] != tree.tokens.shape:
        raise ValueError(f"target_scores.shape={tuple(target_scores.shape)} must be (B, N, V) with "
                         f"(B, N)={tuple(tree.tokens.shape)}")
    depth = int(tree.depths.max()) if max_depth is None else int(max_depth)
    node, token = _greedy_driver(tree, target_scores, depth)
    return _assemble(tree, node, token, depth)


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


# ========================================================================================================
# Public entry point
# ========================================================================================================
def _check_inputs(
    method: str, tree: FlatTree, target_probs: Tensor, draft_probs: Tensor, uniforms: Tensor, options: dict[str, Any]
) -> None:
    if method not in METHODS:
        raise ValueError(f"method={method!r} must be one of {METHODS}")
    allowed = _METHOD_OPTIONS.get(method, ()) + _COMMON_OPTIONS
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"option(s) {unknown} do not apply to method={method!r} (it accepts {list(allowed)})")
    if not isinstance(tree, FlatTree):
        raise ValueError(f"tree must be a spec_fast.FlatTree, got {type(tree).__name__}")
    batch, n = tree.tokens.shape
    if target_probs.dim() != 3 or target_probs.shape[:2] != (batch, n):
        raise ValueError(f"target_probs.shape={tuple(target_probs.shape)} must be (B, N, V) with (B, N)={(batch, n)}")
    if draft_probs.shape != target_probs.shape:
        raise ValueError(f"draft_probs.shape={tuple(draft_probs.shape)} must equal target_probs.shape={tuple(target_probs.shape)}")
    need = uniforms_per_node(method, tree.max_draws, **options)
    if uniforms.dim() != 3 or uniforms.shape[:2] != (batch, n) or uniforms.shape[2] < need:
        raise ValueError(f"uniforms.shape={tuple(uniforms.shape)} must be (B, N, M) with (B, N)={(batch, n)}, M >= {need}")
    if tree.process == "deterministic" and method not in _DETERMINISTIC_OK:
        raise ValueError(
            f"method={method!r} on a process='deterministic' tree is lossy (docs/algorithms.md section 2); use one of {_DETERMINISTIC_OK}"
        )
    sibling_model = options.get("sibling_model", "wor")
    if method == "traversal" and sibling_model not in ("wor", "wr"):
        raise ValueError(f"sibling_model must be 'wor' or 'wr', got sibling_model={sibling_model!r}")
    if tree.process == "without_replacement":
        if not (method in _DETERMINISTIC_OK or (method == "traversal" and sibling_model == "wor")):
            raise ValueError(
                f"method={method!r} assumes i.i.d. draws but the tree has process='without_replacement' (docs/testing.md section 0 (item 8))"
            )
    if method == "specinfer" and options.get("specinfer_order", "uniform") not in ("uniform", "draw"):
        raise ValueError(f"specinfer_order must be 'uniform' or 'draw', got {options.get('specinfer_order')!r}")
    if method == "khisti" and tree.max_draws > KHISTI_MAX_DRAWS:
        raise ValueError(
            f"khisti solves one pair LP per draw: tree.max_draws={tree.max_draws} is more than {KHISTI_MAX_DRAWS}"
        )
    for name in ("spectr_iterations", "khisti_truncation"):
        value = options.get(name, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {name}={value!r}")
    if options.get("validate", True):
        _check_values(method, tree, target_probs, draft_probs, uniforms, need)


def _check_values(
    method: str, tree: FlatTree, target_probs: Tensor, draft_probs: Tensor, uniforms: Tensor, need: int
) -> None:
    """Values at the real slots: token ids in [0, V), p (and q where draws were made from it) finite,
    non-negative and normalised, the consumed uniforms in [0, 1) (spec_fast/_validate.py)."""
    vocab = int(target_probs.shape[2])
    valid = tree.valid.to(torch.bool)
    drafted = valid & (tree.parents >= 0)
    check_token_ids("tree.tokens", torch.where(drafted, tree.tokens, torch.zeros_like(tree.tokens)), vocab)
    check_token_ids("tree.draws", tree.draws[valid], vocab, padding=torch.ones_like(tree.draws[valid], dtype=torch.bool))
    check_probabilities("target_probs", target_probs, valid)
    if method not in _DETERMINISTIC_OK:
        has_draws = valid & (tree.draws[:, :, 0] >= 0) if tree.max_draws > 0 else torch.zeros_like(valid)
        check_probabilities("draft_probs", draft_probs, has_draws)
    if need > 0:
        check_uniforms("uniforms", uniforms[:, :, :need], valid)


def verify_tree(
    method: str,
    tree: FlatTree,
    target_probs: Tensor,
    draft_probs: Tensor,
    uniforms: Tensor,
    **options: Any,
) -> TreeVerifyOutput:
    """Verify a batch of draft trees with ``method`` (module docstring for methods, layout and options).

    Args:
        method: one of :data:`METHODS`.
        tree: :class:`FlatTree` with ``B`` rows and ``N`` slots, ``K`` draws per node at most.
        target_probs: ``[B, N, V]`` float32, p at every slot.
        draft_probs: ``[B, N, V]`` float32, q at every slot.
        uniforms: ``[B, N, M]`` float32 in [0, 1), ``M >= uniforms_per_node(method, K)``.

    Returns:
        :class:`TreeVerifyOutput` with ``D = max_depth``.
    """
    _check_inputs(method, tree, target_probs, draft_probs, uniforms, options)
    device = tree.tokens.device
    max_depth = options.get("max_depth")
    if max_depth is None:
        max_depth = int(tree.depths.max())  # the one avoidable sync: pass max_depth to skip it
    max_depth = int(max_depth)
    compact = options.get("compact")
    ctx = _Rows(device.type == "cpu" if compact is None else bool(compact))
    if tree.max_draws == 0:  # K = 0 (every tree is a lone root): one padding draw column keeps shapes uniform
        pad = torch.full((tree.batch_size, tree.num_slots, 1), -1, dtype=torch.long, device=device)
        tree = FlatTree(tree.tokens, tree.parents, tree.depths, pad, tree.valid, tree.process)
    children = child_slots(tree)
    if method in GREEDY_METHODS:
        node, token = _greedy_driver(tree, target_probs, max_depth)
    elif method in OT_METHODS or method == "naive":
        node, token = _ot_driver(method, tree, target_probs, draft_probs, uniforms, children, max_depth, ctx, options)
    elif method == "bv":
        path = path_zero_slots(tree, children, max_depth)
        node, token = _bv_driver(tree, target_probs, draft_probs, uniforms, path, ctx)
    elif method == "tree_mc":
        path = path_zero_slots(tree, children, max_depth)
        node, token = _tree_mc_driver(tree, target_probs, draft_probs, uniforms, path, ctx)
    else:
        node, token = _traversal_driver(
            tree, target_probs, draft_probs, uniforms, children, max_depth,
            str(options.get("sibling_model", "wor")), ctx,
        )
    return _assemble(tree, node, token, max_depth)


def _assemble(tree: FlatTree, node: Tensor, token: Tensor, max_depth: int) -> TreeVerifyOutput:
    """Accepted path slots (root first), tau, emitted tokens from the accepted node and the extra token.

    Guard for unvalidated input (``validate=False``), without a host sync: an accepted node that is not a
    real slot becomes the root, so no emitted id ever leaves
    the vocabulary (drafted ids of real slots are ids the drafter sampled, every drawn id comes from
    :func:`_inverse_cdf`, which clamps, and the greedy walk's argmax is always in range)."""
    batch = tree.batch_size
    device = tree.tokens.device
    rows = torch.arange(batch, device=device)
    real = (node >= 0) & (node < tree.num_slots)
    real &= tree.valid[rows, node.clamp(0, tree.num_slots - 1)]
    node = torch.where(real, node, torch.zeros_like(node))
    width = max_depth + 1
    tau = tree.depths[rows, node]
    slots = torch.full((batch, width + 1), -1, dtype=torch.long, device=device)
    ancestor = node
    for _ in range(width):
        valid = ancestor >= 0
        depth = torch.where(valid, tree.depths[rows, ancestor.clamp(min=0)], torch.full_like(ancestor, width))
        slots.scatter_(1, depth.clamp(max=width).unsqueeze(1), torch.where(valid, ancestor, -1).unsqueeze(1))
        ancestor = torch.where(valid, tree.parents[rows, ancestor.clamp(min=0)], ancestor)
    accepted_slots = slots[:, :width].contiguous()
    emitted = torch.full((batch, width + 1), -1, dtype=torch.long, device=device)
    drafted = accepted_slots[:, 1:]
    emitted[:, : width - 1] = torch.where(drafted >= 0, tree.tokens.gather(1, drafted.clamp(min=0)), -1)
    emitted.scatter_(1, tau.unsqueeze(1), token.unsqueeze(1))
    return TreeVerifyOutput(
        accepted_slots=accepted_slots,
        num_accepted=tau,
        next_token=token,
        emitted=emitted[:, :width].contiguous(),
        accepted_node=node,
    )
