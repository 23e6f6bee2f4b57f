"""Per-generation metrics (docs/engine.md section 6 definitions).

* ``block_efficiency`` = generated tokens / target verification passes (each pass emits tau + 1 tokens,
  the bonus or correction token included; AR has 1.0);
* ``accepted_length_histogram[t]`` = number of (row, step) pairs that accepted exactly ``t`` draft tokens;
* ``per_depth_acceptance[d-1]`` = P(depth ``d`` accepted | the step's tree reached depth ``d``);
* seed 003 (docs/papers.md) section 4.2: ``mean_accepted_length`` = mean draft tokens accepted per
  verification step, the extra token excluded (its average committed path length; equals
  ``block_efficiency - 1``, the tokens per iteration being ``block_efficiency``);
  ``acceptance_rate`` = (accepted draft tokens + one extra token per drafting step) / sum of the drafted
  trees' depths, over the steps that drafted: its "Accept." counts the bonus token, so it reaches
  ``(D + 1) / D`` when every path of depth D is accepted and may exceed 1, as its tables show;
* ``ttft_s`` = time to the first generated token (prefill + first step), ``tpot_s`` = mean time per
  output token after the first, ``tokens_per_s`` = generated tokens / wall time;
* ``peak_memory_bytes`` = CUDA peak allocation on GPU, process max RSS on CPU.
"""

from __future__ import annotations

import resource
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

__all__ = ["GenerationMetrics", "peak_memory_bytes"]


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


@dataclass
class GenerationMetrics:
    strategy: str = ""
    batch_size: int = 1
    prompt_tokens: int = 0
    #: prompt tokens whose cache entries a prefix cache supplied (not prefilled)
    cached_prompt_tokens: int = 0
    generated_tokens: int = 0
    target_passes: int = 0
    draft_passes: int = 0
    wall_s: float = 0.0
    ttft_s: float = 0.0
    accepted_length_histogram: list[int] = field(default_factory=list)
    depth_reached: list[int] = field(default_factory=list)
    depth_accepted: list[int] = field(default_factory=list)
    peak_memory_bytes: int = 0
    #: dual drafts (heads 1, 2): draft tokens accepted from each head's tree, and per (row, step) the head
    #: whose tree was verified (route) or that supplied the accepted path (merge; steps accepting none
    #: count for neither)
    head_accepted_tokens: list[int] = field(default_factory=list)
    head_selected: list[int] = field(default_factory=list)
    #: ``--strategy nde``: seconds spent in the selector (features, network, the choice read back), the
    #: steps it chose a shape for, and how often it chose each action ``"K,L1,L2"``
    selector_s: float = 0.0
    selector_steps: int = 0
    nde_actions: dict[str, int] = field(default_factory=dict)

    @property
    def block_efficiency(self) -> float:
        steps = sum(self.accepted_length_histogram)
        emitted = sum((t + 1) * n for t, n in enumerate(self.accepted_length_histogram))
        return emitted / steps if steps else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def tpot_s(self) -> float:
        per_row = self.generated_tokens / max(self.batch_size, 1)
        return (self.wall_s - self.ttft_s) / (per_row - 1) if per_row > 1 else 0.0

    @property
    def mean_accepted_length(self) -> float:
        steps = sum(self.accepted_length_histogram)
        accepted = sum(t * n for t, n in enumerate(self.accepted_length_histogram))
        return accepted / steps if steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        # every drafting step reaches depth 1: depth_reached[0] counts them; sum(depth_reached) = sum of depths
        drafted_depth = sum(self.depth_reached)
        committed = sum(self.depth_accepted) + (self.depth_reached[0] if self.depth_reached else 0)
        return committed / drafted_depth if drafted_depth else 0.0

    @property
    def selector_ms(self) -> float:
        """Mean milliseconds of the NDE selector per step (0 without it)."""
        return 1000 * self.selector_s / self.selector_steps if self.selector_steps else 0.0

    @property
    def per_depth_acceptance(self) -> list[float]:
        return [a / r if r else 0.0 for a, r in zip(self.depth_accepted, self.depth_reached)]

    def record_step(self, accepted: list[int], tree_depths: list[int]) -> None:
        """One verification step: ``accepted[b]`` draft tokens accepted by row b, whose tree had depth
        ``tree_depths[b]``."""
        for tau, depth in zip(accepted, tree_depths):
            while len(self.accepted_length_histogram) <= tau:
                self.accepted_length_histogram.append(0)
            self.accepted_length_histogram[tau] += 1
            while len(self.depth_reached) < depth:
                self.depth_reached.append(0)
                self.depth_accepted.append(0)
            for d in range(depth):
                self.depth_reached[d] += 1
                if d < tau:
                    self.depth_accepted[d] += 1

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            block_efficiency=self.block_efficiency,
            tokens_per_s=self.tokens_per_s,
            tpot_s=self.tpot_s,
            per_depth_acceptance=self.per_depth_acceptance,
            mean_accepted_length=self.mean_accepted_length,
            acceptance_rate=self.acceptance_rate,
            selector_ms=self.selector_ms,
        )
        return out
