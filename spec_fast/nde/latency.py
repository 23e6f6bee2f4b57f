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
2. :func:`fit_pass_table` fits ``time(c, w) = base(w) + per_context * c`` with one ``base`` value per measured
   width (non-negative least squares), linear between measured widths and along the last segment's slope
   beyond them, and takes the running maximum over widths so a wider pass never costs less. Why a table:
   on a CPU the cost of a pass is far from linear in its width (a pass over 2 tokens costs 1.4-1.7x one
   over 1, a pass over 8 about 3x: matrix-vector against matrix-matrix products, measured in
   bench/results/target_cost.md and bench/results/selector_train.md), and a straight line through widths
   1..41 priced the second token at a fraction of its cost, which made speculation look cheaper than it
   was. :func:`fit_pass_time` (the linear law ``intercept + per_width (w - 1) + per_context c``, every
   coefficient >= 0) still reads older cached models.
3. :class:`LatencyModel` turns the two fits into eq. (11)'s one-argument time functions at a root of length
   ``l`` (:meth:`LatencyModel.time_models`): ``t_q(x)`` = one draft pass of width 1 at context ``x``;
   ``t_p(x)`` = one target pass at context ``l`` over ``x - l + 1`` entries (the root and the drafted
   tree), which is what eq. (11)'s argument ``l + L1 + K L2`` means for the target. Eq. (11)'s draft terms
   carry no width, so a branch level of ``K`` entries is priced as a width-1 pass.
4. :meth:`LatencyModel.step_time` prices an action the way the engine runs an NDE step, which is what the
   dataset's T_hat uses: eq. (11)'s terms, but every branch level after the branch point drafts ``K``
   entries (a draft pass over 4 entries, with their laws, costs about twice one over 1 here), and a plain
   step (``L1 + L2 = 0``) still pays one draft pass at the root, which the selector's features read
   (seed 002 footnote 4: the draft runs on the root anyway). :meth:`LatencyModel.latency_table` stays eq.
   (11) verbatim (:func:`spec_ref.selector.latency_table`).

   It also adds the decoding operator G on every row the step draws from or verifies (:func:`engine_law`,
   timed per row by :func:`measure_law_time`): G sorts the vocabulary, about 6 ms per row at V = 49152 on
   this CPU, so an extra node costs a law as well as a wider pass.

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
from dataclasses import asdict, dataclass, replace
from typing import Any, Union

import numpy as np
import numpy.typing as npt
import torch

from spec_fast.decoding import decoding_operator
from spec_fast.drafts.model import Drafter
from spec_ref.selector import Action, latency_table

__all__ = ["PassTime", "PassTimeFit", "PassTimeTable", "PassTimeModel", "LatencyModel", "TARGET_WIDTHS",
           "engine_law", "measure_pass_times", "measure_law_time", "fit_pass_time", "fit_pass_table", "measure_latency", "cache_key", "load_or_measure"]

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
class PassTimeTable:
    """``time(context, width) = base(width) + per_context * context`` (seconds); ``base`` is linear between the
    measured ``widths`` (ascending, the first is 1) and continues along the last segment beyond them."""

    widths: tuple[int, ...]
    base: tuple[float, ...]
    per_context: float

    def __post_init__(self) -> None:
        if not self.widths or self.widths[0] != 1 or any(b <= a for a, b in zip(self.widths, self.widths[1:])):
            raise ValueError(f"widths must be ascending integers starting at 1, got widths={self.widths!r}")
        if len(self.base) != len(self.widths):
            raise ValueError(f"base must hold one time per width ({len(self.widths)}), got {len(self.base)}")
        if not all(np.isfinite(b) and b > 0 for b in self.base) or any(b < a for a, b in zip(self.base, self.base[1:])):
            raise ValueError(f"base times must be positive and non-decreasing, got base={self.base!r}")
        if not (np.isfinite(self.per_context) and self.per_context >= 0):
            raise ValueError(f"per_context must be finite and >= 0, got per_context={self.per_context!r}")

    def __call__(self, context: int, width: int = 1) -> float:
        if context < 0 or width < 1:
            raise ValueError(f"need context >= 0 and width >= 1, got context={context}, width={width}")
        base = float(np.interp(width, self.widths, self.base))
        if width > self.widths[-1] and len(self.widths) > 1:
            slope = (self.base[-1] - self.base[-2]) / (self.widths[-1] - self.widths[-2])
            base = self.base[-1] + slope * (width - self.widths[-1])
        return base + self.per_context * context


PassTimeModel = Union[PassTimeFit, PassTimeTable]


def _model_to_json(model: PassTimeModel) -> dict[str, Any]:
    if isinstance(model, PassTimeTable):
        return {"widths": list(model.widths), "base": list(model.base), "per_context": model.per_context}
    return asdict(model)


def _model_from_json(data: dict[str, Any]) -> PassTimeModel:
    if "widths" in data:
        return PassTimeTable(tuple(int(w) for w in data["widths"]), tuple(float(b) for b in data["base"]),
                             float(data["per_context"]))
    return PassTimeFit(**data)


@dataclass(frozen=True)
class LatencyModel:
    """Draft and target pass-time models of one machine/configuration (module docstring)."""

    draft: PassTimeModel
    target: PassTimeModel
    key: str = ""
    #: seconds of the decoding operator G per row (:func:`engine_law`), added by :meth:`step_time`
    law_per_row: float = 0.0

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

    def step_time(self, context_length: int, action: Action) -> float:
        """Eq. (11) priced as the engine runs an NDE step (module docstring, point 4)."""
        k, l1, l2 = action
        widths = [1] * l1 + [1 if j == 0 else k for j in range(l2)]  # the branch point's pass has one entry
        total = sum(self.draft(context_length + j, w) for j, w in enumerate(widths))
        if l1 + l2 == 0:  # the root's draft pass runs anyway (the features read it); no law is drawn from
            total += self.draft(context_length, 1)
        # G on every row a draft pass returns (each is drawn from) and on every target row (each is verified)
        law_rows = sum(widths) + 1 + l1 + k * l2
        return total + self.target(context_length, 1 + l1 + k * l2) + self.law_per_row * law_rows

    def step_table(self, context_length: int, actions: Sequence[Action]) -> npt.NDArray[np.float64]:
        """:meth:`step_time` of every action: ``[A]`` float64 (the dataset's T_hat)."""
        return np.asarray([self.step_time(context_length, a) for a in actions], dtype=np.float64)

    def to_json(self) -> dict[str, Any]:
        return {"draft": _model_to_json(self.draft), "target": _model_to_json(self.target), "key": self.key,
                "law_per_row": self.law_per_row}

    @staticmethod
    def from_json(data: dict[str, Any]) -> LatencyModel:
        return LatencyModel(_model_from_json(data["draft"]), _model_from_json(data["target"]), str(data.get("key", "")),
                            float(data.get("law_per_row", 0.0)))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def engine_law(logits: torch.Tensor) -> torch.Tensor:
    """The decoding operator G on every row of ``logits [B, W, V]`` (T = 1, top-p 0.9), as the engine applies
    it to every target and draft row it verifies or samples from; its cost does not depend on the setting
    (one full sort per row)."""
    flat = logits.reshape(-1, logits.shape[-1])
    rows = flat.shape[0]
    return decoding_operator(flat, torch.ones(rows, dtype=torch.float64, device=flat.device),
                             torch.zeros(rows, dtype=torch.long, device=flat.device),
                             torch.full((rows,), 0.9, device=flat.device), validate=False)


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


def fit_pass_table(points: Sequence[PassTime]) -> PassTimeTable:
    """Non-negative least-squares fit of ``base(w) + per_context c`` (one ``base`` per measured width, which
    must include 1), then the running maximum over widths (module docstring)."""
    from scipy.optimize import nnls

    if len(points) == 0:
        raise ValueError("points must hold at least one measurement, got none")
    widths = sorted({p.width for p in points})
    if widths[0] != 1:
        raise ValueError(f"the measured widths must include 1, got {widths}")
    seconds = np.array([p.seconds for p in points])
    if not np.all(np.isfinite(seconds)) or np.any(seconds <= 0):
        raise ValueError(f"measured seconds must be positive, got {seconds.tolist()}")
    column = {w: i for i, w in enumerate(widths)}
    design = np.zeros((len(points), len(widths) + 1))
    for row, p in enumerate(points):
        design[row, column[p.width]] = 1.0
        design[row, -1] = float(p.context)
    coefficients, _ = nnls(design, seconds)
    base = np.maximum.accumulate(np.maximum(coefficients[:-1], MIN_INTERCEPT))
    return PassTimeTable(tuple(widths), tuple(float(b) for b in base), float(coefficients[-1]))


#: Target widths of the warm-up: every width up to 8 (where a CPU's cost bends most), then eq. (11)'s
#: trees up to ``1 + 8 + 4 * 8 = 41``
TARGET_WIDTHS = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 41)


def measure_latency(
    target: Drafter,
    draft: Drafter,
    vocab_size: int,
    contexts: Sequence[int] = (64, 192, 384),
    target_widths: Sequence[int] = TARGET_WIDTHS,
    draft_widths: Sequence[int] = (1, 2, 3, 4),
    repeats: int = 3,
    device: torch.device | str = "cpu",
    key: str = "",
) -> LatencyModel:
    """The warm-up run: measure both models on the grid and fit a width table to each, and time the
    decoding operator per row (:func:`measure_law_time`; module docstring; about a minute on SmolLM2 on
    this CPU)."""
    target_points = measure_pass_times(target, vocab_size, contexts, target_widths, repeats, device)
    draft_points = measure_pass_times(draft, vocab_size, contexts, draft_widths, repeats, device)
    return LatencyModel(fit_pass_table(draft_points), fit_pass_table(target_points), key,
                        measure_law_time(vocab_size, device=device))


@torch.no_grad()
def measure_law_time(vocab_size: int, rows: int = 8, repeats: int = 5, device: torch.device | str = "cpu") -> float:
    """Seconds per row of :func:`engine_law` over ``vocab_size`` logits (median of ``repeats``, ``rows`` rows each)."""
    dev = torch.device(device)
    logits = torch.randn(1, rows, vocab_size, generator=torch.Generator().manual_seed(0)).mul_(4).to(dev)
    engine_law(logits)
    timings = []
    for _ in range(repeats):
        _sync(dev)
        start = time.perf_counter()
        engine_law(logits)
        _sync(dev)
        timings.append((time.perf_counter() - start) / rows)
    return float(statistics.median(timings))


#: Version of the warm-up's model in :func:`cache_key` (2: width tables; 3-4: with the decoding operator's
#: time per row, which version 3 lost on caching), so older cached models are re-measured
LATENCY_VERSION = 4


def cache_key(target_name: str, draft_name: str, dtype: str, device: torch.device | str = "cpu") -> str:
    """``machine|arch|device|threads|target|draft|dtype|version``: what a cached latency model is valid for."""
    dev = torch.device(device)
    hardware = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or platform.machine()
    return "|".join([platform.node(), platform.machine(), hardware, str(dev), f"threads={torch.get_num_threads()}",
                     target_name, draft_name, dtype, f"latency-v{LATENCY_VERSION}"])


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
    model = replace(measure(), key=key)
    if path is not None:
        entries[key] = model.to_json()
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(entries, handle, indent=1, sort_keys=True)
    return model
