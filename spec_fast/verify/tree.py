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

Layout, as ``spec_ref`` (its ``_sampling``, ``solvers`` and ``verify`` modules): this module holds the public
entry points, input checks, the top-down OT driver (section 4, and naive 5.1) and the greedy walk;
:mod:`spec_fast._sampling` the inverse-CDF and residual primitives; :mod:`spec_fast.verify.solvers` the token-level
solvers at one node; :mod:`spec_fast.verify.single_path` BV and tree_mc (section 5); :mod:`spec_fast.verify.traversal`
Traversal (section 6).

Khisti's pair LPs run on the host through :class:`spec_ref.KhistiSolver` (the same HiGHS call, so the
tournament weights are identical), once per visited node with two or more draws; that needs the node's p
and q on the host (one synchronisation per depth), the rest of Khisti stays on the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from spec_fast._sampling import _Rows, first_max_index
from spec_fast._validate import check_probabilities, check_token_ids, check_uniforms
from spec_fast.flat_tree import FlatTree
from spec_fast.verify.single_path import _bv_driver, _tree_mc_driver
from spec_fast.verify.solvers import _Node, _solve_khisti, _solve_naive, _solve_nss, _solve_specinfer, _solve_spectr
from spec_fast.verify.traversal import _traversal_driver

__all__ = [
    "METHODS",
    "TreeVerifyOutput",
    "Verified",
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


@dataclass(frozen=True, eq=False)
class TreeVerifyOutput:
    """One verification step per row (docs/algorithms.md section 1, "Output of one verification step").

    ``accepted_slots [B, D+1]``: slots of the accepted path from the root (slot 0), ``-1`` padded;
    ``accepted_depth [B]``: tau, the number of accepted drafted tokens (= depth of the accepted node);
    ``next_token [B]``: the correction or bonus token;
    ``emitted [B, D+1]``: the accepted drafted tokens then ``next_token``, ``-1`` padded;
    ``accepted_node [B]``: the accepted node u* (= ``accepted_slots[b, tau]``).
    """

    accepted_slots: Tensor
    accepted_depth: Tensor
    next_token: Tensor
    emitted: Tensor
    accepted_node: Tensor


@dataclass(frozen=True, eq=False)
class Verified:
    """What the engine keeps of one step's verification: ``accepted_slots [B, D+1]`` (root first, -1 padded),
    ``accepted_depth [B]``, ``next_token [B]`` (the first three fields of :class:`TreeVerifyOutput`)."""

    accepted_slots: Tensor
    accepted_depth: Tensor
    next_token: Tensor


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
# Drivers (single-path: spec_fast/verify/single_path.py; Traversal: spec_fast/verify/traversal.py)
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
    best = first_max_index(target_scores)  # [B, N], first maximum = lowest id
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
    :func:`spec_fast._sampling._inverse_cdf`, which clamps, and the greedy walk's argmax is always in range)."""
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
        accepted_depth=tau,
        next_token=token,
        emitted=emitted[:, :width].contiguous(),
        accepted_node=node,
    )
