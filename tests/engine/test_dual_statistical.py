"""Dual drafting at T > 0 reproduces the target's autoregressive law; best-of-two sampled paths does not.

Setup of test_sampling_statistical (tiny Llama, V = 8, early-exit and retrieval drafts, T = 0.9, top-p 0.95):
the joint law of the first two tokens of ``DualDrafter(early-exit, retrieval)`` in ``merge`` (NSS on the
union tree) and ``route`` (NSS on the winner's tree) mode, per-head chain:2 and topk:2,2,4, against the
exact AR law. Pearson chi2 with pooled cells (tests/stats.py), alpha = 1e-6 per configuration, N = 4096.

Negative control (lossy by design, docs/algorithms.md section 8): verify the merged chain:1 tree twice with
independent uniforms and keep the run that accepted more (best of two sampled paths). Its first-token law
is exact: with C the root's children and S = p(C), ``P(y) = p(y)(2 - S)`` for y in C and ``p(y)(1 - S)``
otherwise; the test checks that N * chi2(mutant || target) clears the noncentrality for power 0.99 at
alpha 1e-6, that the chi2 test rejects the mutant's sample, and that the correct engine passes it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from spec_fast.drafts.dual import DualDrafter
from spec_fast.engine import SpeculativeDecoder
from spec_fast.strategies import parse_strategy
from tests.engine.test_sampling_statistical import (
    DRAFTER, N, PROMPT, RETRIEVAL, TARGET, _ar_law_two_tokens, _counts, _next_probs,
)
from tests.stats import chi2_gof, noncentrality, required_noncentrality

pytestmark = pytest.mark.statistical


@pytest.mark.parametrize("mode", ["merge", "route"])
@pytest.mark.parametrize("strategy", ["chain:2", "topk:2,2,4"])
def test_dual_first_two_tokens_follow_the_exact_autoregressive_law(mode: str, strategy: str) -> None:
    decoder = SpeculativeDecoder(TARGET, DualDrafter(DRAFTER, RETRIEVAL, mode), parse_strategy(strategy))
    counts = _counts(decoder, f"dual/{mode}/{strategy}", 2)
    result = chi2_gof(counts, _ar_law_two_tokens())
    assert not result.rejected, result


class _BestOfTwoDecoder(SpeculativeDecoder):
    """Mutant (test only): two independent NSS runs on the same tree, keep the one that accepted more."""

    def _verify_sampling(self, method: str, draft: Any, target_logits: Any, draft_probs: Any, sampling: Any,
                         offset: int) -> Any:
        one, _ = super()._verify_sampling(method, draft, target_logits, draft_probs, sampling, offset)
        two, end = super()._verify_sampling(method, draft, target_logits, draft_probs, sampling, offset + 10**6)
        pick_two = two.accepted_depth > one.accepted_depth
        fields = {}
        for name in ("accepted_slots", "accepted_depth", "next_token", "emitted", "accepted_node"):
            a, b = getattr(one, name), getattr(two, name)
            cond = pick_two.view(-1, *([1] * (a.dim() - 1)))
            fields[name] = torch.where(cond, b, a)
        return type(one)(**fields), end


def test_the_chi2_test_rejects_best_of_two_sampled_paths_on_a_merged_tree() -> None:
    strategy = parse_strategy("chain:1")
    recorded = SpeculativeDecoder(TARGET, DualDrafter(DRAFTER, RETRIEVAL, "merge"), strategy).generate(
        [PROMPT], max_new_tokens=2, record_trees=True).trees[0]
    children = {int(t) for t, v in zip(recorded.tokens[0, 1:], recorded.valid[0, 1:]) if bool(v)}
    target_first = _next_probs(TARGET, PROMPT)
    inside = np.array([y in children for y in range(len(target_first))])
    mass = float(target_first[inside].sum())
    mutant = np.where(inside, target_first * (2 - mass), target_first * (1 - mass))
    lam, df = noncentrality(N, mutant, target_first)
    assert lam >= required_noncentrality(df)
    counts = _counts(_BestOfTwoDecoder(TARGET, DualDrafter(DRAFTER, RETRIEVAL, "merge"), strategy), "best-of-two", 1)
    assert chi2_gof(counts, target_first).rejected
    correct = _counts(SpeculativeDecoder(TARGET, DualDrafter(DRAFTER, RETRIEVAL, "merge"), strategy), "best-of-two", 1)
    assert not chi2_gof(correct, target_first).rejected
