"""Per-request random streams: every draw a request makes comes from its own counter-based uniforms.

A request (a row of the running batch) has two keys derived from its seed (:func:`stream_key`): one for
its draft draws, one for the verifier's uniforms. Its counters advance with *its own* steps only
(``STEP_STRIDE`` counters per step and purpose), so the numbers a request draws do not depend on which
other requests share the batch, on their number, or on the step at which it joined
(:func:`spec_fast.rng.counter_uniforms` is a pure function of key and counter).

Within one step, draft level ``l``'s draws of frontier node ``f`` (the row's own frontier order) take
counters ``l * LEVEL_STRIDE + f * K + j`` (``K`` draws per node), and the verifier's node ``u`` takes
``u * M + m`` (``M`` uniforms per node, fixed by the strategy). Categorical draws are inverse-CDF draws on
float64 prefix sums (:func:`categorical`), like the verifier's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spec_fast.rng import counter_uniforms

__all__ = ["DRAFT", "VERIFY", "STEP_STRIDE", "LEVEL_STRIDE", "stream_key", "RowStreams", "categorical"]

#: purposes of a request's two streams
DRAFT, VERIFY = 0, 1
#: counters one request may use per step and purpose (a tree of 2**20 levels x 2**20 draws per level)
STEP_STRIDE = 1 << 40
#: counters one draft level may use (frontier nodes x draws per node)
LEVEL_STRIDE = 1 << 20

_MASK64 = (1 << 64) - 1


def _mix(value: int) -> int:
    """SplitMix64 finaliser on a Python int (mod 2**64)."""
    z = (value + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def stream_key(seed: int, stream: int, purpose: int) -> int:
    """The int64 key of stream ``stream`` (a request's index among those sharing one seed, e.g. the row of
    a ``generate`` batch; 0 for a request of its own) of ``seed``, for ``purpose`` (:data:`DRAFT` or
    :data:`VERIFY`). Distinct ``(seed, stream, purpose)`` give unrelated keys."""
    key = _mix(_mix(_mix(seed) ^ stream) ^ purpose)
    return key - (1 << 64) if key >= (1 << 63) else key


@dataclass(frozen=True, eq=False)
class RowStreams:
    """One step's draft stream of every row: ``keys [B]`` int64 and ``offsets [B]`` int64 (the first
    counter of this step)."""

    keys: torch.Tensor
    offsets: torch.Tensor

    def uniforms(self, level: int, width: int) -> torch.Tensor:
        """``[B, width]`` float32 uniforms of draft level ``level`` (counters ``level * LEVEL_STRIDE + i``)."""
        return counter_uniforms(self.keys, self.offsets + level * LEVEL_STRIDE, (int(self.keys.shape[0]), width),
                                self.keys.device)


def categorical(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draws: ``weights [R, V]`` (non-negative), ``uniforms [R, K]`` in [0, 1) -> ``[R, K]``
    long, each the smallest index whose float64 prefix sum exceeds ``u * total``; never a zero-weight
    index (a zero row gives 0)."""
    cumulative = torch.cumsum(weights, dim=1, dtype=torch.float64)  # [R, V]
    total = cumulative[:, -1:].contiguous()
    index = torch.searchsorted(cumulative, (uniforms.to(torch.float64) * total).contiguous(), right=True)
    last_positive = torch.searchsorted(cumulative, total, right=False)
    return torch.minimum(index, last_positive).clamp_(0, weights.shape[1] - 1)
