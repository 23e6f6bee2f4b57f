"""Dual drafting at T > 0 reproduces the target's autoregressive law; best-of-two sampled paths does not.

Design of test_sampling_statistical (tests/engine/statistical_setup.py: tiny Llama, V = 4, early-exit and
retrieval drafts, T = 0.9, top-p 0.95, first two tokens, 16 cells): ``DualDrafter(early-exit, retrieval)``
in ``merge`` (NSS on the union tree), ``route`` and ``route-calibrated`` (NSS on the winner's tree; the
calibrated route's second step, taken by rows that emitted one token, routes on a calibration learned from
the first) mode, per-head chain:2 and topk:2,2,4, against the exact AR law, at ``ALPHA_CONFIG`` per configuration (Bonferroni share of
``ALPHA_FAMILY = 1e-4``) and the ``small`` tier's rows (detectable TV printed; docs/testing.md section 4.4).

Negative controls (lossy by design, docs/algorithms.md section 8): every configuration verified twice with
independent uniforms, keeping the run that accepted more (best of two sampled paths), at the same rows and
seed; the same test must reject it. On the merged chain:1 tree the mutant's first-token law is exact: with
C the root's children and S = p(C), ``P(y) = p(y)(2 - S)`` for y in C and ``p(y)(1 - S)`` otherwise; that
test also checks that N * chi2(mutant || target) clears the noncentrality for power 0.99.
"""

from __future__ import annotations

import numpy as np
import pytest

from spec_fast.drafts.dual import DualDrafter
from spec_fast.engine import SpeculativeDecoder
from spec_fast.strategies import parse_strategy
from tests.engine.statistical_setup import (
    check_control_rejected, check_law,
    ALPHA_CONFIG, DRAFTER, DUAL_CONFIGS, PROMPT, RETRIEVAL, ROWS, TARGET, EngineConfig, MutantDecoder,
    next_probs, sample_counts,
)
from tests.stats import chi2_gof, noncentrality, required_noncentrality

pytestmark = pytest.mark.statistical

IDS = [c.name for c in DUAL_CONFIGS]


@pytest.mark.parametrize("config", DUAL_CONFIGS, ids=IDS)
def test_dual_first_two_tokens_follow_the_exact_autoregressive_law(config: EngineConfig) -> None:
    check_law(config)


@pytest.mark.parametrize("config", DUAL_CONFIGS, ids=IDS)
def test_the_same_test_rejects_best_of_two_sampled_paths(config: EngineConfig) -> None:
    check_control_rejected(config)


def test_best_of_two_on_a_merged_chain_of_one_has_the_noncentrality_for_power_099() -> None:
    rows = ROWS["small"]
    strategy = parse_strategy("chain:1")
    recorded = SpeculativeDecoder(TARGET, DualDrafter(DRAFTER, RETRIEVAL, "merge"), strategy).generate(
        [PROMPT], max_new_tokens=2, record_trees=True).trees[0]
    children = {int(t) for t, v in zip(recorded.tokens[0, 1:], recorded.valid[0, 1:]) if bool(v)}
    target_first = next_probs(TARGET, PROMPT)
    inside = np.array([y in children for y in range(len(target_first))])
    mass = float(target_first[inside].sum())
    mutant = np.where(inside, target_first * (2 - mass), target_first * (1 - mass))
    lam, df = noncentrality(rows, mutant, target_first)
    assert lam >= required_noncentrality(df, ALPHA_CONFIG)
    merged = DualDrafter(DRAFTER, RETRIEVAL, "merge")
    counts = sample_counts(MutantDecoder(TARGET, merged, strategy, "best-of-two"), "best-of-two", rows, tokens=1)
    assert chi2_gof(counts, target_first, ALPHA_CONFIG).rejected
    correct = sample_counts(SpeculativeDecoder(TARGET, merged, strategy), "best-of-two", rows, tokens=1)
    assert not chi2_gof(correct, target_first, ALPHA_CONFIG).rejected
