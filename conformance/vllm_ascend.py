"""vllm-ascend's block verification as it was before its fix (``vllm-project/vllm-ascend`` issue 7807, PR 7808).

Written from the public contract of ``rejection_random_sample_block_verify_pytorch`` in
``vllm_ascend/sample/rejection_sampler.py`` before PR 7808 (issue 7807 reports it in vllm-ascend 0.17.0rc2,
git sha 11e058347; PR 7603 describes the same rule: "Block verify uses cumprod(target_probs / draft_probs) for
joint acceptance"), used when at least 3 tokens are speculated:

* ``pi_i = prod_{j <= i} min(1, target_j(x_j) / draft_j(x_j))`` and ``U_i = prod_{j <= i} u_j``, the running
  products of the ratios and of the per-position uniforms;
* position i is *legal* when ``draft_j(x_j) > 0`` and ``pi_i >= U_i``; the accepted length is one past the
  last legal position (0 if none), so a later position can be legal after an earlier one was not;
* the token after the accepted drafts is the bonus (full acceptance) or the *token-wise* recovered token of
  that position, ``argmax(max(target - draft, 0) / E)`` with E ~ Exp(1) (the same draw as without block
  verification; the fix samples the block residual instead);
* without draft probabilities (n-gram, suffix decoding) every draft probability is 1 and the recovered token
  is drawn from the target row without the drafted token; PR 7603 then disabled block verification for those
  proposers ("the fallback draft_token_probs=1.0 with cumprod is not equivalent to per-token verification").

The comparison of two products of uniforms cannot be enumerated by the kit's exact mode (it branches on one
uniform compared with a number), so this rule runs in statistical mode on a ``numpy.random.Generator``,
with vLLM's own primitives: float64 uniforms and an explicit Exp(1) race.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["block_verify_before_fix", "block_verify_before_fix_ngram"]


def _race(generator: np.random.Generator, weights: Any) -> int:
    """vLLM's recovered-token draw, literally: argmax of weights / E with E ~ Exp(1)."""
    return int(np.argmax(np.asarray(weights, dtype=np.float64) / generator.exponential(size=len(weights))))


def block_verify_before_fix(
    target_probs: Any, draft_probs: Any, draft_tokens: Sequence[int], generator: np.random.Generator
) -> list[int]:
    """The pre-fix vllm-ascend block verification (statistical mode: ``generator`` is a numpy Generator)."""
    return _before_fix(target_probs, np.asarray(draft_probs, dtype=np.float64), draft_tokens, generator, False)


def block_verify_before_fix_ngram(
    target_probs: Any, draft_probs: Any, draft_tokens: Sequence[int], generator: np.random.Generator
) -> list[int]:
    """The same rule with ``draft_probs=None`` (n-gram, suffix), before PR 7603 turned it off for them: every
    draft probability is 1, and the recovered token is the target row without the drafted token."""
    one_hot = np.zeros((len(draft_tokens), len(target_probs[0])))
    one_hot[np.arange(len(draft_tokens)), list(draft_tokens)] = 1.0
    return _before_fix(target_probs, one_hot, draft_tokens, generator, True)


def _before_fix(
    target_probs: Any, draft_probs: Any, draft_tokens: Sequence[int], generator: np.random.Generator, ngram: bool
) -> list[int]:
    length = len(draft_tokens)
    uniforms = generator.random(length)
    ratio_product, uniform_product, last_legal = 1.0, 1.0, -1
    for i, x in enumerate(draft_tokens):
        draft_prob = float(draft_probs[i][x])
        ratio_product *= min(float(target_probs[i][x]) / draft_prob, 1.0) if draft_prob > 0 else 0.0
        uniform_product *= float(uniforms[i])
        if draft_prob > 0 and ratio_product >= uniform_product:
            last_legal = i
    accepted = last_legal + 1
    committed = [int(t) for t in draft_tokens[:accepted]]
    if accepted == length:
        return committed + [_race(generator, target_probs[length])]  # the bonus, sampled from the target row
    row = np.asarray(target_probs[accepted], dtype=np.float64)
    if ngram:  # vLLM's n-gram recovery: the target row with the drafted token zeroed
        recovered = np.where(np.arange(len(row)) == draft_tokens[accepted], 0.0, row)
    else:
        recovered = np.maximum(row - draft_probs[accepted], 0.0)
    return committed + [_race(generator, recovered)]
