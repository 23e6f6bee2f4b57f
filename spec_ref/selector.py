"""The neural delayed-expansion (NDE) selector's math, as plain NumPy (seed 002 (docs/papers.md) section 6 and appendix E).

This is the reference the torch selector must match. No network here (eq. 10 is the MLP that produces the
logits); only the action space, the latency model, the throughput objectives and the training loss.

* eq. (8)  action space ``A = {1..K_max} x {0..L1_max} x {0..L2_max}``, actions ``a = (K, L1, L2)``;
  :func:`action_space` lists it in lexicographic order (K, then L1, then L2).
* eq. (11) latency model, at context length ``l = |x|``::

      T_hat(x, a) = sum_{j=0}^{L1-1} t_q(l + j)               (trunk drafting)
                  + sum_{j=0}^{L2-1} t_q(l + L1 + j*K)        (branch drafting)
                  + t_p(l + L1 + K*L2)                        (target forward pass)

  ``t_q(l)``, ``t_p(l)``: measured draft / target forward times at context length l. Read literally: the
  j-th branch step runs the draft at context length ``l + L1 + j*K`` (K branch tokens per step), and the
  target pass sees the whole tree of ``L1 + K*L2`` drafted tokens. (Ambiguity noted: the trunk and branch
  counts are those of eq. (11) verbatim, e.g. ``(K, 0, 0)`` costs ``t_p(l)`` only.)
* eq. (4)  policy throughput estimate, a *ratio of policy averages*::

      TPS_pi(c) = sum_a pi(a|c) E_hat[tau(c,a)+1] / sum_a pi(a|c) T_hat(c,a)

* eq. (9)  the deployment objective ``E_c[ E[tau+1 | c, a] / E[T(c, a)] ]`` with ``a ~ pi(.|c)``. Read as
  the expected per-action throughput ``mean_c sum_a pi(a|c) E[c,a] / T[c,a]`` (:func:`throughput_objective`);
  the training loss uses eq. (4) instead, whose ratio of averages is differentiable and smoother.
* eq. (5)  per-context loss ``-log(TPS_pi(c) / TPS_base(c))`` where ``TPS_base(c) = E_hat[c, a_base] /
  T_hat[c, a_base]`` is the throughput of the static baseline action of that example.
* eq. (12) minibatch loss::

      L = (1/B) sum_i -log r_i  +  lambda * (1/|I_alpha|) sum_{i in I_alpha} max(1 - r_i, 0)^2,
      r_i = TPS_pi(x_i) / TPS_base(x_i),

  ``I_alpha`` = indices of the largest ``alpha`` fraction of the penalty terms. Reading: ``|I_alpha| =
  max(1, ceil(alpha * B))`` (with a 1e-9 tolerance, so ``alpha = 0.1, B = 30`` gives 3), largest penalties
  first, ties to the lower index (the sum does not depend on the tie rule).

``pi = softmax(logits)`` over the action axis (:func:`policy_probs`). Eq. (4), (8), (11) and the per-action
throughputs are type-generic: given Fractions (object arrays) they compute exactly; eq. (5), (12) use logs
and are float64.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np
import numpy.typing as npt

__all__ = [
    "action_space",
    "latency_estimate",
    "latency_table",
    "policy_probs",
    "policy_throughput",
    "action_throughput",
    "throughput_objective",
    "relative_log_loss",
    "SelectorLoss",
    "selector_loss",
]

Action = tuple[int, int, int]
#: ``t(l)``: forward time at context length l, as a function or a table indexed by l.
TimeModel = Union[Callable[[int], Any], Sequence[Any], npt.NDArray[Any]]


def _int_at_least(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or int(value) < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {name}={value!r}")
    return int(value)


def action_space(max_branches: int = 4, max_trunk: int = 8, max_branch_length: int = 8) -> tuple[Action, ...]:
    """Eq. (8): all ``(K, L1, L2)`` with ``1 <= K <= K_max``, ``0 <= L1 <= L1_max``, ``0 <= L2 <= L2_max``.

    Lexicographic order. The seed's space is the default, ``{1..4} x {0..8}^2`` (324 actions).
    """
    k_max = _int_at_least(max_branches, "max_branches", 1)
    l1_max = _int_at_least(max_trunk, "max_trunk", 0)
    l2_max = _int_at_least(max_branch_length, "max_branch_length", 0)
    return tuple(
        (k, l1, l2) for k in range(1, k_max + 1) for l1 in range(l1_max + 1) for l2 in range(l2_max + 1)
    )


def _time(model: TimeModel, length: int, name: str) -> Any:
    if callable(model):
        value = model(length)
    else:
        if not 0 <= length < len(model):
            raise ValueError(f"{name} has no entry for context length {length} (table of length {len(model)})")
        value = model[length]
    if isinstance(value, (bool, np.bool_)) or not value >= 0:
        raise ValueError(f"{name}({length})={value!r} must be a non-negative time")
    if isinstance(value, (float, np.floating)) and not math.isfinite(float(value)):
        raise ValueError(f"{name}({length})={value!r} must be finite")
    return value


def _action(action: Any) -> Action:
    try:
        k, l1, l2 = action
    except (TypeError, ValueError) as err:
        raise ValueError(f"action must be a triple (K, L1, L2), got action={action!r}") from err
    return (_int_at_least(k, "K", 1), _int_at_least(l1, "L1", 0), _int_at_least(l2, "L2", 0))


def latency_estimate(context_length: int, action: Action, draft_time: TimeModel, target_time: TimeModel) -> Any:
    """Eq. (11): estimated wall time of action ``(K, L1, L2)`` at context length ``l`` (module docstring).

    ``draft_time`` = t_q, ``target_time`` = t_p: functions ``l -> seconds`` or tables indexed by l.
    """
    length = _int_at_least(context_length, "context_length", 0)
    k, l1, l2 = _action(action)
    terms = [_time(draft_time, length + j, "draft_time") for j in range(l1)]
    terms += [_time(draft_time, length + l1 + j * k, "draft_time") for j in range(l2)]
    total = _time(target_time, length + l1 + k * l2, "target_time")
    for term in terms:
        total = total + term
    return total


def latency_table(
    context_length: int, actions: Sequence[Action], draft_time: TimeModel, target_time: TimeModel
) -> npt.NDArray[Any]:
    """Eq. (11) for every action: ``[A]`` (float64, or object when the times are Fractions)."""
    values = [latency_estimate(context_length, a, draft_time, target_time) for a in actions]
    if any(not isinstance(v, (float, int, np.floating, np.integer)) for v in values):
        return np.asarray(values, dtype=object)
    return np.asarray(values, dtype=np.float64)


def policy_probs(logits: Any) -> npt.NDArray[np.float64]:
    """``pi = softmax(logits)`` over the last axis (``[A]`` or ``[B, A]``), float64, max-shifted."""
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim not in (1, 2) or z.shape[-1] == 0:
        raise ValueError(f"logits must have shape [A] or [B, A] with A >= 1, got shape {z.shape}")
    if not np.all(np.isfinite(z)):
        raise ValueError("logits must be finite")
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    out: npt.NDArray[np.float64] = e / e.sum(axis=-1, keepdims=True)
    return out


def _table(values: Any, name: str, shape: tuple[int, ...] | None, positive: bool) -> npt.NDArray[Any]:
    arr = np.asarray(values)
    if arr.dtype != object:
        arr = arr.astype(np.float64)
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} must be finite")
    if arr.ndim not in (1, 2):
        raise ValueError(f"{name} must have shape [A] or [B, A], got shape {arr.shape}")
    if shape is not None and arr.shape != shape:
        raise ValueError(f"{name}.shape={arr.shape} must equal {shape}")
    flat = arr.reshape(-1)
    bad = [i for i in range(flat.shape[0]) if not (flat[i] > 0 if positive else flat[i] >= 0)]
    if bad:
        raise ValueError(f"{name} must be {'positive' if positive else 'non-negative'}, got entry {flat[bad[0]]!r}")
    return arr


def policy_throughput(policy: Any, block_efficiency: Any, latency: Any) -> Any:
    """Eq. (4): ``sum_a pi E / sum_a pi T`` per context. Inputs ``[A]`` or ``[B, A]``; returns scalar or ``[B]``.

    ``policy``: action probabilities (rows sum to 1); ``block_efficiency``: E_hat[tau+1] per action;
    ``latency``: T_hat per action (eq. 11).
    """
    pi = _table(policy, "policy", None, positive=False)
    eff = _table(block_efficiency, "block_efficiency", pi.shape, positive=True)
    lat = _table(latency, "latency", pi.shape, positive=True)
    return (pi * eff).sum(axis=-1) / (pi * lat).sum(axis=-1)


def action_throughput(block_efficiency: Any, latency: Any, actions: Any) -> Any:
    """Throughput ``E[c, a_c] / T[c, a_c]`` of one chosen action index per context (e.g. the baseline).

    ``block_efficiency``, ``latency``: ``[B, A]``; ``actions``: ``[B]`` action indices. Returns ``[B]``.
    """
    eff = _table(block_efficiency, "block_efficiency", None, positive=True)
    lat = _table(latency, "latency", eff.shape, positive=True)
    if eff.ndim != 2:
        raise ValueError(f"block_efficiency must be [B, A], got shape {eff.shape}")
    idx = np.asarray(actions)
    if idx.shape != (eff.shape[0],) or not np.issubdtype(idx.dtype, np.integer):
        raise ValueError(f"actions must be [B]={eff.shape[0]} integer indices, got {actions!r}")
    if idx.size and (idx.min() < 0 or idx.max() >= eff.shape[1]):
        raise ValueError(f"actions must lie in [0, A={eff.shape[1]}), got {idx.tolist()}")
    rows = np.arange(eff.shape[0])
    return eff[rows, idx] / lat[rows, idx]


def throughput_objective(policy: Any, block_efficiency: Any, latency: Any) -> Any:
    """Eq. (9) read as ``mean_c sum_a pi(a|c) E[c,a] / T[c,a]`` (module docstring). Inputs ``[B, A]``."""
    pi = _table(policy, "policy", None, positive=False)
    eff = _table(block_efficiency, "block_efficiency", pi.shape, positive=True)
    lat = _table(latency, "latency", pi.shape, positive=True)
    per_context = (pi * eff / lat).sum(axis=-1)
    if per_context.ndim == 0:
        return per_context
    return per_context.sum() / per_context.shape[0]


def relative_log_loss(policy: Any, block_efficiency: Any, latency: Any, baseline_actions: Any) -> npt.NDArray[np.float64]:
    """Eq. (5) per context: ``-log(TPS_pi / TPS_base)``, ``[B]`` float64."""
    tps = np.asarray(policy_throughput(policy, block_efficiency, latency), dtype=np.float64)
    base = np.asarray(action_throughput(block_efficiency, latency, baseline_actions), dtype=np.float64)
    out: npt.NDArray[np.float64] = -np.log(tps / base)
    return out


@dataclass(frozen=True)
class SelectorLoss:
    """Eq. (12): ``total = log_term + penalty_weight * penalty``; ``ratios [B]`` = TPS_pi / TPS_base;
    ``worst_indices``: I_alpha (largest penalties first)."""

    total: float
    log_term: float
    penalty: float
    ratios: tuple[float, ...]
    worst_indices: tuple[int, ...]


def selector_loss(
    logits: Any,
    block_efficiency: Any,
    latency: Any,
    baseline_actions: Any,
    penalty_weight: float,
    worst_fraction: float,
) -> SelectorLoss:
    """Eq. (12) on a minibatch (module docstring).

    ``logits [B, A]``; ``block_efficiency [B, A]`` (E_hat[tau+1], eq. 3); ``latency [B, A]`` (T_hat, eq. 11);
    ``baseline_actions [B]`` (index of a_base per example); ``penalty_weight`` lambda >= 0;
    ``worst_fraction`` alpha in (0, 1].
    """
    pi = policy_probs(logits)
    if pi.ndim != 2:
        raise ValueError(f"logits must be [B, A], got shape {pi.shape}")
    lam = float(penalty_weight)
    if not (math.isfinite(lam) and lam >= 0):
        raise ValueError(f"penalty_weight must be finite and >= 0, got penalty_weight={penalty_weight!r}")
    alpha = float(worst_fraction)
    if not 0 < alpha <= 1:
        raise ValueError(f"worst_fraction must lie in (0, 1], got worst_fraction={worst_fraction!r}")
    tps = np.asarray(policy_throughput(pi, block_efficiency, latency), dtype=np.float64)
    base = np.asarray(action_throughput(block_efficiency, latency, baseline_actions), dtype=np.float64)
    ratios = tps / base
    batch = ratios.shape[0]
    log_term = float(np.mean(-np.log(ratios)))
    penalties = np.maximum(1.0 - ratios, 0.0) ** 2
    count = max(1, math.ceil(alpha * batch - 1e-9))
    worst = sorted(range(batch), key=lambda i: (-penalties[i], i))[:count]
    penalty = float(sum(penalties[i] for i in worst) / count)
    return SelectorLoss(
        total=log_term + lam * penalty,
        log_term=log_term,
        penalty=penalty,
        ratios=tuple(float(r) for r in ratios),
        worst_indices=tuple(worst),
    )
