"""llama.cpp's speculative acceptance, written from its public code contract in the kit's chain signature.

``ggml-org/llama.cpp``, ``common/sampling.h`` / ``common/sampling.cpp``, ``common_sampler_sample_and_accept_n``
(used by ``tools/server`` and ``examples/speculative-simple``): the target's own sampler chain draws a token
at each drafted position in turn; a draft token is accepted only when it *equals* the target's sample, the
first mismatch commits the target's sample and stops, and after a full match one more target sample follows.
The draft probabilities are never read.

Every committed token is a sample of the target at its position, so the rule is lossless for any draft: it
gives up acceptance (a draft x is kept with probability p(x), not min(1, p(x)/q(x))), not exactness.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conformance._common import categorical

__all__ = ["sample_and_accept_n"]


def sample_and_accept_n(target_probs: Any, draft_probs: Any, draft_tokens: Sequence[int], rng: Any) -> list[int]:
    """llama.cpp's ``common_sampler_sample_and_accept_n`` on one drafted chain."""
    committed: list[int] = []
    for i, x in enumerate(draft_tokens):
        sampled = categorical(rng, list(target_probs[i]))
        committed.append(sampled)
        if sampled != x:
            return committed
    committed.append(categorical(rng, list(target_probs[len(draft_tokens)])))
    return committed
