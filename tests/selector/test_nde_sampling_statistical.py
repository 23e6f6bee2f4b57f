"""NDE decoding keeps the target's autoregressive law while the tree shape changes from step to step.

A tiny random Llama with V = 8 (defined here; the engine's own tests use V = 4), its
early-exit drafter, N = 4096 rows in one batched ``generate`` call; the joint law of the first two
generated tokens must equal the exact autoregressive law of G(target) (enumeration over the 64 pairs).
Pearson chi2 with cells pooled to expected count >= 20 (tests/stats.py), alpha = 1e-6 per verifier.

The selector is crafted so that the shape changes across steps and depends on the batch's state: the
action follows the context length (``CYCLE[|x| mod 5]``, the batch takes the majority's action), so step 1
drafts a (2, 1, 1) delayed tree and step 2, after rows accepted different numbers of tokens, a chain, a
plain step or a delayed tree. The shape is a function of the committed contexts only, fixed before any
draw of the step, which is why the law is unchanged.

Negative control: a mutant that chooses after drafting -- rows whose first draft token is ``t*`` drop their
tree and take a plain step -- is biased. Its first-token law is computed exactly (one-token chains, naive
= SpecInfer with K = 1); the test checks that N * chi2(mutant || expected) clears the noncentrality for
power 0.99 at alpha 1e-6, and that the same chi2 test rejects the mutant's sample.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from spec_fast.drafts.batch import DraftBatch
from spec_fast.engine import DecodeState, SamplingParams, SpeculativeDecoder
from spec_fast.flat_tree import FlatTree
from spec_fast.drafts.model import EarlyExitDrafter
from spec_fast.strategies import parse_strategy
from spec_ref.decoding import decoding_operator as reference_operator
from tests.engine.models import tiny_llama
from tests.selector.test_nde_engine import cycling_selector
from tests.stats import chi2_gof, config_seed, noncentrality, required_noncentrality

pytestmark = pytest.mark.statistical

HIDDEN = 16
VOCAB = 8
N = 4096
#: three tokens, so the crafted selector's first action is CYCLE[3] (see the negative control)
PROMPT = [1, 2, 3]
SAMPLING = {"temperature": 0.9, "top_k": 0, "top_p": 0.95}
TARGET = tiny_llama(vocab_size=VOCAB, layers=2, seed=3, hidden=HIDDEN)
DRAFTER = EarlyExitDrafter(TARGET, 1)


def _next_probs(model: Any, prefix: list[int]) -> np.ndarray:
    """G(model's logits) after ``prefix`` in float64, ``[V]``."""
    with torch.no_grad():
        logits = model(torch.tensor([prefix])).logits[0, -1].double().numpy()
    return np.asarray(reference_operator(logits, SAMPLING["temperature"], None, SAMPLING["top_p"]))


def _ar_law_two_tokens() -> np.ndarray:
    """Exact law of the first two tokens of G(target) after PROMPT, ``[V * V]`` (index y1 * V + y2)."""
    first = _next_probs(TARGET, PROMPT)
    law = np.zeros((VOCAB, VOCAB))
    for y in range(VOCAB):
        if first[y] > 0:
            law[y] = first[y] * _next_probs(TARGET, PROMPT + [y])
    return law.ravel()


def _counts(decoder: SpeculativeDecoder, name: str, tokens: int, new_tokens: int = 3) -> tuple[np.ndarray, Any]:
    sampling = SamplingParams(seed=config_seed(name), **SAMPLING)  # type: ignore[arg-type]
    result = decoder.generate([PROMPT] * N, max_new_tokens=new_tokens, sampling=sampling)
    counts = np.zeros(VOCAB**tokens)
    for row in result.tokens:
        index = 0
        for t in row[:tokens]:
            index = index * VOCAB + t
        counts[index] += 1
    return counts, result.metrics


@pytest.mark.parametrize("verifier", ["specinfer", "spectr", "khisti", "naive_tree", "nss"])
def test_first_two_tokens_follow_the_autoregressive_law_while_nde_changes_shape(verifier: str) -> None:
    decoder = SpeculativeDecoder(TARGET, DRAFTER, parse_strategy(f"nde:{verifier}"), selector=cycling_selector(HIDDEN))
    counts, metrics = _counts(decoder, f"nde/{verifier}", 2)
    assert len(metrics.nde_actions) >= 2  # the shape changed between steps
    result = chi2_gof(counts, _ar_law_two_tokens())
    assert not result.rejected, result


#: the token whose draws make the mutant drop its tree: the draft's most likely first token
T_STAR = int(np.argmax(_next_probs(DRAFTER.model, PROMPT)))


class _PeekingNdeDecoder(SpeculativeDecoder):
    """Mutant (test only): the shape is chosen after drafting -- rows whose first draft token is T_STAR
    drop every drafted node (their step becomes a plain draw from p at the root)."""

    def _draft_phase(self, st: DecodeState, depth_cap: int) -> tuple[DraftBatch, Any]:
        draft, dual = super()._draft_phase(st, depth_cap)
        tree = draft.tree
        if tree.num_slots == 1:
            return draft, dual
        drop = (tree.tokens[:, 1] == T_STAR).unsqueeze(1)  # [B, 1]
        keep_node = torch.ones_like(tree.valid)
        keep_node[:, 1:] = ~drop
        valid = tree.valid & keep_node
        draws = torch.where(drop.unsqueeze(2), torch.full_like(tree.draws, -1), tree.draws)
        mutated = FlatTree(tree.tokens, tree.parents, tree.depths, draws, valid, tree.process)
        return DraftBatch(mutated, draft.draft_probs, draft.confidences, draft.entries, draft.tokens_in,
                          draft.pending_width, draft.max_depth), dual


def test_the_chi2_test_rejects_an_nde_that_chooses_after_drafting() -> None:
    p = _next_probs(TARGET, PROMPT)
    q = _next_probs(DRAFTER.model, PROMPT)  # the draft law at T > 0 is G(draft logits)
    accept = np.minimum(1.0, np.divide(p, q, out=np.ones_like(p), where=q > 0))
    residual = np.maximum(p - q, 0.0)
    residual = residual / residual.sum()
    # one-token chain (K = 1): out = x w.p. min(1, p/q)(x), else a residual draw; x = T_STAR -> a draw from p
    mutant = np.zeros(VOCAB)
    for x in range(VOCAB):
        if x == T_STAR:
            mutant += q[x] * p
        else:
            mutant[x] += q[x] * accept[x]
            mutant += q[x] * (1 - accept[x]) * residual
    lam, df = noncentrality(N, mutant, p)
    assert lam >= required_noncentrality(df)
    chain = cycling_selector(HIDDEN)
    # |x| = 3 picks CYCLE[3] = (2, 1, 2); one new token caps the tree at depth 1 with K = 1 on the trunk
    counts, _ = _counts(_PeekingNdeDecoder(TARGET, DRAFTER, parse_strategy("nde"), selector=chain), "nde-mutant", 1, 2)
    assert chi2_gof(counts, p).rejected
    correct, _ = _counts(SpeculativeDecoder(TARGET, DRAFTER, parse_strategy("nde"), selector=chain), "nde-mutant", 1, 2)
    assert not chi2_gof(correct, p).rejected
