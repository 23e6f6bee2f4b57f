"""The decoding operator G, batched in torch: temperature -> top-k -> top-p -> softmax.

Same definition and tie-breaks as :func:`spec_ref.decoding_operator` (ALGORITHMS.md section 2):

1. greedy rows (``temperature == 0``) are one-hot at ``argmax`` of the raw logits, lowest id on ties;
2. top-k (``1 <= k < V``) keeps every token whose logit is ``>=`` the k-th largest (ties at the threshold
   kept). It is applied to the raw logits: dividing by ``T > 0`` is monotone, and comparing the raw float32
   logits avoids two distinct logits rounding to the same ``z`` after the division;
3. top-p (``0 < p < 1``): tokens sorted by (probability descending, id ascending) -- a stable descending
   sort of the logits gives this order -- and the token at sorted position ``j`` is kept iff the mass
   strictly before ``j`` is ``< top_p``. Masses are accumulated in float64, as in the reference;
4. ``softmax`` of the surviving ``z = logits / T`` in float32.

Rows only differ from the float64 reference where a top-p boundary mass lies within float rounding of
``top_p`` (the differential test counts such rows).

:class:`SamplingParams` holds one request's parameters of G (and its seed); :func:`sampling_probs` applies
G with them to logits of any leading shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

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
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got seed={self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def decoding_operator(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
) -> torch.Tensor:
    """G(logits) per row.

    Args:
        logits: ``[B, V]`` float (float32/bf16/fp16; computed in float32). ``-inf`` allowed, NaN/+inf not.
        temperature: ``[B]`` float, ``>= 0``; ``0`` means greedy.
        top_k: ``[B]`` int, ``0`` (or ``>= V``) means off.
        top_p: ``[B]`` float in ``(0, 1]``, ``1.0`` means off.

    Returns:
        ``[B, V]`` float32 probabilities (greedy rows one-hot).
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [B, V], got shape {tuple(logits.shape)}")
    batch, vocab = logits.shape
    for name, t in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p)):
        if t.shape != (batch,):
            raise ValueError(f"{name}.shape={tuple(t.shape)} must be (B,)={(batch,)}")
    device = logits.device
    raw = logits.to(torch.float32)
    temperature = temperature.to(device=device, dtype=torch.float32)
    top_k = top_k.to(device=device, dtype=torch.int64)
    top_p = top_p.to(device=device, dtype=torch.float64)
    greedy = temperature == 0  # [B]

    # One stable descending sort: order = (logit desc, id asc) = (probability desc, id asc).
    sorted_logits, order = torch.sort(raw, dim=1, descending=True, stable=True)  # [B, V]

    # top-k on the raw logits: keep logits >= the k-th largest.
    use_top_k = (top_k >= 1) & (top_k < vocab)  # [B]
    kth_index = (top_k.clamp(1, vocab) - 1).unsqueeze(1)  # [B, 1]
    kth_value = sorted_logits.gather(1, kth_index)  # [B, 1]
    threshold = torch.where(use_top_k.unsqueeze(1), kth_value, torch.full_like(kth_value, -float("inf")))
    keep_sorted = sorted_logits >= threshold  # [B, V]; -inf logits only survive when no top-k applies

    # z = logits / T on the sorted view (T = 1 stands in for greedy rows, which are overwritten).
    safe_t = torch.where(greedy, torch.ones_like(temperature), temperature).unsqueeze(1)  # [B, 1]
    z_sorted = torch.where(keep_sorted, sorted_logits / safe_t, torch.full_like(sorted_logits, -float("inf")))

    # top-p: exclusive cumulative float64 mass in sorted order.
    use_top_p = top_p < 1.0  # [B]
    probs_sorted = torch.softmax(z_sorted.to(torch.float64), dim=1)  # [B, V]
    mass_before = torch.cumsum(probs_sorted, dim=1) - probs_sorted
    keep_p = (mass_before < top_p.unsqueeze(1)) | ~use_top_p.unsqueeze(1)
    z_sorted = torch.where(keep_p, z_sorted, torch.full_like(z_sorted, -float("inf")))

    z = torch.empty_like(z_sorted).scatter_(1, order, z_sorted)  # back to token order
    probs = torch.softmax(z, dim=1)

    greedy_token = torch.argmax(raw, dim=1, keepdim=True)  # [B, 1], first maximum
    one_hot = torch.zeros_like(probs).scatter_(1, greedy_token, 1.0)
    return torch.where(greedy.unsqueeze(1), one_hot, probs)


def sampling_probs(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """``[..., V]`` logits -> G(logits) ``[..., V]`` float32 with one request's parameters."""
    flat = logits.reshape(-1, logits.shape[-1])
    rows = flat.shape[0]
    t = torch.full((rows,), float(sampling.temperature), device=flat.device)
    k = torch.full((rows,), int(sampling.top_k), dtype=torch.long, device=flat.device)
    p = torch.full((rows,), float(sampling.top_p), device=flat.device)
    return decoding_operator(flat, t, k, p).reshape(logits.shape)
