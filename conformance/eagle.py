"""EAGLE's sampled tree verification, written from its public code contract in the kit's tree signature.

``SafeAILab/EAGLE``, ``eagle/model/utils.py``, ``evaluate_posterior`` (the branch with a logits processor,
i.e. temperature > 0), read at commit 8009b6d89d72. Level by level from the root, with the target law ``gtp``
of the accepted node:

* the distinct child tokens are tried in candidate order, each with a fresh ``r = random.random()``; a child
  x is accepted when ``r <= gtp[x] / 1`` (the draft probability is taken as 1: EAGLE-2/3 trees are
  deterministic top-k expansions); a rejected x is removed, ``gtp[x] = 0; gtp = gtp / gtp.sum()``;
* when no child is accepted the next token is drawn from the adjusted ``gtp``; after an accepted leaf, from
  the target law there.

This is recursive rejection with a one-hot draft per sibling (SpecInfer with q = 1), i.e. a target draw per
visited node: lossless for any tree, drafted deterministically or not. EAGLE does not use Medusa's typical
acceptance.

Exact mode: ``r <= t`` is written ``r < t`` (same probability for a continuous uniform).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from spec_ref import DraftTree

from conformance._common import categorical, without

__all__ = ["evaluate_posterior"]


def evaluate_posterior(tree: DraftTree, target: Callable[[tuple[int, ...]], Any], rng: Any) -> list[int]:
    """EAGLE's ``evaluate_posterior`` at temperature > 0 on a draft tree, then its draw of the next token."""
    node, committed = 0, list[int]()
    while True:
        gtp: Sequence[Any] = list(target(tree.path_tokens(node)))
        accepted = None
        for token, child in tree.children[node].items():
            if rng.uniform() < gtp[token]:  # r <= px / qx with qx = 1
                accepted = child
                break
            kept = without(gtp, [token])
            total = sum(kept)
            gtp = [x / total for x in kept]
        if accepted is None:
            return committed + [categorical(rng, gtp)]
        committed.append(tree.tokens[accepted])
        node = accepted
