"""The warm-up microbenchmark behind the NDE selector's latency model (seed 002 (docs/papers.md) eq. 11, appendix E).

Eq. (11) prices an action ``(K, L1, L2)`` at context length ``l`` with the measured forward times
``t_q`` (draft) and ``t_p`` (target) of the machine in use (:func:`spec_ref.selector.latency_estimate`).
Here those times are *measured at run time* (never hard-coded):

1. :func:`measure_pass_times` runs one model through the engine's own cache
   (:class:`~spec_fast.kv_cache.TreeKVCache`, via the :class:`~spec_fast.drafts.model.Drafter` interface):
   for each context length ``c`` of a small grid it prefills ``c`` random tokens, then times forwards of
   ``w`` block entries (the width of a draft level or of a target pass over a tree) behind that context,
   dropping them after each pass. One untimed pass warms the model up first; each point is the median of
   ``repeats`` timings.
2. :func:`fit_pass_time` fits ``time(c, w) = intercept + per_width * (w - 1) + per_context * c`` by
   non-negative least squares: every coefficient >= 0, so the fit is monotone in both arguments, and the
   intercept is floored at a positive value, so every time is positive.
3. :class:`LatencyModel` turns the two fits into eq. (11)'s one-argument time functions at a root of length
   ``l`` (:meth:`LatencyModel.time_models`): ``t_q(x)`` = one draft pass of width 1 at context ``x``;
   ``t_p(x)`` = one target pass at context ``l`` over ``x - l + 1`` entries (the root and the drafted
   tree), which is what eq. (11)'s argument ``l + L1 + K L2`` means for the target. Eq. (11)'s draft terms
   carry no width, so a branch level of ``K`` entries is priced as a width-1 pass (a draft level's cost
   hardly depends on ``K <= 4``; the fit's ``per_width`` says by how much).

:func:`load_or_measure` caches a model in a JSON file keyed by machine, device, thread count, model names
and dtype (:func:`cache_key`), so a warm-up is re-run only on another machine or configuration.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from spec_fast.drafts.model import Drafter
from spec_ref.selector import Action, latency_table

__all__ = ["PassTime", "PassTimeFit", "LatencyModel", "measure_pass_times", "fit_pass_time", "measure_latency",
           "cache_key", "load_or_measure"]

#: Smallest intercept a fit may have (seconds): keeps every modelled time positive.
MIN_INTERCEPT = 1e-6


@dataclass(frozen=True)
class PassTime:
    """One measured point: a forward over ``width`` entries behind ``context`` committed ones took ``seconds``."""

    context: int
    width: int
    seconds: float


@dataclass(frozen=True)
class PassTimeFit:
    """``time(context, width) = intercept + per_width * (width - 1) + per_context * context`` (seconds)."""

    intercept: float
    per_width: float
    per_context: float

    def __post_init__(self) -> None:
        if not (np.isfinite(self.intercept) and self.intercept > 0):
            raise ValueError(f"intercept must be a positive number of seconds, got intercept={self.intercept!r}")
        for name in ("per_width", "per_context"):
            value = getattr(self, name)
            if not (np.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {name}={value!r}")

    def __call__(self, context: int, width: int = 1) -> float:
        if context < 0 or width < 1:
            raise ValueError(f"need context >= 0 and width >= 1, got context={context}, width={width}")
        return self.intercept + self.per_width * (width - 1) + self.per_context * context


@dataclass(frozen=True)
class LatencyModel:
    """Draft and target pass-time fits of one machine/configuration (module docstring)."""

    draft: PassTimeFit
    target: PassTimeFit
    key: str = ""

    def draft_time(self, context_length: int) -> float:
        """``t_q(l)``: one draft pass (width 1) at context length ``l``."""
        return self.draft(context_length, 1)

    def target_time(self, context_length: int) -> float:
        """``t_p(l)``: one target pass over the root alone at context length ``l``."""
        return self.target(context_length, 1)

    def time_models(self, context_length: int) -> tuple[Callable[[int], float], Callable[[int], float]]:
        """Eq. (11)'s ``(t_q, t_p)`` at a root of length ``l`` (module docstring), for
        :func:`spec_ref.selector.latency_estimate` / :func:`~spec_ref.selector.latency_table`."""
        root = int(context_length)

        def t_q(length: int) -> float:
            return self.draft(length, 1)

        def t_p(length: int) -> float:
            if length < root:
                raise ValueError(f"target_time needs a length >= the root's {root}, got {length}")
            return self.target(root, length - root + 1)

        return t_q, t_p

    def latency_table(self, context_length: int, actions: Sequence[Action]) -> npt.NDArray[np.float64]:
        """``T_hat(x, a)`` of eq. (11) for every action at context length ``l``: ``[A]`` float64."""
        out: npt.NDArray[np.float64] = latency_table(context_length, actions, *self.time_models(context_length))
        return out

    def to_json(self) -> dict[str, Any]:
        return {"draft": asdict(self.draft), "target": asdict(self.target), "key": self.key}

    @staticmethod
    def from_json(data: dict[str, Any]) -> LatencyModel:
        return LatencyModel(PassTimeFit(**data["draft"]), PassTimeFit(**data["target"]), str(data.get("key", "")))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def measure_pass_times(
    model: Drafter,
    vocab_size: int,
    contexts: Sequence[int],
    widths: Sequence[int],
    repeats: int = 3,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> list[PassTime]:
    """Median wall time of a forward over ``w`` tree entries behind ``c`` cached tokens, for every
    ``(c, w)`` in ``contexts x widths`` (batch 1). ``model`` is any drafter (wrap a target in
    :class:`~spec_fast.drafts.model.ModelDrafter`). Token ids are random in ``[0, vocab_size)``."""
    if not contexts or not widths or min(contexts) < 1 or min(widths) < 1:
        raise ValueError(f"contexts and widths must be non-empty lists of integers >= 1, got {contexts!r}, {widths!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got repeats={repeats!r}")
    dev = torch.device(device)
    generator = torch.Generator().manual_seed(seed)
    points: list[PassTime] = []
    for context in contexts:
        state = model.begin(1, dev)
        prompt = torch.randint(0, vocab_size, (1, context), generator=generator).to(dev)
        chain = (torch.arange(context) - 1).unsqueeze(0).to(dev)  # parents: a chain below the context
        model.forward(state, prompt, chain)
        model.commit(state, torch.arange(context, device=dev).unsqueeze(0), torch.tensor([context], device=dev))
        warmed = False
        for width in widths:
            tokens = torch.randint(0, vocab_size, (1, width), generator=generator).to(dev)
            parents = torch.full((1, width), -1, dtype=torch.long, device=dev)  # a root and its children
            parents[0, 1:] = 0
            timings: list[float] = []
            for attempt in range(repeats + (0 if warmed else 1)):
                _sync(dev)
                start = time.perf_counter()
                model.forward(state, tokens, parents)
                _sync(dev)
                elapsed = time.perf_counter() - start
                model.commit(state, torch.zeros(1, 1, dtype=torch.long, device=dev), torch.zeros(1, dtype=torch.long, device=dev))
                if warmed or attempt > 0:
                    timings.append(elapsed)
            warmed = True
            points.append(PassTime(int(context), int(width), float(statistics.median(timings))))
    return points


def fit_pass_time(points: Sequence[PassTime]) -> PassTimeFit:
    """Non-negative least-squares fit of ``intercept + per_width (w - 1) + per_context c`` (module docstring)."""
    from scipy.optimize import nnls

    if len(points) == 0:
        raise ValueError("points must hold at least one measurement, got none")
    design = np.array([[1.0, p.width - 1.0, float(p.context)] for p in points])
    seconds = np.array([p.seconds for p in points])
    if not np.all(np.isfinite(seconds)) or np.any(seconds <= 0):
        raise ValueError(f"measured seconds must be positive, got {seconds.tolist()}")
    coefficients, _ = nnls(design, seconds)
    intercept, per_width, per_context = (float(c) for c in coefficients)
    return PassTimeFit(max(intercept, MIN_INTERCEPT), per_width, per_context)


def measure_latency(
    target: Drafter,
    draft: Drafter,
    vocab_size: int,
    contexts: Sequence[int] = (64, 192, 384),
    target_widths: Sequence[int] = (1, 5, 13, 25, 41),
    draft_widths: Sequence[int] = (1, 2, 4),
    repeats: int = 3,
    device: torch.device | str = "cpu",
    key: str = "",
) -> LatencyModel:
    """The warm-up run: measure both models on the grid and fit them (a few seconds on SmolLM2, CPU).

    The default target widths span eq. (11)'s trees, from the root alone to ``1 + 8 + 4 * 8 = 41``.
    """
    target_points = measure_pass_times(target, vocab_size, contexts, target_widths, repeats, device)
    draft_points = measure_pass_times(draft, vocab_size, contexts, draft_widths, repeats, device)
    return LatencyModel(fit_pass_time(draft_points), fit_pass_time(target_points), key)


def cache_key(target_name: str, draft_name: str, dtype: str, device: torch.device | str = "cpu") -> str:
    """``machine|arch|device|threads|target|draft|dtype``: what a cached latency model is valid for."""
    dev = torch.device(device)
    hardware = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or platform.machine()
    return "|".join([platform.node(), platform.machine(), hardware, str(dev), f"threads={torch.get_num_threads()}",
                     target_name, draft_name, dtype])


def load_or_measure(path: str | None, key: str, measure: Callable[[], LatencyModel], refresh: bool = False) -> LatencyModel:
    """The model cached under ``key`` in the JSON file ``path``, else ``measure()`` (then stored there).

    ``path=None`` always measures; ``refresh`` re-measures and overwrites the entry.
    """
    entries: dict[str, Any] = {}
    if path is not None and os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            entries = json.load(handle)
        if not isinstance(entries, dict):
            raise ValueError(f"{path} must hold a JSON object of latency models, got {type(entries).__name__}")
        if key in entries and not refresh:
            return LatencyModel.from_json(entries[key])
    model = measure()
    model = LatencyModel(model.draft, model.target, key)
    if path is not None:
        entries[key] = model.to_json()
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(entries, handle, indent=1, sort_keys=True)
    return model
