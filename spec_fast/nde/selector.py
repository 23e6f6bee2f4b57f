"""The neural delayed-expansion (NDE) selector in torch: root features, the policy MLP, the training loss.

Mirrors :mod:`spec_ref.selector` (the oracle of the loss) and adds what the reference leaves out, the
network of seed 002 (docs/papers.md) eq. (10) and the features of its appendix E:

* :func:`root_features` -- at a decoding step's root, from tensors the engine already holds (no extra
  target pass; the draft runs on the root token anyway, seed 002 footnote 4):

  - hidden states ``h_prev^p`` (target, preceding token), ``h_prev^q`` (draft, preceding token),
    ``h_cur^q`` (draft, root token);
  - scalars (:data:`SCALAR_FEATURES`, in this order): ``H(p_prev)``, ``H(q_prev)``, ``H(q_root)``,
    ``KL(p_prev || q_prev)``, ``KL(q_prev || p_prev)``, ``||p_prev - q_prev||_1``, context length ``|x|``,
    temperature, top-p, and the latency estimates ``t_q(|x|)``, ``t_p(|x|)`` of one draft and one target
    pass (eq. 11's time model, :mod:`spec_fast.nde.latency`).

  ``p_prev`` / ``q_prev`` are the target / draft next-token laws at the token before the root, ``q_root``
  the draft law at the root, each the *tempered softmax* ``softmax(logits / T)`` (:func:`feature_law`;
  ``softmax(logits)`` at T = 0), not the decoding operator G that the verifier applies. Why: G sorts the
  whole vocabulary for top-p (about 7 ms per law at V = 49152 on this CPU, three laws per step, against
  0.05 ms for a softmax), and a feature only has to be a function of the committed context; the
  truncation G adds is itself a function of this softmax and of top-p, which is a feature.
  Zeros: ``0 log 0 = 0`` in entropies and KL terms. A KL whose first law puts mass where the second has
  none is ``+inf``; appendix E does not say how the paper handles it, and truncated laws (top-p, a draft
  on a vocabulary subset) make it the common case, so the divergence is taken against the second law
  floored at :data:`KL_FLOOR` (``sum_{a > 0} a (log a - log max(b, KL_FLOOR))``): exact whenever
  ``b >= KL_FLOOR`` on the support of ``a``, finite and bounded by ``log(1 / KL_FLOOR)`` always, and
  still increasing in the mass ``a`` puts outside the support of ``b``.
* :class:`SelectorNet` -- eq. (10): one linear projection per hidden-state block to ``d = 128``, each
  followed by LayerNorm, concatenated with the standardised scalars, then an MLP with hidden layers of 512
  and 32 units, GELU and dropout, and one logit per action of eq. (8) (:func:`spec_ref.selector.action_space`
  order). Eq. (8) lists one tree under several actions (every chain and the plain step several times;
  :func:`tree_groups`: 324 actions, 233 trees), so the selector decodes the most probable *tree*, the
  policy summed over its actions (:meth:`SelectorNet.select`), not the most probable action: a policy
  that puts 0.6 on the chain of one token spread over its five actions would otherwise lose the argmax to
  a plain step's 0.4 spread over four.
* :func:`selector_loss` -- eq. (12) with the regression penalty, equal to
  :func:`spec_ref.selector.selector_loss` (tested in float64); :func:`policy_throughput` (eq. 4) and
  :func:`action_throughput` mirror their reference namesakes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from spec_ref.selector import action_space

__all__ = [
    "SCALAR_FEATURES",
    "KL_FLOOR",
    "feature_law",
    "entropy",
    "kl_divergence",
    "l1_distance",
    "RootFeatures",
    "root_features",
    "SelectorConfig",
    "SelectorNet",
    "tree_key",
    "tree_groups",
    "policy_throughput",
    "action_throughput",
    "SelectorLoss",
    "selector_loss",
]

#: Names of the scalar features, in the column order of ``RootFeatures.scalars``.
SCALAR_FEATURES: tuple[str, ...] = (
    "entropy_p_prev",
    "entropy_q_prev",
    "entropy_q_root",
    "kl_p_q_prev",
    "kl_q_p_prev",
    "l1_p_q_prev",
    "context_length",
    "temperature",
    "top_p",
    "draft_time",
    "target_time",
)

#: Floor of the second law inside a KL divergence (module docstring): ``log(1 / KL_FLOOR) ~ 20.7`` nats.
KL_FLOOR = 1e-9


def feature_law(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The law a feature reads (module docstring): ``softmax(logits / T)`` over the last axis in float32,
    ``softmax(logits)`` at ``T = 0``; ``-inf`` logits (a draft's vocabulary subset) get probability 0."""
    t = float(temperature)
    if not (math.isfinite(t) and t >= 0):
        raise ValueError(f"temperature must be finite and >= 0, got temperature={temperature!r}")
    return torch.softmax(logits.float() / (t if t > 0 else 1.0), dim=-1)


def _check_probs(probs: torch.Tensor, name: str) -> None:
    if probs.dim() != 2 or probs.shape[1] == 0:
        raise ValueError(f"{name} must have shape [B, V] with V >= 1, got shape {tuple(probs.shape)}")
    if not probs.is_floating_point():
        raise ValueError(f"{name} must be a floating tensor, got dtype {probs.dtype}")
    if not bool(torch.isfinite(probs).all()) or bool((probs < 0).any()):
        raise ValueError(f"{name} must be finite and non-negative")


def _entropy(probs: torch.Tensor) -> torch.Tensor:
    logs = torch.where(probs > 0, torch.log(probs.clamp_min(torch.finfo(probs.dtype).tiny)), torch.zeros_like(probs))
    return -(probs * logs).sum(dim=-1)


def _kl(first: torch.Tensor, second: torch.Tensor, floor: float) -> torch.Tensor:
    tiny = torch.finfo(first.dtype).tiny
    log_first = torch.log(first.clamp_min(tiny))
    log_second = torch.log(second.clamp_min(floor)) if floor > 0 else torch.log(second)
    return torch.where(first > 0, first * (log_first - log_second), torch.zeros_like(first)).sum(dim=-1)


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """``H(p) = -sum_{p > 0} p log p`` per row of ``probs [B, V]`` (``0 log 0 = 0``) -> ``[B]``."""
    _check_probs(probs, "probs")
    return _entropy(probs)


def kl_divergence(first: torch.Tensor, second: torch.Tensor, floor: float = KL_FLOOR) -> torch.Tensor:
    """``KL(first || max(second, floor))`` per row (module docstring), ``[B, V]`` x 2 -> ``[B]``.

    ``floor = 0`` gives the exact divergence, ``+inf`` where ``first`` has mass outside ``second``'s support.
    """
    _check_probs(first, "first")
    _check_probs(second, "second")
    if first.shape != second.shape:
        raise ValueError(f"first.shape={tuple(first.shape)} must equal second.shape={tuple(second.shape)}")
    if not (math.isfinite(floor) and 0 <= floor < 1):
        raise ValueError(f"floor must lie in [0, 1), got floor={floor!r}")
    return _kl(first, second, floor)


def l1_distance(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """``sum |first - second|`` per row, ``[B, V]`` x 2 -> ``[B]``."""
    _check_probs(first, "first")
    _check_probs(second, "second")
    if first.shape != second.shape:
        raise ValueError(f"first.shape={tuple(first.shape)} must equal second.shape={tuple(second.shape)}")
    return (first - second).abs().sum(dim=-1)


@dataclass(frozen=True)
class RootFeatures:
    """Features of ``B`` roots: ``target_hidden_prev [B, Hp]``, ``draft_hidden_prev [B, Hq]``,
    ``draft_hidden_root [B, Hq]``, ``scalars [B, len(SCALAR_FEATURES)]`` (raw, not standardised)."""

    target_hidden_prev: torch.Tensor
    draft_hidden_prev: torch.Tensor
    draft_hidden_root: torch.Tensor
    scalars: torch.Tensor

    @property
    def batch_size(self) -> int:
        return int(self.scalars.shape[0])


def _column(values: torch.Tensor, name: str, batch: int, like: torch.Tensor, validate: bool) -> torch.Tensor:
    if values.shape != (batch,):
        raise ValueError(f"{name}.shape={tuple(values.shape)} must be (B,)={(batch,)}")
    out = values.to(device=like.device, dtype=like.dtype)
    if validate and (not bool(torch.isfinite(out).all()) or bool((out < 0).any())):
        raise ValueError(f"{name} must be finite and non-negative")
    return out


def root_features(
    target_hidden_prev: torch.Tensor,
    draft_hidden_prev: torch.Tensor,
    draft_hidden_root: torch.Tensor,
    target_probs_prev: torch.Tensor,
    draft_probs_prev: torch.Tensor,
    draft_probs_root: torch.Tensor,
    context_lengths: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    draft_time: torch.Tensor,
    target_time: torch.Tensor,
    validate: bool = True,
) -> RootFeatures:
    """The appendix-E features of ``B`` roots (module docstring), batched.

    Args:
        target_hidden_prev: ``[B, Hp]`` target hidden state at the token before the root.
        draft_hidden_prev: ``[B, Hq]`` draft hidden state at the token before the root.
        draft_hidden_root: ``[B, Hq]`` draft hidden state at the root token.
        target_probs_prev: ``[B, V]`` p_prev; ``draft_probs_prev``: ``[B, V]`` q_prev;
            ``draft_probs_root``: ``[B, V]`` q_root.
        context_lengths: ``[B]`` committed tokens ``|x|`` (the root included).
        temperature, top_p: ``[B]`` sampling parameters of each row.
        draft_time, target_time: ``[B]`` seconds of one draft / target pass at ``|x|`` (eq. 11's t_q, t_p).

    Scalars are computed in the dtype of ``target_probs_prev`` (use float64 for exact comparisons).
    ``validate=False`` skips the value checks (finite, non-negative), which read tensors back to the host;
    shapes are always checked. The engine's hot path passes laws it made itself and skips them.
    """
    if target_hidden_prev.dim() != 2:
        raise ValueError(f"target_hidden_prev must be [B, Hp], got shape {tuple(target_hidden_prev.shape)}")
    batch = int(target_hidden_prev.shape[0])
    for name, hidden in (("draft_hidden_prev", draft_hidden_prev), ("draft_hidden_root", draft_hidden_root)):
        if hidden.dim() != 2 or hidden.shape[0] != batch:
            raise ValueError(f"{name} must be [B={batch}, Hq], got shape {tuple(hidden.shape)}")
    if draft_hidden_prev.shape != draft_hidden_root.shape:
        raise ValueError(
            f"draft_hidden_prev.shape={tuple(draft_hidden_prev.shape)} must equal "
            f"draft_hidden_root.shape={tuple(draft_hidden_root.shape)}"
        )
    for name, probs in (("target_probs_prev", target_probs_prev), ("draft_probs_prev", draft_probs_prev),
                        ("draft_probs_root", draft_probs_root)):
        if validate:
            _check_probs(probs, name)
        if probs.dim() != 2 or probs.shape[0] != batch or probs.shape != target_probs_prev.shape:
            raise ValueError(f"{name} must be [B={batch}, V={target_probs_prev.shape[1]}], got shape {tuple(probs.shape)}")
    p_prev = target_probs_prev
    q_prev = draft_probs_prev.to(p_prev.dtype)
    q_root = draft_probs_root.to(p_prev.dtype)
    columns = [
        _entropy(p_prev), _entropy(q_prev), _entropy(q_root),
        _kl(p_prev, q_prev, KL_FLOOR), _kl(q_prev, p_prev, KL_FLOOR), (p_prev - q_prev).abs().sum(dim=-1),
        _column(context_lengths, "context_lengths", batch, p_prev, validate),
        _column(temperature, "temperature", batch, p_prev, validate),
        _column(top_p, "top_p", batch, p_prev, validate),
        _column(draft_time, "draft_time", batch, p_prev, validate),
        _column(target_time, "target_time", batch, p_prev, validate),
    ]
    return RootFeatures(target_hidden_prev, draft_hidden_prev, draft_hidden_root, torch.stack(columns, dim=1))


# ========================================================================================================
# The policy network (eq. 10)
# ========================================================================================================
def tree_key(action: tuple[int, int, int]) -> tuple[int, ...]:
    """The tree an action drafts: eq. (8) lists one tree under several actions (a chain of n tokens is
    ``(1, L1, n - L1)`` for every L1 and ``(K, n, 0)`` for every K; no draft at all is every ``(K, 0, 0)``)."""
    k, l1, l2 = action
    return (1, l1 + l2) if k == 1 or l2 == 0 else (k, l1, l2)


def tree_groups(actions: tuple[tuple[int, int, int], ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(group [A], first [G])``: the distinct tree of every action (numbered in order of first appearance)
    and the first action of every tree."""
    keys: dict[tuple[int, ...], int] = {}
    group: list[int] = []
    first: list[int] = []
    for index, action in enumerate(actions):
        key = tree_key(action)
        if key not in keys:
            keys[key] = len(first)
            first.append(index)
        group.append(keys[key])
    return torch.tensor(group, dtype=torch.long), torch.tensor(first, dtype=torch.long)


@dataclass(frozen=True)
class SelectorConfig:
    """Sizes of :class:`SelectorNet`. The action space is ``{1..max_branches} x {0..max_trunk} x
    {0..max_branch_length}`` (eq. 8; the seed's ``4, 8, 8`` gives 324 actions)."""

    target_hidden_size: int
    draft_hidden_size: int
    projection_size: int = 128
    hidden_sizes: tuple[int, int] = (512, 32)
    dropout: float = 0.1
    max_branches: int = 4
    max_trunk: int = 8
    max_branch_length: int = 8
    #: ``c > 0`` bounds the logits to ``c * tanh(z / c)`` (0 = off, eq. 10 as written); see SelectorNet
    logit_cap: float = 0.0

    def __post_init__(self) -> None:
        for name in ("target_hidden_size", "draft_hidden_size", "projection_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {name}={value!r}")
        if len(self.hidden_sizes) != 2 or any(isinstance(h, bool) or not isinstance(h, int) or h < 1
                                               for h in self.hidden_sizes):
            raise ValueError(f"hidden_sizes must be two integers >= 1, got hidden_sizes={self.hidden_sizes!r}")
        if not (isinstance(self.dropout, (int, float)) and 0 <= self.dropout < 1):
            raise ValueError(f"dropout must lie in [0, 1), got dropout={self.dropout!r}")
        if not (isinstance(self.logit_cap, (int, float)) and math.isfinite(self.logit_cap) and self.logit_cap >= 0):
            raise ValueError(f"logit_cap must be finite and >= 0, got logit_cap={self.logit_cap!r}")
        action_space(self.max_branches, self.max_trunk, self.max_branch_length)  # validates the three bounds

    @property
    def actions(self) -> tuple[tuple[int, int, int], ...]:
        return action_space(self.max_branches, self.max_trunk, self.max_branch_length)

    @property
    def num_actions(self) -> int:
        return len(self.actions)


class SelectorNet(nn.Module):
    """Eq. (10): ``z(x) = MLP([LN(phi_1 h_prev^p); LN(phi_2 h_prev^q); LN(phi_3 h_cur^q); s(x)])``.

    ``s(x) = (scalars - scalar_mean) / scalar_std`` with buffers set by :meth:`set_standardization` from
    the training data (saved with the weights). ``forward(features) -> logits [B, A]``.

    ``config.logit_cap = c > 0`` returns ``c * tanh(z / c)``. Why: eq. (12)'s ratio of policy averages
    drives a free softmax onto the baseline action within a few hundred steps (logit gaps near 30, measured
    on bench/data/selector_dataset.npz), where every other action's gradient, proportional to its
    probability, vanishes and the net can no longer fit even its training roots; bounded logits keep every
    action's probability above ``exp(-2c) / A``.
    """

    def __init__(self, config: SelectorConfig) -> None:
        super().__init__()
        self.config = config
        d = config.projection_size
        self.project_target_prev = nn.Linear(config.target_hidden_size, d)
        self.project_draft_prev = nn.Linear(config.draft_hidden_size, d)
        self.project_draft_root = nn.Linear(config.draft_hidden_size, d)
        self.norm_target_prev = nn.LayerNorm(d)
        self.norm_draft_prev = nn.LayerNorm(d)
        self.norm_draft_root = nn.LayerNorm(d)
        num_scalars = len(SCALAR_FEATURES)
        self.register_buffer("scalar_mean", torch.zeros(num_scalars))
        self.register_buffer("scalar_std", torch.ones(num_scalars))
        group, first_action = tree_groups(config.actions)
        self.register_buffer("tree_group", group, persistent=False)
        self.register_buffer("tree_first", first_action, persistent=False)
        first, second = config.hidden_sizes
        self.mlp = nn.Sequential(
            nn.Linear(3 * d + num_scalars, first), nn.GELU(), nn.Dropout(config.dropout),
            nn.Linear(first, second), nn.GELU(), nn.Dropout(config.dropout),
            nn.Linear(second, config.num_actions),
        )

    def set_standardization(self, scalars: torch.Tensor) -> None:
        """Set the scalar mean/std from training scalars ``[N, S]`` (a constant column gets std 1)."""
        if scalars.dim() != 2 or scalars.shape[1] != len(SCALAR_FEATURES) or scalars.shape[0] == 0:
            raise ValueError(f"scalars must be [N >= 1, {len(SCALAR_FEATURES)}], got shape {tuple(scalars.shape)}")
        mean = scalars.mean(dim=0)
        std = scalars.std(dim=0, unbiased=False)
        std = torch.where(std > 1e-12, std, torch.ones_like(std))
        mean_buffer: torch.Tensor = self.scalar_mean  # type: ignore[assignment]
        std_buffer: torch.Tensor = self.scalar_std  # type: ignore[assignment]
        mean_buffer.copy_(mean.to(mean_buffer.dtype))
        std_buffer.copy_(std.to(std_buffer.dtype))

    def forward(self, features: RootFeatures) -> torch.Tensor:
        dtype = self.project_target_prev.weight.dtype
        mean: torch.Tensor = self.scalar_mean  # type: ignore[assignment]
        std: torch.Tensor = self.scalar_std  # type: ignore[assignment]
        scalars = (features.scalars.to(dtype) - mean) / std
        parts = [
            self.norm_target_prev(self.project_target_prev(features.target_hidden_prev.to(dtype))),
            self.norm_draft_prev(self.project_draft_prev(features.draft_hidden_prev.to(dtype))),
            self.norm_draft_root(self.project_draft_root(features.draft_hidden_root.to(dtype))),
            scalars,
        ]
        logits: torch.Tensor = self.mlp(torch.cat(parts, dim=-1))
        cap = float(self.config.logit_cap)
        if cap > 0:
            logits = cap * torch.tanh(logits / cap)
        return logits

    def tree_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """``[B, A]`` logits -> ``[B, G]`` probability of each distinct tree (:func:`tree_groups`): the policy
        summed over the actions that draft the same tree."""
        group: torch.Tensor = self.tree_group  # type: ignore[assignment]
        probs = torch.softmax(logits.float(), dim=-1)
        out = torch.zeros(probs.shape[0], int(group.max()) + 1, dtype=probs.dtype, device=probs.device)
        return out.index_add_(1, group.to(probs.device), probs)

    def representative(self, tree: torch.Tensor) -> torch.Tensor:
        """Action indices (into ``config.actions``) of tree indices (the first action of each tree)."""
        first: torch.Tensor = self.tree_first  # type: ignore[assignment]
        return first.to(tree.device)[tree]

    def select(self, features: RootFeatures) -> torch.Tensor:
        """The most probable tree per root (the policy summed over the actions of each distinct tree,
        :func:`tree_groups`), as ``[B]`` action indices into ``config.actions`` (no host sync)."""
        return self.representative(self.tree_probs(self.forward(features)).argmax(dim=-1))


# ========================================================================================================
# Throughputs and the loss (eq. 4, 5, 12), mirroring spec_ref.selector
# ========================================================================================================
def _check_table(values: torch.Tensor, name: str, shape: torch.Size | None) -> None:
    if values.dim() != 2:
        raise ValueError(f"{name} must be [B, A], got shape {tuple(values.shape)}")
    if shape is not None and values.shape != shape:
        raise ValueError(f"{name}.shape={tuple(values.shape)} must equal {tuple(shape)}")
    if not bool(torch.isfinite(values).all()):
        raise ValueError(f"{name} must be finite")
    if not bool((values > 0).all()):
        raise ValueError(f"{name} must be positive")


def policy_throughput(policy: torch.Tensor, block_efficiency: torch.Tensor, latency: torch.Tensor) -> torch.Tensor:
    """Eq. (4): ``sum_a pi E / sum_a pi T`` per row; all ``[B, A]`` -> ``[B]`` (differentiable in ``policy``)."""
    _check_table(block_efficiency, "block_efficiency", None)
    _check_table(latency, "latency", block_efficiency.shape)
    if policy.shape != block_efficiency.shape:
        raise ValueError(f"policy.shape={tuple(policy.shape)} must equal {tuple(block_efficiency.shape)}")
    return (policy * block_efficiency).sum(dim=-1) / (policy * latency).sum(dim=-1)


def action_throughput(block_efficiency: torch.Tensor, latency: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """``E[c, a_c] / T[c, a_c]`` of one action index per row: ``[B, A]`` x 2, ``actions [B]`` -> ``[B]``."""
    _check_table(block_efficiency, "block_efficiency", None)
    _check_table(latency, "latency", block_efficiency.shape)
    batch, num_actions = block_efficiency.shape
    if actions.shape != (batch,) or actions.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"actions must be [B]={batch} integer indices, got shape {tuple(actions.shape)}, dtype {actions.dtype}")
    if batch and (int(actions.min()) < 0 or int(actions.max()) >= num_actions):
        raise ValueError(f"actions must lie in [0, A={num_actions}), got {actions.tolist()}")
    index = actions.long().unsqueeze(1)
    return block_efficiency.gather(1, index).squeeze(1) / latency.gather(1, index).squeeze(1)


@dataclass(frozen=True)
class SelectorLoss:
    """Eq. (12) as tensors: ``total`` (differentiable) = ``log_term + penalty_weight * penalty``;
    ``ratios [B]`` = TPS_pi / TPS_base; ``worst_indices [|I_alpha|]`` (largest penalties first, ties to
    the lower index), as in :class:`spec_ref.selector.SelectorLoss`."""

    total: torch.Tensor
    log_term: torch.Tensor
    penalty: torch.Tensor
    ratios: torch.Tensor
    worst_indices: torch.Tensor


def selector_loss(
    logits: torch.Tensor,
    block_efficiency: torch.Tensor,
    latency: torch.Tensor,
    baseline_actions: torch.Tensor,
    penalty_weight: float,
    worst_fraction: float,
) -> SelectorLoss:
    """Eq. (12) on a minibatch, equal to :func:`spec_ref.selector.selector_loss`.

    ``logits [B, A]``; ``block_efficiency [B, A]`` (E_hat[tau+1]); ``latency [B, A]`` (T_hat, eq. 11);
    ``baseline_actions [B]`` (index of a_base per row); ``penalty_weight`` lambda >= 0; ``worst_fraction``
    alpha in (0, 1]: the penalty averages the ``max(1, ceil(alpha B))`` largest ``max(1 - r, 0)^2``.
    """
    if logits.dim() != 2 or logits.shape[1] == 0:
        raise ValueError(f"logits must be [B, A] with A >= 1, got shape {tuple(logits.shape)}")
    if not bool(torch.isfinite(logits).all()):
        raise ValueError("logits must be finite")
    lam = float(penalty_weight)
    if not (math.isfinite(lam) and lam >= 0):
        raise ValueError(f"penalty_weight must be finite and >= 0, got penalty_weight={penalty_weight!r}")
    alpha = float(worst_fraction)
    if not 0 < alpha <= 1:
        raise ValueError(f"worst_fraction must lie in (0, 1], got worst_fraction={worst_fraction!r}")
    policy = torch.softmax(logits, dim=-1)
    tps = policy_throughput(policy, block_efficiency.to(policy.dtype), latency.to(policy.dtype))
    base = action_throughput(block_efficiency.to(policy.dtype), latency.to(policy.dtype), baseline_actions)
    ratios = tps / base
    batch = int(ratios.shape[0])
    log_term = (-torch.log(ratios)).mean()
    penalties = torch.clamp(1.0 - ratios, min=0.0) ** 2
    count = max(1, math.ceil(alpha * batch - 1e-9))
    order = torch.sort(-penalties.detach(), stable=True).indices[:count]  # largest first, ties to lower index
    penalty = penalties[order].sum() / count
    return SelectorLoss(
        total=log_term + lam * penalty, log_term=log_term, penalty=penalty, ratios=ratios, worst_indices=order
    )
