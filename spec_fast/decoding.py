"""The decoding operator G, batched in torch: temperature -> top-k -> top-p -> softmax.

Same definition and tie-breaks as :func:`spec_ref.decoding_operator` (docs/algorithms.md section 2):

1. greedy rows (``temperature == 0``) are one-hot at ``argmax`` of the raw logits, lowest id on ties;
2. top-k (``1 <= k < V``) keeps every token whose logit is ``>=`` the k-th largest (ties at the threshold
   kept). It is applied to the raw logits: dividing by ``T > 0`` is monotone, and comparing the raw float32
   logits avoids two distinct logits rounding to the same ``z`` after the division;
3. top-p (``0 < p < 1``): tokens sorted by (probability descending, id ascending) -- a stable descending
   sort of the logits gives this order -- and the token at sorted position ``j`` is kept iff the mass
   strictly before ``j`` is ``< top_p``. Masses are accumulated in float64, as in the reference;
4. ``softmax`` of the surviving ``z = (logits - max logit) / T`` in float32. Shifting before dividing
   gives the same distribution and never overflows: at a tiny temperature (1e-38) ``logits / T`` would be
   ``inf`` and the softmax NaN, while the shifted ``z`` is 0 at the maxima and ``-inf`` or very negative
   elsewhere, i.e. the T -> 0 limit (uniform over the tied maxima), as in the reference.

Rows only differ from the float64 reference where a top-p boundary mass lies within float rounding of
``top_p`` (the differential test counts such rows).

:class:`SamplingParams` holds one request's parameters of G (and its seed); :func:`sampling_probs` applies
G with them to logits of any leading shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spec_fast._sampling import first_max_index

__all__ = ["decoding_operator", "SamplingParams", "sampling_probs"]


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 = greedy; ``top_k`` 0 = off; ``top_p`` 1.0 = off; ``seed`` for reproducibility."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not (t >= 0 and t < float("inf")):
            raise ValueError(f"temperature must be a finite number >= 0, got temperature={t!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got top_k={self.top_k!r}")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1] (1 = off), got top_p={p!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**64 - 1:
            # seed keys the request's 64-bit counter streams (spec_fast.draws); the bound is kept from seed + 1
            raise ValueError(f"seed must be an integer in [0, 2**64 - 1), got seed={self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def law(self) -> tuple[float, int, float]:
        """``(temperature, top_k, top_p)``: what fixes the sampling law G (the seed aside)."""
        return (self.temperature, self.top_k, self.top_p)


def decoding_operator(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    validate: bool = True,
    filtered: bool = True,
) -> torch.Tensor:
    """G(logits) per row.

    Args:
        logits: ``[B, V]`` float (float32/bf16/fp16; computed in float32). ``-inf`` allowed, NaN/+inf not.
        temperature: ``[B]`` float, ``>= 0``; ``0`` means greedy.
        top_k: ``[B]`` int, ``0`` (or ``>= V``) means off.
        top_p: ``[B]`` float in ``(0, 1]``, ``1.0`` means off.
        validate: refuse NaN/+inf logits, all ``-inf`` rows and bad parameters with a ``ValueError``
            naming the argument (reads values on the host); the engine, whose parameters are already
            validated by ``SamplingParams``, passes ``False``.
        filtered: ``False`` promises that no row uses top-k or top-p (every ``top_k`` 0 or ``>= V``, every
            ``top_p`` 1): the vocabulary is then not sorted (a sort of 49152 logits cost 4 ms a step on the
            CPU), with bit for bit the same result.

    Returns:
        ``[B, V]`` float32 probabilities (greedy rows one-hot).
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [B, V], got shape {tuple(logits.shape)}")
    batch, vocab = logits.shape
    for name, t in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p)):
        if t.shape != (batch,):
            raise ValueError(f"{name}.shape={tuple(t.shape)} must be (B,)={(batch,)}")
    if validate:
        _check_values(logits, temperature, top_k, top_p)
    device = logits.device
    raw = logits.to(torch.float32)
    greedy = (temperature == 0).to(device)  # [B], before a float32 cast could flush a tiny T to 0
    # A positive T below float32's smallest normal divides like that normal: the shifted z of every
    # non-maximal logit is then already far below exp's float32 underflow, the same T -> 0 limit.
    temperature = temperature.to(device=device, dtype=torch.float32).clamp_min(torch.finfo(torch.float32).tiny)
    top_k = top_k.to(device=device, dtype=torch.int64)
    top_p = top_p.to(device=device, dtype=torch.float64)
    safe_t = torch.where(greedy, torch.ones_like(temperature), temperature).unsqueeze(1)  # [B, 1]
    greedy_token = first_max_index(raw, dim=1, keepdim=True)  # [B, 1], first maximum

    if filtered:
        probs = torch.softmax(_filtered_z(raw, safe_t, top_k, top_p), dim=1)
    else:  # the same z as the filtered path's without filters, computed in token order
        probs = _tempered_softmax(raw, safe_t)
    one_hot = torch.zeros_like(probs).scatter_(1, greedy_token, 1.0)
    return torch.where(greedy.unsqueeze(1), one_hot, probs)


def _tempered_softmax(raw: torch.Tensor, safe_t: torch.Tensor) -> torch.Tensor:
    """``softmax((raw - row max) / T)`` of float32 logits ``[B, V]`` and ``safe_t [B, 1]`` (an all ``-inf``
    row shifted by 0): G without top-k or top-p."""
    row_max = raw.max(dim=1, keepdim=True).values if raw.shape[1] > 0 else raw[:, :1]
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    return torch.softmax((raw - row_max) / safe_t, dim=1)


def _filtered_z(raw: torch.Tensor, safe_t: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """``z [B, V]``: the tempered, shifted logits with top-k and top-p applied (``-inf`` where cut)."""
    vocab = raw.shape[1]
    # One stable descending sort: order = (logit desc, id asc) = (probability desc, id asc).
    sorted_logits, order = torch.sort(raw, dim=1, descending=True, stable=True)  # [B, V]

    # top-k on the raw logits: keep logits >= the k-th largest.
    use_top_k = (top_k >= 1) & (top_k < vocab)  # [B]
    kth_index = (top_k.clamp(1, vocab) - 1).unsqueeze(1)  # [B, 1]
    kth_value = sorted_logits.gather(1, kth_index)  # [B, 1]
    threshold = torch.where(use_top_k.unsqueeze(1), kth_value, torch.full_like(kth_value, -float("inf")))
    keep_sorted = sorted_logits >= threshold  # [B, V]; -inf logits only survive when no top-k applies

    # z = (logits - max) / T on the sorted view (T = 1 stands in for greedy rows, which are overwritten).
    # The shift keeps z <= 0: no overflow to inf (and no NaN softmax) however small T is.
    row_max = sorted_logits[:, :1]
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))  # an all -inf row
    z_sorted = torch.where(
        keep_sorted, (sorted_logits - row_max) / safe_t, torch.full_like(sorted_logits, -float("inf"))
    )

    # top-p: exclusive cumulative float64 mass in sorted order.
    use_top_p = top_p < 1.0  # [B]
    probs_sorted = torch.softmax(z_sorted.to(torch.float64), dim=1)  # [B, V]
    mass_before = torch.cumsum(probs_sorted, dim=1) - probs_sorted
    keep_p = (mass_before < top_p.unsqueeze(1)) | ~use_top_p.unsqueeze(1)
    z_sorted = torch.where(keep_p, z_sorted, torch.full_like(z_sorted, -float("inf")))

    return torch.empty_like(z_sorted).scatter_(1, order, z_sorted)  # back to token order


def _check_values(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> None:
    """ValueError naming the first bad entry: NaN/+inf logits, an all -inf row, T < 0 or not finite,
    top_k < 0, top_p outside (0, 1]."""
    if not logits.dtype.is_floating_point:
        raise ValueError(f"logits must be a floating-point tensor, got logits.dtype={logits.dtype}")
    bad = (torch.isnan(logits) | torch.isposinf(logits)).nonzero()
    if bad.shape[0]:
        b, v = (int(i) for i in bad[0])
        raise ValueError(f"logits must be finite or -inf, got logits[{b}, {v}]={float(logits[b, v])!r}")
    empty = torch.isneginf(logits).all(dim=1).nonzero()
    if empty.shape[0] and logits.shape[1] > 0:
        raise ValueError(f"logits must have a finite entry in every row, got logits[{int(empty[0])}] all -inf")
    for name, values, ok in (
        ("temperature", temperature, torch.isfinite(temperature) & (temperature >= 0)),
        ("top_k", top_k, top_k >= 0),
        ("top_p", top_p, (top_p > 0) & (top_p <= 1)),  # NaN fails both
    ):
        wrong = (~ok).nonzero()
        if wrong.shape[0]:
            b = int(wrong[0])
            raise ValueError(f"{name} must be {_RULES[name]}, got {name}[{b}]={values[b].item()!r}")


_RULES = {"temperature": "finite and >= 0", "top_k": "an integer >= 0 (0 = off)", "top_p": "in (0, 1]"}


def sampling_probs(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """``[..., V]`` logits -> G(logits) ``[..., V]`` float32 with one request's parameters."""
    flat = logits.reshape(-1, logits.shape[-1])
    rows = flat.shape[0]
    # float64: a tiny T (1e-300) must not flush to 0 (greedy) before the operator sees it
    t = torch.full((rows,), float(sampling.temperature), dtype=torch.float64, device=flat.device)
    k = torch.full((rows,), int(sampling.top_k), dtype=torch.long, device=flat.device)
    p = torch.full((rows,), float(sampling.top_p), device=flat.device)
    filtered = 0 < sampling.top_k < logits.shape[-1] or sampling.top_p < 1.0
    if sampling.temperature > 0 and not filtered:
        # decoding_operator's unfiltered path for rows known not greedy (no one-hot to build and discard):
        # the same operations on the same values, so the same probabilities bit for bit
        safe_t = t.to(torch.float32).clamp_min(torch.finfo(torch.float32).tiny).unsqueeze(1)  # [R, 1]
        return _tempered_softmax(flat.to(torch.float32), safe_t).reshape(logits.shape)
    return decoding_operator(flat, t, k, p, validate=False, filtered=filtered).reshape(logits.shape)  # checked
