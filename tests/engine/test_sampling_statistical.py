"""The engine's production sampling path reproduces the target's autoregressive law.

For a tiny random Llama with V = 8 and its early-exit drafter, the joint law of the first two generated
tokens under every sampling strategy (trees of depth 2, so the first step drafts a full tree) must equal
the exact autoregressive law of G(target) computed by enumeration over the 64 token pairs (float64 from
the model's float32 logits). The same holds with a retrieval drafter (sparse laws with exact zeros). Pearson chi2 with cells pooled to expected count >= 20 (tests/stats.py),
alpha = 1e-6 per strategy, N = 4096 rows per strategy (one batched ``generate`` call).

Negative control: the same engine whose verifier is fed the wrong q (uniform instead of the law the drafts
were sampled from, a chain of one draft token). Its first-token law is computed exactly; the test checks
that N * chi2(mutant || expected) clears the noncentrality needed for power 0.99 at alpha 1e-6, and that the
same chi2 test rejects the mutant's sample.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from spec_fast.drafts.model import EarlyExitDrafter
from spec_fast.engine import SamplingParams, SpeculativeDecoder
from spec_fast.drafts.retrieval import RetrievalDrafter, SuffixIndex
from spec_fast.strategies import parse_strategy
from spec_ref.decoding import decoding_operator as reference_operator
from tests.engine.models import tiny_llama
from tests.stats import chi2_gof, config_seed, noncentrality, required_noncentrality

pytestmark = pytest.mark.statistical

VOCAB = 8
N = 4096
PROMPT = [1, 2, 3]
SAMPLING = {"temperature": 0.9, "top_k": 0, "top_p": 0.95}
TARGET = tiny_llama(vocab_size=VOCAB, layers=2, seed=3, hidden=16)
DRAFTER = EarlyExitDrafter(TARGET, 1)

STRATEGIES = [
    ("chain:2", "naive"),
    ("chain:2", "bv"),
    ("chain:2", "traversal"),
    ("iid:2x2", "naive_tree"),
    ("iid:2x2", "nss"),
    ("iid:2x2", "spectr"),
    ("iid:2x2", "specinfer"),
    ("iid:2x2", "khisti"),
    ("iid:3x2", "traversal"),
    ("delayed:2,1,1", "specinfer"),
    ("topk:2,2,4", "nss"),
    ("dynatree:1,2,6", "nss"),
]


def _g(logits: torch.Tensor) -> np.ndarray:
    return np.asarray(reference_operator(logits.double().numpy(), SAMPLING["temperature"], None, SAMPLING["top_p"]))


def _next_probs(model: Any, prefix: list[int]) -> np.ndarray:
    with torch.no_grad():
        return _g(model(torch.tensor([prefix])).logits[0, -1])


def _ar_law_two_tokens() -> np.ndarray:
    first = _next_probs(TARGET, PROMPT)
    law = np.zeros((VOCAB, VOCAB))
    for y in range(VOCAB):
        if first[y] > 0:
            law[y] = first[y] * _next_probs(TARGET, PROMPT + [y])
    return law.ravel()


def _counts(decoder: SpeculativeDecoder, name: str, tokens: int) -> np.ndarray:
    sampling = SamplingParams(seed=config_seed(name), **SAMPLING)  # type: ignore[arg-type]
    result = decoder.generate([PROMPT] * N, max_new_tokens=3, sampling=sampling)
    counts = np.zeros(VOCAB**tokens)
    for row in result.tokens:
        index = 0
        for t in row[:tokens]:
            index = index * VOCAB + t
        counts[index] += 1
    return counts


#: a retrieval draft (spec_fast.drafts.retrieval): sparse laws with exact zeros and point masses, far from the target
RETRIEVAL = RetrievalDrafter(SuffixIndex([[1, 2, 3, 4, 4, 5], [3, 0, 7], [2, 3, 4, 1, 6], [4, 4, 4]], VOCAB, 4), VOCAB, 4)
RETRIEVAL_STRATEGIES = [("chain:2", "naive"), ("iid:2x2", "specinfer"), ("topk:2,2,4", "nss"), ("chain:2", "traversal")]


@pytest.mark.parametrize("strategy,verifier,drafter", [(s, v, "early-exit") for s, v in STRATEGIES]
                         + [(s, v, "retrieval") for s, v in RETRIEVAL_STRATEGIES])
def test_first_two_tokens_follow_the_exact_autoregressive_law(strategy: str, verifier: str, drafter: str) -> None:
    decoder = SpeculativeDecoder(TARGET, DRAFTER if drafter == "early-exit" else RETRIEVAL,
                                 parse_strategy(strategy, verifier))
    counts = _counts(decoder, f"{strategy}/{verifier}" + ("" if drafter == "early-exit" else "/retrieval"), 2)
    result = chi2_gof(counts, _ar_law_two_tokens())
    assert not result.rejected, result


class _WrongQDecoder(SpeculativeDecoder):
    """Mutant (test only): the verifier sees a uniform q instead of the law the drafts came from."""

    def _verify_sampling(self, method: str, draft: Any, target_logits: Any, draft_probs: Any, sampling: Any,
                         offset: int) -> Any:
        wrong = torch.full_like(draft_probs, 1.0 / draft_probs.shape[-1])
        return super()._verify_sampling(method, draft, target_logits, wrong, sampling, offset)


def test_the_chi2_test_rejects_a_verifier_fed_the_wrong_draft_distribution() -> None:
    target_first = _next_probs(TARGET, PROMPT)
    draft_first = _next_probs(DRAFTER.model, PROMPT)
    wrong = np.full(VOCAB, 1.0 / VOCAB)
    # exact first-token law of naive verification (docs/algorithms.md section 3.2) with x ~ draft_first but tested against `wrong`
    accept = np.minimum(1.0, target_first / wrong)
    residual = np.maximum(target_first - wrong, 0.0)
    residual = residual / residual.sum()
    mutant = draft_first * accept + float((draft_first * (1 - accept)).sum()) * residual
    lam, df = noncentrality(N, mutant, target_first)
    assert lam >= required_noncentrality(df)
    counts = _counts(_WrongQDecoder(TARGET, DRAFTER, parse_strategy("chain:1", "naive")), "mutant", 1)
    assert chi2_gof(counts, target_first).rejected
    # the correct engine on the same chain passes the same test
    correct = _counts(SpeculativeDecoder(TARGET, DRAFTER, parse_strategy("chain:1", "naive")), "mutant", 1)
    assert not chi2_gof(correct, target_first).rejected
