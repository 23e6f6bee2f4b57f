"""Medusa's typical acceptance, written from its public code contract in the kit's tree signature.

``FasterDecoding/Medusa``, ``medusa/model/utils.py``, read at commit 2b8981448074 (``evaluate_posterior`` with
``sampling='typical'`` and ``fast=True``, ``generate_candidates``), with the defaults of ``medusa_generate``
(``posterior_threshold=0.09``, ``posterior_alpha=0.3``, ``fast=True``); the rule is section 2.3.1 of the Medusa
paper (arXiv 2401.10774), which presents it as a relaxation that does not keep the target's law:

* every root-to-leaf path of the tree is a candidate; position i of a candidate is accepted when its
  target probability exceeds ``min(posterior_threshold, posterior_alpha * exp(-H))`` with
  ``H = -sum p log(p + 1e-5)`` the entropy of the target row there; a candidate's accept length is its number
  of leading accepted positions;
* the candidate with the longest accept length wins, ties to the largest sum of log target probabilities of
  its accepted tokens (the first on equal sums); with accept length 0 the first candidate;
* the token after the accepted ones starts the next step's tree: with ``fast=True`` it is the target argmax
  there (``generate_candidates``: ``if temperature == 0 or fast``).

No randomness is drawn: the rule is a deterministic function of the tree, so the kit enumerates only the
drafts. Entropies and logarithms need floats: the check runs in exact mode with float arithmetic (every draft
branch enumerated with exact weights, the output law compared with the target law up to 1e-12).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from spec_ref import DraftTree

from conformance._common import argmax

__all__ = ["typical_acceptance"]

TreeVerifier = Callable[[DraftTree, Callable[[tuple[int, ...]], Any], Any], list[int]]


def _threshold(p: list[float], posterior_threshold: float, posterior_alpha: float) -> float:
    entropy = -sum(x * math.log(x + 1e-5) for x in p)
    return min(posterior_threshold, math.exp(-entropy) * posterior_alpha)


def typical_acceptance(posterior_threshold: float = 0.09, posterior_alpha: float = 0.3) -> TreeVerifier:
    """Medusa's ``evaluate_posterior(sampling='typical', fast=True)`` followed by its greedy next candidate."""

    def verifier(tree: DraftTree, target: Callable[[tuple[int, ...]], Any], rng: Any) -> list[int]:
        best: tuple[int, float, tuple[int, ...]] | None = None  # (accept length, log likelihood, path)
        for leaf in tree.leaves():  # candidates in node order; the first wins ties
            path = tree.path_tokens(leaf)
            length, likelihood = 0, 0.0
            for i, token in enumerate(path):
                p = [float(x) for x in target(path[:i])]
                if not p[token] > _threshold(p, posterior_threshold, posterior_alpha):
                    break
                length, likelihood = length + 1, likelihood + math.log(p[token])
            if best is None or (length, likelihood) > best[:2]:
                best = (length, likelihood, path)
        assert best is not None  # a tree from the kit has at least one leaf
        accepted = best[2][: best[0]]
        return list(accepted) + [argmax([float(x) for x in target(accepted)])]

    verifier.__qualname__ = f"medusa.typical_acceptance({posterior_threshold}, {posterior_alpha})"
    return verifier
