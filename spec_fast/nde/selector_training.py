"""Training and held-out evaluation of the NDE selector on the offline dataset (seed 002 (docs/papers.md) section 6, App. E).

* :class:`SelectorData` -- the arrays of one dataset file (``scripts/selector_dataset.py``) for one
  verification method: features, E_hat[tau+1] ``[N, A]``, T_hat ``[N, A]`` and the prompt of every root.
* :func:`split_by_prompt` -- train / held-out roots by prompt (a prompt's roots never straddle the split).
* :func:`static_baselines` -- ``a_base`` per sampling setting: the static action with the best mean
  per-root throughput ``E / T`` on the training roots of that setting (eq. 5's baseline).
* :func:`train_selector` -- AdamW on eq. (12) (:func:`spec_fast.nde.selector.selector_loss`, penalty included),
  seeded initialisation, seeded minibatch order, dropout from a seeded generator: the same data, config and
  thread count give bitwise the same weights.
* :func:`save_selector` / :func:`load_selector` -- the weights as safetensors, the config and anything
  else (method, baselines, dataset header) as JSON metadata.
* :func:`evaluate_policy` -- throughput of the policy's argmax action vs the best static action vs the
  per-root oracle, on any set of roots. The in-sample oracle picks each root's best action on the very
  targets it is scored on, so the luck of the draws counts as gain (an upper bound); with several draws per
  root the *cross-fitted* oracle picks on one half of the draws and is scored on the other (both halves
  unbiased, so this is a fair estimate of what knowing each root's E[tau+1] to that precision is worth, and
  a lower bound on the exact oracle, whose choice has no noise). Ratios come with a 95% interval from a
  bootstrap over prompts (roots of one prompt are not independent).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from spec_fast.nde.selector import SCALAR_FEATURES, RootFeatures, SelectorConfig, SelectorNet, selector_loss, tree_key

__all__ = ["SelectorData", "TrainSettings", "load_dataset", "split_by_prompt", "static_baselines",
           "best_static_action", "train_selector", "evaluate_policy", "cross_validate", "save_selector", "load_selector"]


@dataclass(frozen=True)
class SelectorData:
    """``N`` roots: hidden states ``[N, H]`` x 3, ``scalars [N, S]``, ``block_efficiency [N, A]``,
    ``latency [N, A]``, ``prompt_index [N]``, ``actions`` (A triples), ``header`` (the file's settings)."""

    target_hidden_prev: torch.Tensor
    draft_hidden_prev: torch.Tensor
    draft_hidden_root: torch.Tensor
    scalars: torch.Tensor
    block_efficiency: torch.Tensor
    latency: torch.Tensor
    prompt_index: torch.Tensor
    actions: tuple[tuple[int, int, int], ...]
    header: dict[str, Any]
    #: ``[N, s, A]`` E_hat of every shared draw (``block_efficiency`` is their mean), or None
    draws: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return int(self.scalars.shape[0])

    def features(self, rows: torch.Tensor) -> RootFeatures:
        return RootFeatures(self.target_hidden_prev[rows], self.draft_hidden_prev[rows],
                            self.draft_hidden_root[rows], self.scalars[rows])

    def settings(self) -> torch.Tensor:
        """``[N, 2]`` (temperature, top-p) of every root."""
        columns = [SCALAR_FEATURES.index("temperature"), SCALAR_FEATURES.index("top_p")]
        return self.scalars[:, columns]


def load_dataset(path: str, method: str = "specinfer") -> SelectorData:
    """Read a ``scripts/selector_dataset.py`` file for one method (``ValueError`` if it lacks the method)."""
    import json

    with np.load(path) as data:
        header = json.loads(str(data["header"]))
        name = f"block_efficiency_{method}"
        if name not in data:
            raise ValueError(f"{path} has no targets for method={method!r}; it holds {header.get('methods')}")
        draws = torch.from_numpy(data[f"{name}_draws"]).double() if f"{name}_draws" in data else None
        return SelectorData(
            torch.from_numpy(data["target_hidden_prev"]), torch.from_numpy(data["draft_hidden_prev"]),
            torch.from_numpy(data["draft_hidden_root"]), torch.from_numpy(data["scalars"]),
            torch.from_numpy(data[name]), torch.from_numpy(data["latency"]),
            torch.from_numpy(data["prompt_index"]), tuple(tuple(a) for a in header["actions"]), header, draws,
        )


def split_by_prompt(data: SelectorData, heldout_every: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """``(train_rows, heldout_rows)``: roots of prompts with ``index % heldout_every == heldout_every - 1``
    are held out."""
    if heldout_every < 2:
        raise ValueError(f"heldout_every must be >= 2, got heldout_every={heldout_every}")
    held = (data.prompt_index % heldout_every) == heldout_every - 1
    rows = torch.arange(data.size)
    return rows[~held], rows[held]


def static_baselines(data: SelectorData, rows: torch.Tensor) -> dict[tuple[float, float], int]:
    """Best static action (mean ``E / T`` over ``rows``) per (temperature, top-p) setting of ``rows``."""
    throughput = data.block_efficiency[rows] / data.latency[rows]
    settings = data.settings()[rows]
    out: dict[tuple[float, float], int] = {}
    for setting in sorted({(float(t), float(p)) for t, p in settings.tolist()}):
        mask = (settings[:, 0] == setting[0]) & (settings[:, 1] == setting[1])
        out[setting] = int(throughput[mask].mean(dim=0).argmax())
    return out


def _baseline_actions(data: SelectorData, rows: torch.Tensor, baselines: dict[tuple[float, float], int],
                      fallback: int) -> torch.Tensor:
    settings = data.settings()[rows].tolist()
    return torch.tensor([baselines.get((float(t), float(p)), fallback) for t, p in settings], dtype=torch.long)


@dataclass(frozen=True)
class TrainSettings:
    """Optimisation of eq. (12): ``penalty_weight`` lambda, ``worst_fraction`` alpha (appendix E names them
    but gives no values; these are ours), AdamW, a cosine schedule, fixed seed.

    ``prior_logit``: the output bias starts at this value on the best static action of the training roots
    (0 elsewhere), so training starts near that action and moves away only where the data pays for it.
    Why: from a uniform start Adam saturates the 324-way softmax within tens of steps, and actions that
    eq. (8) lists several times (a chain of n tokens is (1, L1, n - L1) for every L1 and (K, n, 0) for
    every K) gather probability several times faster, so the policy collapsed onto a chain that is worse
    than the best static action even on the training roots (measured on this dataset: 0.82x-0.97x)."""

    steps: int = 1000
    batch_size: int = 32
    lr: float = 1e-4
    prior_logit: float = 6.0
    weight_decay: float = 1e-4
    penalty_weight: float = 1.0
    worst_fraction: float = 0.1
    dropout: float = 0.1
    logit_cap: float = 0.0
    seed: int = 0
    log_every: int = 100


def train_selector(data: SelectorData, rows: torch.Tensor, baselines: dict[tuple[float, float], int],
                   settings: TrainSettings, progress: bool = True) -> tuple[SelectorNet, list[dict[str, float]]]:
    """Train a :class:`SelectorNet` on ``rows`` of ``data``; returns the net (eval mode) and the loss log."""
    if rows.numel() == 0:
        raise ValueError("rows must hold at least one training root, got none")
    torch.manual_seed(settings.seed)
    config = SelectorConfig(int(data.target_hidden_prev.shape[1]), int(data.draft_hidden_prev.shape[1]),
                            dropout=settings.dropout, logit_cap=settings.logit_cap,
                            max_branches=max(a[0] for a in data.actions),
                            max_trunk=max(a[1] for a in data.actions), max_branch_length=max(a[2] for a in data.actions))
    if config.actions != data.actions:
        raise ValueError("the dataset's actions are not the action space of eq. 8 in spec_ref order")
    net = SelectorNet(config)
    net.set_standardization(data.scalars[rows].float())
    overall = int((data.block_efficiency[rows] / data.latency[rows]).mean(dim=0).argmax())
    output = net.mlp[-1]
    assert isinstance(output, torch.nn.Linear)
    with torch.no_grad():
        output.bias.zero_()
        output.bias[overall] = settings.prior_logit  # before the logit cap, if any
    base = _baseline_actions(data, rows, baselines, overall)
    optimizer = torch.optim.AdamW(net.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    order_generator = torch.Generator().manual_seed(settings.seed)
    log: list[dict[str, float]] = []
    start = time.perf_counter()
    net.train()
    batch = min(settings.batch_size, int(rows.numel()))
    permutation = torch.randperm(int(rows.numel()), generator=order_generator)
    cursor = 0
    for step in range(settings.steps):
        if cursor + batch > permutation.numel():
            permutation = torch.randperm(int(rows.numel()), generator=order_generator)
            cursor = 0
        picked = permutation[cursor: cursor + batch]
        cursor += batch
        lr = settings.lr * 0.5 * (1 + math.cos(math.pi * step / max(settings.steps, 1)))
        for group in optimizer.param_groups:
            group["lr"] = lr
        logits = net(data.features(rows[picked]))
        loss = selector_loss(logits.double(), data.block_efficiency[rows[picked]], data.latency[rows[picked]],
                             base[picked], settings.penalty_weight, settings.worst_fraction)
        optimizer.zero_grad(set_to_none=True)
        loss.total.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        if step % settings.log_every == 0 or step == settings.steps - 1:
            entry = {"step": float(step), "loss": loss.total.item(), "log_term": loss.log_term.item(),
                     "penalty": loss.penalty.item(), "mean_ratio": loss.ratios.detach().mean().item()}
            log.append(entry)
            if progress:
                print(f"step {step + 1}/{settings.steps}: loss {entry['loss']:.4f} (log term {entry['log_term']:.4f}, "
                      f"penalty {entry['penalty']:.4f}), mean TPS ratio to baseline {entry['mean_ratio']:.4f}, "
                      f"{time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    net.eval()
    return net, log


def best_static_action(data: SelectorData, rows: torch.Tensor, speculative: bool = False) -> int:
    """The action with the best mean ``E / T`` over ``rows``; ``speculative``: among those that draft
    (``L1 + L2 >= 1``), i.e. the best static tree."""
    throughput = (data.block_efficiency[rows] / data.latency[rows]).mean(dim=0)
    if speculative:
        plain = torch.tensor([a[1] + a[2] == 0 for a in data.actions])
        throughput = torch.where(plain, torch.full_like(throughput, -math.inf), throughput)
    return int(throughput.argmax())


def _bootstrap_ratio(values: npt.NDArray[np.float64], reference: npt.NDArray[np.float64],
                     groups: npt.NDArray[np.int64], resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% interval of ``mean(values) / mean(reference)`` resampling whole groups (prompts) with replacement."""
    names, inverse = np.unique(groups, return_inverse=True)
    sums_v = np.bincount(inverse, weights=values, minlength=names.size)
    sums_r = np.bincount(inverse, weights=reference, minlength=names.size)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, names.size, size=(resamples, names.size))
    ratios = sums_v[picks].sum(axis=1) / sums_r[picks].sum(axis=1)
    low, high = np.quantile(ratios, [0.025, 0.975])
    return float(low), float(high)


def evaluate_policy(net: SelectorNet, data: SelectorData, rows: torch.Tensor, static_action: int,
                    baselines: dict[tuple[float, float], int], speculative_action: int | None = None) -> dict[str, Any]:
    """Throughput on ``rows`` of the policy (argmax), one static action, the best static tree
    (``speculative_action``), the per-setting baselines, the in-sample oracle and (with several draws per
    root) the cross-fitted oracle (module docstring). ``tps_mean`` = mean over roots of ``E / T`` (eq. 9
    with a one-hot policy); ``tps_pooled`` = ``sum E / sum T`` (tokens per second of decoding all those
    roots); ``*_vs_best_static`` with a prompt-bootstrap 95% interval (``tps_mean_ci``)."""
    with torch.no_grad():
        chosen = net.select(data.features(rows))
    eff, lat = data.block_efficiency[rows], data.latency[rows]
    per_root = eff / lat
    count = int(rows.numel())
    picks: dict[str, npt.NDArray[np.int64]] = {
        "policy": chosen.numpy(),
        "best_static": np.full(count, static_action),
        "setting_baseline": _baseline_actions(data, rows, baselines, static_action).numpy(),
        "oracle": per_root.argmax(dim=1).numpy(),
    }
    if speculative_action is not None:
        picks["best_static_tree"] = np.full(count, speculative_action)
    index = torch.arange(count)
    scored: dict[str, tuple[torch.Tensor, torch.Tensor]] = {
        name: (eff[index, torch.from_numpy(pick)], lat[index, torch.from_numpy(pick)]) for name, pick in picks.items()}
    draws = None if data.draws is None else data.draws[rows]
    if draws is not None and draws.shape[1] >= 2:
        half = draws.shape[1] // 2
        first, second = draws[:, :half].mean(dim=1), draws[:, half:].mean(dim=1)
        pick_first, pick_second = (first / lat).argmax(dim=1), (second / lat).argmax(dim=1)
        # each half's choice scored on the other half; E and T as the mean of the two scorings
        e = 0.5 * (second[index, pick_first] + first[index, pick_second])
        t = 0.5 * (lat[index, pick_first] + lat[index, pick_second])
        tps = 0.5 * (second[index, pick_first] / lat[index, pick_first] + first[index, pick_second] / lat[index, pick_second])
        scored["oracle_crossfit"] = (e, t)
        picks["oracle_crossfit"] = pick_first.numpy()
    report: dict[str, Any] = {"roots": count}
    static_tree = tree_key(data.actions[static_action])
    groups = data.prompt_index[rows].numpy()
    static_tps = (scored["best_static"][0] / scored["best_static"][1]).numpy()
    for name, (e, t) in scored.items():
        per = (tps if name == "oracle_crossfit" else e / t).numpy()
        report[name] = {
            "tps_mean": float(per.mean()), "tps_pooled": float(e.sum() / t.sum()),
            "block_efficiency": float(e.mean()), "latency_s": float(t.mean()),
            "differs_from_best_static": float(np.mean([tree_key(data.actions[int(a)]) != static_tree
                                                        for a in picks[name].tolist()])),
            "tps_mean_ci": _bootstrap_ratio(per, static_tps, groups),
        }
    for name in scored:
        report[name]["tps_mean_vs_best_static"] = report[name]["tps_mean"] / report["best_static"]["tps_mean"]
        report[name]["tps_pooled_vs_best_static"] = report[name]["tps_pooled"] / report["best_static"]["tps_pooled"]
    counts: dict[str, int] = {}
    for a in picks["policy"].tolist():
        key = str(data.actions[int(a)])
        counts[key] = counts.get(key, 0) + 1
    report["policy_actions"] = dict(sorted(counts.items(), key=lambda kv: -kv[1]))
    return report


def cross_validate(data: SelectorData, rows: torch.Tensor, candidates: Sequence[TrainSettings], folds: int = 4
                   ) -> list[dict[str, Any]]:
    """Each candidate's policy throughput relative to the best static action, by ``folds``-fold cross-validation
    over the prompts of ``rows`` (fold = prompt index // 5 mod folds, so the prompts of one fold are spread
    over the pool): train on the other folds, score the held fold (mean E/T of all held roots pooled over
    folds, ``cv_vs_best_static``), and the fit on the training folds themselves (``fit_vs_best_static``)."""
    fold_of = (data.prompt_index[rows] // 5) % folds
    out: list[dict[str, Any]] = []
    for settings in candidates:
        sums = {"cv": 0.0, "cv_static": 0.0, "fit": 0.0, "differs": 0.0}
        count = 0
        for fold in range(folds):
            train, held = rows[fold_of != fold], rows[fold_of == fold]
            if held.numel() == 0 or train.numel() == 0:
                continue
            baselines = static_baselines(data, train)
            static = best_static_action(data, train)
            net, _ = train_selector(data, train, baselines, settings, progress=False)
            scored = evaluate_policy(net, data, held, static, baselines)
            fitted = evaluate_policy(net, data, train, static, baselines)
            n = int(held.numel())
            sums["cv"] += scored["policy"]["tps_mean"] * n
            sums["cv_static"] += scored["best_static"]["tps_mean"] * n
            sums["fit"] += fitted["policy"]["tps_mean_vs_best_static"] / folds
            sums["differs"] += scored["policy"]["differs_from_best_static"] * n
            count += n
        out.append({"settings": dataclasses.asdict(settings), "cv_vs_best_static": sums["cv"] / sums["cv_static"],
                    "fit_vs_best_static": sums["fit"], "cv_differs": sums["differs"] / max(count, 1), "roots": count})
    return out


def describe_actions(actions: Sequence[tuple[int, int, int]], index: int) -> str:
    k, l1, l2 = actions[index]
    return f"(K={k}, L1={l1}, L2={l2})"


def save_selector(net: SelectorNet, path: str, metadata: dict[str, str]) -> None:
    """Write ``net``'s weights (standardisation buffers included) and ``config`` + ``metadata`` to ``path``."""
    import dataclasses
    import json
    import os

    from safetensors.torch import save_file

    state = {k: v.detach().contiguous() for k, v in net.state_dict().items()}
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    save_file(state, path, metadata={**metadata, "config": json.dumps(dataclasses.asdict(net.config))})


def load_selector(path: str) -> tuple[SelectorNet, dict[str, str]]:
    """``(net in eval mode, metadata)`` from a :func:`save_selector` file."""
    import json

    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(path, framework="pt") as handle:
        metadata: dict[str, str] = dict(handle.metadata() or {})
    if "config" not in metadata:
        raise ValueError(f"{path} has no selector config in its metadata")
    raw = json.loads(metadata["config"])
    raw["hidden_sizes"] = tuple(raw["hidden_sizes"])
    net = SelectorNet(SelectorConfig(**raw))
    net.load_state_dict(load_file(path))
    net.eval()
    return net, metadata
