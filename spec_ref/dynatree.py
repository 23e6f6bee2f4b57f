"""DynaTree adaptive drafting (seed 003 (docs/papers.md) section 3.3 and Algorithm 1, DRAFTTREE), deterministic.

Tree. The seed's tree root u0 is the draft's top-1 token at the prefix; here it is node 1, the only child
of the :class:`~spec_ref.tree.DraftTree` root (node 0, the prefix context). Seed depth ``d(u)`` (u0 has
``d = 0``) is ``DraftTree`` depth minus one. Each node u carries its cumulative path probability
``p(u) = exp(l_bar_u) = prod_{v in path(u)} q_D(z_v | prefix(parent(v)))`` (the path includes u0), stored
as :attr:`~spec_ref.drafting.ScoredDraftTree.confidences`.

DRAFTTREE (this reading of Algorithm 1, stated precisely):

1. ``u0 = argmax q_D(. | prefix)`` (ties: lowest id). ``T = {u0}``; frontier ``A = [u0]`` (FIFO: the seed
   builds the tree breadth-first).
2. While ``A`` is non-empty and ``|T| < N_max`` (``|T|`` counts drafted nodes, u0 included): pop the oldest
   u. Skip it (it stays a leaf) unless it is expandable:
   ``p(u) >= tau  and  d(u) < D_max  and  p(u) >= rho_stop  and  (d(u) < D_0  or  p(u) >= rho_deep)``
   (lines 14-25 of Algorithm 1; the depth-gating rule of section 3.3).
3. Expand u: confidence ``c(u) = max_v q_D(v | u)``; ``B(u) = B_min`` if ``c(u) >= tau_h``, ``B_max`` if
   ``c(u) < tau_l``, else ``B_mid``. Its candidates are the ``B(u)`` most probable tokens (positive draft
   probability only; ties: lower id), in that order. Each candidate v with ``p(v) = p(u) q_D(v|u)`` is
   added to T and pushed to A, until ``|T| = N_max``.
4. **Probability-threshold pruning** (section 3.3: "prune any leaf u with p(u) < tau"): a candidate with
   ``p(v) < tau`` is *not added* (and does not use budget). Such a node could never be expanded, so this
   equals removing the leaves below tau from Algorithm 1's tree when the budget does not bind, and spends
   the budget on kept nodes when it does. u0 itself is never pruned (Algorithm 1 always creates it).

Randomness: none. Draws at a node = its children in rank order; ``process="deterministic"``, no
draft_probs (verify with greedy / NSS only). Nodes are numbered breadth-first (BFSFLATTEN).

HISTORY ADJUSTMENT (the seed leaves the schedule to an appendix that does not give it; this is ours).
:class:`DynaTreeHistory` keeps the acceptance statistics ``a_r`` of the last ``W`` iterations (oldest first)
and the drafted depth of the tree awaiting verification. :func:`update_history` receives the verifier's
accepted length ``tau_r`` (draft tokens accepted, bonus excluded) and appends ``a_r = tau_r / D_r``, where
``D_r`` is that tree's maximum DraftTree depth (the longest acceptable path, u0 included), so
``a_r in [0, 1]`` is "the fraction of drafted tokens committed" along the best path. Before each draft,
:func:`adjusted_params` sets the effective parameters from the window mean ``a_bar`` (seed 003 eq. for
``a_bar_t``), *only once the window holds W values* (warm-up: base parameters):

* ``a_bar >= high_acceptance`` (aggressive): ``D_0' = min(D_0 + depth_step, D_max - 1)``,
  ``tau_l' = tau_l - threshold_step``, ``tau_h' = tau_h - threshold_step``;
* ``a_bar <= low_acceptance`` (conservative): ``D_0' = max(D_0 - depth_step, 1)``,
  ``tau_l' = tau_l + threshold_step``, ``tau_h' = tau_h + threshold_step``;
* otherwise the base parameters.

The adjustment is relative to the *base* parameters (stateless given the window), so it cannot drift;
``0 < tau_l' < tau_h' < 1`` and ``1 <= D_0' < D_max`` hold by the parameter validation.

Theorem: proofs/T07_merge_and_greedy.md (DynaTree commits the greedy continuation).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

import numpy as np

from spec_ref._validate import is_exact
from spec_ref.drafting import ScoredDraftTree, _assemble, _int_at_least, _ModelCache, ranked_tokens
from spec_ref.tree import Model

__all__ = [
    "DynaTreeParams", "DynaTreeHistory", "draft_dynatree", "update_history", "adjusted_params", "expands",
    "branch_count",
]


def _real(value: Any, name: str) -> Any:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, Fraction, np.integer, np.floating)):
        raise ValueError(f"{name} must be a real number, got {name}={value!r}")
    if isinstance(value, (float, np.floating)) and not math.isfinite(float(value)):
        raise ValueError(f"{name} must be finite, got {name}={value!r}")
    return value


@dataclass(frozen=True)
class DynaTreeParams:
    """DynaTree drafting parameters (seed 003 Algorithm 1 "Require" line). Validated on construction.

    Defaults: seed 003 appendix A where it gives a value (D_0 = 5, D_max = 8, (B_min, B_max) = (1, 3),
    (tau_h, tau_l) = (0.9, 0.4)); the rest are this project's choices.

    ``branch_min <= branch_mid <= branch_max`` (>= 1); ``0 < tau_low < tau_high < 1`` (confidence thresholds
    tau_l, tau_h); ``1 <= base_depth < max_depth`` (D_0, D_max); ``0 < rho_stop < rho_deep < 1``;
    ``0 < prune_threshold < 1`` (tau); ``node_budget >= 1`` (N_max, drafted nodes incl. u0); history schedule:
    ``0 <= low_acceptance < high_acceptance <= 1``, ``0 <= threshold_step < tau_low`` with
    ``tau_high + threshold_step < 1``, ``depth_step >= 0``.
    """

    branch_min: int = 1
    branch_mid: int = 2
    branch_max: int = 3
    tau_low: Any = 0.4
    tau_high: Any = 0.9
    base_depth: int = 5
    max_depth: int = 8
    rho_stop: Any = 0.01
    rho_deep: Any = 0.3
    prune_threshold: Any = 0.005
    node_budget: int = 64
    high_acceptance: Any = 0.8
    low_acceptance: Any = 0.3
    threshold_step: Any = 0.05
    depth_step: int = 1

    def __post_init__(self) -> None:
        b_min = _int_at_least(self.branch_min, "branch_min", 1)
        b_mid = _int_at_least(self.branch_mid, "branch_mid", 1)
        b_max = _int_at_least(self.branch_max, "branch_max", 1)
        if not b_min <= b_mid <= b_max:
            raise ValueError(
                f"branch bounds must satisfy branch_min <= branch_mid <= branch_max, got "
                f"branch_min={b_min}, branch_mid={b_mid}, branch_max={b_max}"
            )
        tau_low, tau_high = _real(self.tau_low, "tau_low"), _real(self.tau_high, "tau_high")
        if not 0 < tau_low < tau_high < 1:
            raise ValueError(f"need 0 < tau_low < tau_high < 1, got tau_low={tau_low!r}, tau_high={tau_high!r}")
        d0 = _int_at_least(self.base_depth, "base_depth", 1)
        dmax = _int_at_least(self.max_depth, "max_depth", 1)
        if not d0 < dmax:
            raise ValueError(f"need 1 <= base_depth < max_depth, got base_depth={d0}, max_depth={dmax}")
        rho_stop, rho_deep = _real(self.rho_stop, "rho_stop"), _real(self.rho_deep, "rho_deep")
        if not 0 < rho_stop < rho_deep < 1:
            raise ValueError(f"need 0 < rho_stop < rho_deep < 1, got rho_stop={rho_stop!r}, rho_deep={rho_deep!r}")
        tau = _real(self.prune_threshold, "prune_threshold")
        if not 0 < tau < 1:
            raise ValueError(f"prune_threshold must lie in (0, 1), got prune_threshold={tau!r}")
        _int_at_least(self.node_budget, "node_budget", 1)
        low, high = _real(self.low_acceptance, "low_acceptance"), _real(self.high_acceptance, "high_acceptance")
        if not 0 <= low < high <= 1:
            raise ValueError(
                f"need 0 <= low_acceptance < high_acceptance <= 1, got low_acceptance={low!r}, "
                f"high_acceptance={high!r}"
            )
        step = _real(self.threshold_step, "threshold_step")
        if not (0 <= step < tau_low and tau_high + step < 1):
            raise ValueError(
                f"threshold_step={step!r} must satisfy 0 <= threshold_step < tau_low={tau_low!r} and "
                f"tau_high + threshold_step < 1 (tau_high={tau_high!r}) so adjusted thresholds stay in (0, 1)"
            )
        _int_at_least(self.depth_step, "depth_step", 0)


@dataclass(frozen=True)
class DynaTreeHistory:
    """Sliding window of recent acceptance statistics (module docstring, HISTORY ADJUSTMENT).

    ``window`` W >= 1; ``acceptance``: the last <= W values ``a_r`` in [0, 1], oldest first;
    ``pending_depth``: the maximum depth of the last drafted tree, awaiting :func:`update_history`
    (``None`` when no tree is pending).
    """

    window: int = 4
    acceptance: tuple[Any, ...] = ()
    pending_depth: int | None = None

    def __post_init__(self) -> None:
        w = _int_at_least(self.window, "window", 1)
        if len(self.acceptance) > w:
            raise ValueError(f"acceptance holds {len(self.acceptance)} values, more than window={w}")
        for r, a in enumerate(self.acceptance):
            if not 0 <= _real(a, f"acceptance[{r}]") <= 1:
                raise ValueError(f"acceptance[{r}]={a!r} must lie in [0, 1]")
        if self.pending_depth is not None:
            _int_at_least(self.pending_depth, "pending_depth", 1)

    @property
    def mean_acceptance(self) -> Any:
        """``a_bar``: the window mean, or ``None`` while the window is not full (warm-up)."""
        if len(self.acceptance) < self.window:
            return None
        return sum(self.acceptance[1:], self.acceptance[0]) / self.window


def adjusted_params(params: DynaTreeParams, history: DynaTreeHistory) -> DynaTreeParams:
    """The effective parameters for the next draft (module docstring, HISTORY ADJUSTMENT).

    Adjusted parameters carry ``threshold_step = 0``: they are the result of the schedule, not an input
    to it (and a shifted ``tau_high`` plus the step may reach 1).
    """
    if not isinstance(params, DynaTreeParams):
        raise ValueError(f"params must be a DynaTreeParams, got {type(params).__name__}")
    if not isinstance(history, DynaTreeHistory):
        raise ValueError(f"history must be a DynaTreeHistory, got {type(history).__name__}")
    mean = history.mean_acceptance
    if mean is None:
        return params
    step = params.threshold_step
    if mean >= params.high_acceptance:
        return replace(
            params,
            base_depth=min(params.base_depth + params.depth_step, params.max_depth - 1),
            tau_low=params.tau_low - step,
            tau_high=params.tau_high - step,
            threshold_step=0,
        )
    if mean <= params.low_acceptance:
        return replace(
            params,
            base_depth=max(params.base_depth - params.depth_step, 1),
            tau_low=params.tau_low + step,
            tau_high=params.tau_high + step,
            threshold_step=0,
        )
    return params


def update_history(history: DynaTreeHistory, accepted_length: int) -> DynaTreeHistory:
    """Record the verifier's accepted length for the pending tree: append ``a_r = tau_r / D_r``, keep W.

    ``accepted_length``: draft tokens accepted (bonus excluded), ``0 <= accepted_length <= pending_depth``.
    Pure: returns a new history with ``pending_depth=None``.
    """
    if not isinstance(history, DynaTreeHistory):
        raise ValueError(f"history must be a DynaTreeHistory, got {type(history).__name__}")
    if history.pending_depth is None:
        raise ValueError(
            "history.pending_depth=None: update_history needs the history returned by draft_dynatree "
            "(it records the drafted depth the accepted length is measured against)"
        )
    accepted = _int_at_least(accepted_length, "accepted_length", 0)
    if accepted > history.pending_depth:
        raise ValueError(
            f"accepted_length={accepted} exceeds the drafted depth pending_depth={history.pending_depth}"
        )
    statistic = Fraction(accepted, history.pending_depth)
    window = (history.acceptance + (statistic,))[-history.window:]
    return DynaTreeHistory(window=history.window, acceptance=window, pending_depth=None)


def expands(params: DynaTreeParams, path_prob: Any, depth: int) -> bool:
    """Whether a node with path probability ``p(u)`` at seed depth ``d`` (u0: 0) is expanded: not pruned
    (``p(u) >= tau``), not at ``D_max``, above ``rho_stop``, and above ``rho_deep`` once ``d >= D_0``."""
    if path_prob < params.prune_threshold or depth >= params.max_depth or path_prob < params.rho_stop:
        return False
    return not (depth >= params.base_depth and path_prob < params.rho_deep)


def branch_count(params: DynaTreeParams, confidence: Any) -> int:
    """Children of an expanded node whose draft top-1 probability is ``confidence``: ``branch_min`` at or
    above ``tau_high``, ``branch_max`` below ``tau_low``, else ``branch_mid``."""
    if confidence >= params.tau_high:
        return int(params.branch_min)
    if confidence < params.tau_low:
        return int(params.branch_max)
    return int(params.branch_mid)


def draft_dynatree(
    draft_model: Model, params: DynaTreeParams, history: DynaTreeHistory
) -> tuple[ScoredDraftTree, DynaTreeHistory]:
    """Draft one DynaTree tree (module docstring, DRAFTTREE) with the history-adjusted parameters.

    Returns ``(tree, new_history)``: a deterministic :class:`ScoredDraftTree` (BFS order, confidences =
    ``p(u)``) and ``history`` with ``pending_depth`` = the tree's maximum depth, to be passed to
    :func:`update_history` with the verifier's accepted length. No randomness.
    """
    effective = adjusted_params(params, history)
    if history.pending_depth is not None:
        raise ValueError(
            f"history.pending_depth={history.pending_depth}: the previous tree was not verified yet; call "
            "update_history(history, accepted_length) first"
        )
    model = _ModelCache(draft_model, "draft_model")
    root_probs = model(())
    u0 = ranked_tokens(root_probs)[0]
    one: Any = Fraction(1) if is_exact(root_probs) else 1.0
    p_of: dict[tuple[int, ...], Any] = {(): one, (u0,): root_probs[u0]}
    draws_of: dict[tuple[int, ...], list[int]] = {(): [u0], (u0,): []}
    size = 1
    frontier: deque[tuple[int, ...]] = deque([(u0,)])
    while frontier and size < effective.node_budget:
        u = frontier.popleft()
        p_u = p_of[u]
        depth = len(u) - 1  # seed depth: u0 has d = 0
        if not expands(effective, p_u, depth):
            continue
        q = model(u)
        ranked = ranked_tokens(q)
        for t in ranked[: branch_count(effective, q[ranked[0]])]:
            if size >= effective.node_budget:
                break
            p_v = p_u * q[t]
            if p_v < effective.prune_threshold:
                break  # candidates are in decreasing q, so every later one is pruned too
            child = u + (t,)
            p_of[child] = p_v
            draws_of[u].append(t)
            draws_of[child] = []
            frontier.append(child)
            size += 1
    tree = _assemble(draws_of, {}, "deterministic", p_of, order="bfs")
    assert isinstance(tree, ScoredDraftTree)
    new_history = DynaTreeHistory(window=history.window, acceptance=history.acceptance, pending_depth=tree.max_depth)
    return tree, new_history
