"""vLLM's acceptance rules, written from their public code contracts (not copied) in the kit's chain signature.

``fn(target_probs [L+1, V], draft_probs [L, V], draft_tokens, rng) -> committed tokens`` (spec_ref.testing).

Rejection sampler: ``vllm-project/vllm``, ``vllm/v1/sample/rejection_sampler.py``, read at commit 0097a7bbf1d9
(``rejection_random_sample_kernel``, ``sample_recovered_tokens_kernel``, ``rejection_greedy_sample_kernel``):

* one uniform per draft position (``generate_uniform_probs``); position i accepts its draft x iff
  ``draft_prob > 0 and target_prob / draft_prob >= uniform``; the first rejected position emits its
  *recovered* token and the rest are dropped; if none is rejected the bonus token (sampled by the main sampler
  from the target row L) follows;
* recovered token: ``argmax(prob / E)`` with E ~ Exp(1) and ``prob = max(target - draft, 0)``; without draft
  probabilities (n-gram and other draft-free proposers) the draft is taken as certain (``draft_prob = 1``) and
  ``prob`` is the target row with the drafted token zeroed;
* greedy requests: accept while the draft equals the target argmax, emit the argmax at the first mismatch, and
  the greedy bonus token after a full match.

Block verification: ``vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py`` (Model Runner V2, PR
46781), read at commit 02e318bde2cc (``_compute_cumulative_log_p_kernel``, ``_rejection_kernel``,
``_resample_kernel``): prefix weights ``p_i = min(1, p_{i-1} * target/draft)``, one uniform per position,
position i (0-based) is a candidate end when ``u_i <= h_i`` with ``h_i = Z / (Z + 1 - p_{i+1})`` for
i < L - 1 (``Z = sum_x max(p_{i+1} * target_{i+1}(x) - draft_{i+1}(x), 0)``, 1 when the denominator is 0) and
``h_{L-1} = p_L``; the accepted length is the last candidate end; the token after it is the bonus (full
acceptance) or a Gumbel-max draw from ``max(p_tau * target_tau - draft_tau, 0)``. Without draft logits the
draft is one-hot at the drafted token.

Exact mode: the enumerator integrates over continuous uniforms, where ``u <= t`` and ``u < t`` have the same
probability, so the comparisons are written ``u < t``. The Exp(1) race and the Gumbel-max draws are replaced by
their laws (Cat of the weights, :func:`conformance._common.exponential_race`). vLLM draws every uniform up
front; drawing them lazily gives the same law (unused uniforms never influence the output).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from conformance._common import argmax, categorical, exponential_race, one_hot_rows, positive_part, without

ChainVerifier = Callable[[Any, Any, Sequence[int], Any], list[int]]

__all__ = [
    "ChainVerifier",
    "block_verification",
    "block_verification_one_hot",
    "greedy",
    "greedy_on_sampled_argmax",
    "on_sampled_argmax",
    "rejection_sampler",
    "rejection_sampler_without_draft_probs",
]


def _rejection(target_probs: Any, draft_probs: Any, draft_tokens: Sequence[int], rng: Any, *, certain: bool) -> list[int]:
    committed: list[int] = []
    for i, x in enumerate(draft_tokens):
        p = list(target_probs[i])
        draft_prob = 1 if certain else draft_probs[i][x]
        uniform = rng.uniform()
        if draft_prob > 0 and uniform < p[x] / draft_prob:  # vLLM: target_prob / draft_prob >= uniform_prob
            committed.append(int(x))
            continue
        recovered = without(p, [x]) if certain else positive_part(p, list(draft_probs[i]))
        committed.append(exponential_race(rng, recovered))
        return committed
    committed.append(categorical(rng, list(target_probs[len(draft_tokens)])))  # the bonus token
    return committed


def rejection_sampler(target_probs: Any, draft_probs: Any, draft_tokens: Sequence[int], rng: Any) -> list[int]:
    """vLLM's rejection sampler for a draft with probabilities (draft models, EAGLE with draft probs)."""
    return _rejection(target_probs, draft_probs, draft_tokens, rng, certain=False)


def rejection_sampler_without_draft_probs(
    target_probs: Any, draft_probs: Any, draft_tokens: Sequence[int], rng: Any
) -> list[int]:
    """vLLM's rejection sampler called with ``draft_probs=None`` (n-gram): the draft is treated as certain.

    ``draft_probs`` (the law the kit drew the drafts from) is not passed on: the engine never sees it.
    """
    return _rejection(target_probs, None, draft_tokens, rng, certain=True)


def greedy(target_logits: Sequence[Sequence[Any]], draft_tokens: Sequence[int]) -> list[int]:
    """vLLM's greedy path: the draft is accepted while it equals the target argmax of its row."""
    committed: list[int] = []
    for i, x in enumerate(draft_tokens):
        target_argmax = argmax(target_logits[i])
        committed.append(target_argmax)
        if x != target_argmax:
            return committed
    committed.append(argmax(target_logits[len(draft_tokens)]))  # the greedy bonus token
    return committed


def on_sampled_argmax(greedy_rule: Callable[[Sequence[Sequence[Any]], Sequence[int]], list[int]]) -> ChainVerifier:
    """A greedy rule ``greedy_rule(target_logits, draft_tokens)`` checked through the Gumbel-max reduction.

    A greedy request's law is the point mass at the argmax of its logits. Perturbing each row's logits
    ``log p_i`` by i.i.d. Gumbel noise makes that argmax a draw from ``p_i``, so a correct greedy rule,
    which must commit exactly the argmax path, then has output law ``prod p_i``: the kit's target law. The
    argmax of each perturbed row is drawn here (exactly: one categorical per row) and handed to the rule as
    the one-hot logits row it would see; any greedy rule that commits something other than the argmax path
    (a draft at a mismatch, the wrong row) changes the law and is rejected.
    """

    def verifier(target_probs: Any, draft_probs: Any, draft_tokens: Sequence[int], rng: Any) -> list[int]:
        rows = [categorical(rng, list(row)) for row in target_probs]
        return greedy_rule(one_hot_rows(rows, len(target_probs[0])), draft_tokens)

    verifier.__qualname__ = f"on_sampled_argmax({greedy_rule.__name__})"
    return verifier


greedy_on_sampled_argmax = on_sampled_argmax(greedy)


def _block(target_probs: Any, draft_rows: Sequence[Sequence[Any]], draft_tokens: Sequence[int], rng: Any) -> list[int]:
    length = len(draft_tokens)
    weights: list[Any] = [1]  # p_0 = 1, then the prefix joint ratios p_1..p_L
    for i, x in enumerate(draft_tokens):
        weights.append(min(weights[-1] * target_probs[i][x] / draft_rows[i][x], 1))
    accepted = 0
    for i in range(length):
        uniform = rng.uniform()
        if i < length - 1:
            mass = sum(positive_part(list(target_probs[i + 1]), list(draft_rows[i + 1]), weights[i + 1]))
            denominator = mass + 1 - weights[i + 1]
            h = mass / denominator if denominator > 0 else 1
        else:
            h = weights[length]
        if uniform < h:  # vLLM: accepted_length = where(u <= h, i + 1, accepted_length)
            accepted = i + 1
    committed = [int(t) for t in draft_tokens[:accepted]]
    if accepted == length:
        return committed + [categorical(rng, list(target_probs[length]))]
    residual = positive_part(list(target_probs[accepted]), list(draft_rows[accepted]), weights[accepted])
    if not sum(residual) > 0:  # probability 0: the rejection needs a positive residual mass
        residual = list(target_probs[accepted])
    return committed + [categorical(rng, residual)]


def block_verification(target_probs: Any, draft_probs: Any, draft_tokens: Sequence[int], rng: Any) -> list[int]:
    """vLLM's block verification (Model Runner V2) with draft logits."""
    return _block(target_probs, [list(row) for row in draft_probs], draft_tokens, rng)


def block_verification_one_hot(target_probs: Any, draft_probs: Any, draft_tokens: Sequence[int], rng: Any) -> list[int]:
    """vLLM's block verification without draft logits: the draft law is one-hot at each drafted token."""
    return _block(target_probs, one_hot_rows(draft_tokens, len(target_probs[0])), draft_tokens, rng)
