"""Per-request random streams: every draw a request makes comes from its own counter-based uniforms.

A request (a row of the running batch) has two keys derived from its seed (:func:`stream_keys`): one for
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

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from spec_fast.rng import _signed, counter_uniforms, splitmix64

__all__ = ["DRAFT", "VERIFY", "STEP_STRIDE", "LEVEL_STRIDE", "stream_keys", "RowStreams", "categorical"]

#: purposes of a request's two streams
DRAFT, VERIFY = 0, 1
#: counters one request may use per step and purpose (a tree of 2**20 levels x 2**20 draws per level)
STEP_STRIDE = 1 << 40
#: counters one draft level may use (frontier nodes x draws per node)
LEVEL_STRIDE = 1 << 20


def stream_keys(seeds: Sequence[int], streams: Sequence[int], purpose: int, device: torch.device) -> torch.Tensor:
    """``[R]`` int64: the key of stream ``streams[r]`` (a request's index among those sharing one seed, e.g.
    the row of a ``generate`` batch; 0 for a request of its own) of ``seeds[r]``, for ``purpose``
    (:data:`DRAFT` or :data:`VERIFY`): SplitMix64 folded over (seed, stream, purpose), so distinct triples
    give unrelated keys."""
    seed = torch.tensor([_signed(s) for s in seeds], dtype=torch.int64, device=device)
    stream = torch.tensor(list(streams), dtype=torch.int64, device=device)
    return splitmix64(torch.bitwise_xor(splitmix64(torch.bitwise_xor(splitmix64(seed), stream)), purpose))


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
