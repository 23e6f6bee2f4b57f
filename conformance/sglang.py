"""SGLang's EAGLE tree verification, written from its public code contract in the kit's tree signature.

``fn(tree: DraftTree, target_model, rng) -> committed tokens`` (spec_ref.testing).

Target-only tree sampling: ``sgl-project/sglang``, ``sgl-kernel/csrc/speculative/speculative_sampling.cuh``,
``TreeSpeculativeSamplingTargetOnly`` (Python entry ``tree_speculative_sampling_target_only``), read at commit
b227f63247cd. Thresholds come from ``--speculative-accept-threshold-single`` and
``--speculative-accept-threshold-acc`` (both default 1.0). At each accepted node, with one coin per node:

* the node's children are tried in sibling order; ``prob_acc`` accumulates their target probabilities, and
  a child is accepted when ``coin <= prob_acc / threshold_acc`` or ``target_prob(child) >= threshold_single``;
  the next level then uses the accepted child's own coin;
* a rejected child's target probability is copied into a scratch "draft" buffer, so the final token, drawn
  with a separate coin from ``relu(target - buffer)`` at the last accepted node, is the target law with the
  tried siblings removed (the plain target law at a leaf).

With both thresholds at 1 this is inverse-CDF sampling of the target over the siblings, then over the rest:
one target draw per visited node, lossless for any tree (docs/algorithms.md section 3.1). Below 1 it accepts
more than the target allows.

Greedy fallback: ``python/sglang/srt/speculative/eagle_utils.py``, ``eagle_sample``, before the HIP fixes of
PRs 37134 and 39253 (PR 31214 describes it): ``if sampling_info.is_all_greedy or _is_cpu or _is_npu or _is_hip
or _is_xpu: target_predict = argmax(logits)``, then greedy tree verification, so off CUDA a request sampled at
temperature T > 0 followed the argmax of its target. The kit's target law is that request's law at T.

Exact mode: comparisons ``coin <= t`` are written ``coin < t`` (same probability for a continuous coin); the
final draw is a categorical of the residual (the kernel's inverse CDF at its coin).
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any

from spec_ref import DraftTree

from conformance._common import argmax, categorical, without

__all__ = ["greedy_fallback", "target_only"]

TreeVerifier = Callable[[DraftTree, Callable[[tuple[int, ...]], Any], Any], list[int]]


def target_only(threshold_single: Fraction = Fraction(1), threshold_acc: Fraction = Fraction(1)) -> TreeVerifier:
    """SGLang's target-only tree sampler at the given accept thresholds."""

    def verifier(tree: DraftTree, target: Callable[[tuple[int, ...]], Any], rng: Any) -> list[int]:
        node, committed = 0, list[int]()
        coin = rng.uniform()  # uniform_samples[root]
        while True:
            p = list(target(tree.path_tokens(node)))
            tried: list[int] = []
            accepted = None
            prob_acc: Any = 0
            for token, child in tree.children[node].items():
                prob_acc += p[token]
                if coin < prob_acc / threshold_acc or p[token] >= threshold_single:
                    accepted = child
                    break
                tried.append(token)
            if accepted is None:  # no child accepted (or a leaf): the final coin samples relu(target - buffer)
                return committed + [categorical(rng, without(p, tried))]
            committed.append(tree.tokens[accepted])
            node = accepted
            coin = rng.uniform()  # uniform_samples[accepted node]

    verifier.__qualname__ = f"sglang.target_only(threshold_single={threshold_single}, threshold_acc={threshold_acc})"
    return verifier


def greedy_fallback(tree: DraftTree, target: Callable[[tuple[int, ...]], Any], rng: Any) -> list[int]:
    """Greedy tree verification of a sampled request: follow the child equal to the target argmax."""
    node, committed = 0, list[int]()
    while True:
        predict = argmax(list(target(tree.path_tokens(node))))
        committed.append(predict)
        child = tree.child(node, predict)
        if child is None:
            return committed
        node = child
