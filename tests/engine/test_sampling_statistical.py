"""The engine's production sampling path reproduces the target's autoregressive law.

Design (tests/engine/statistical_setup.py, docs/testing.md section 4.4): a tiny random Llama with V = 4 and
its early-exit drafter (and a retrieval drafter: sparse laws with exact zeros); the joint law of the first
two generated tokens (16 cells, the first step drafts a tree of depth 2) under every sampling strategy, one
batched ``generate`` call per configuration, against the exact autoregressive law of G(target). Pearson
chi-square with cells pooled to expected count >= 20 (tests/stats.py) at ``ALPHA_CONFIG = 1e-4 / 26`` per
configuration (Bonferroni over the 26 configurations of this file and test_dual_statistical.py), with the
rows of the configuration's tier: power >= 0.99 at TV 0.02 for the chains, a larger detectable TV (printed)
for the slower paths.

Negative controls, one per configuration, each run with the same rows and seed and rejected by the same
test: the verifier fed a uniform q (verifiers that read q) or every node verified with its parent's target
row (NSS, which reads no q). A second control computes the wrong-q mutant's exact first-token law on a
chain of one token and checks that N * chi2(mutant || expected) clears the noncentrality needed for power
0.99 (the pattern of docs/testing.md section 4.4).
"""

from __future__ import annotations

import numpy as np
import pytest

from spec_fast.engine import SpeculativeDecoder
from spec_fast.strategies import parse_strategy
from tests.engine.statistical_setup import (
    check_control_rejected, check_law,
    ALPHA_CONFIG, ALPHA_FAMILY, CELLS, DRAFTER, FULL_POWER_ROWS, NUM_CONFIGS, PROMPT, ROWS, SINGLE_CONFIGS,
    TARGET, TARGET_TV, VOCAB, EngineConfig, MutantDecoder, ar_law, detectable_tv, next_probs,
    power_at_target, sample_counts,
)
from tests.stats import POWER, chi2_gof, noncentrality, required_noncentrality

pytestmark = pytest.mark.statistical

IDS = [c.name for c in SINGLE_CONFIGS]


def test_the_design_reaches_power_099_at_tv_002_where_promised() -> None:
    # the numbers docs/testing.md section 4.4 states: 30 configurations, alpha 1e-4 / 30, N = 47 917
    assert NUM_CONFIGS == 30 and ALPHA_FAMILY == 1e-4 and FULL_POWER_ROWS == 47917
    assert ROWS == {"full": 47917, "tree": 12288, "small": 4096}
    assert power_at_target(FULL_POWER_ROWS) >= POWER
    assert power_at_target(FULL_POWER_ROWS - 1000) < POWER  # the smallest such N, not a generous guess
    for tier, rows in ROWS.items():
        print(f"tier {tier}: {rows} rows, alpha {ALPHA_CONFIG:.2e}, power at TV {TARGET_TV} = "
              f"{power_at_target(rows):.3f}, TV detected with power {POWER} = {detectable_tv(rows):.4f}")
    assert all(c.tier == "full" for c in SINGLE_CONFIGS if c.strategy.startswith("chain") and c.drafter == "early-exit")


@pytest.mark.parametrize("config", SINGLE_CONFIGS, ids=IDS)
def test_first_two_tokens_follow_the_exact_autoregressive_law(config: EngineConfig) -> None:
    check_law(config)


@pytest.mark.parametrize("config", SINGLE_CONFIGS, ids=IDS)
def test_the_same_test_rejects_this_configurations_lossy_mutant(config: EngineConfig) -> None:
    check_control_rejected(config)


def test_the_wrong_q_mutant_has_the_noncentrality_for_power_099_on_a_chain_of_one() -> None:
    rows = ROWS["small"]
    target_first = next_probs(TARGET, PROMPT)
    draft_first = next_probs(DRAFTER.model, PROMPT)
    wrong = np.full(VOCAB, 1.0 / VOCAB)
    # exact first-token law of naive verification (docs/algorithms.md section 3.2) with x ~ draft_first,
    # accepted against the uniform `wrong`
    accept = np.minimum(1.0, target_first / wrong)
    residual = np.maximum(target_first - wrong, 0.0)
    residual = residual / residual.sum()
    mutant = draft_first * accept + float((draft_first * (1 - accept)).sum()) * residual
    lam, df = noncentrality(rows, mutant, target_first)
    assert lam >= required_noncentrality(df, ALPHA_CONFIG)
    strategy = parse_strategy("chain:1", "naive")
    counts = sample_counts(MutantDecoder(TARGET, DRAFTER, strategy, "wrong-q"), "mutant", rows, tokens=1)
    assert chi2_gof(counts, target_first, ALPHA_CONFIG).rejected
    correct = sample_counts(SpeculativeDecoder(TARGET, DRAFTER, strategy), "mutant", rows, tokens=1)
    assert not chi2_gof(correct, target_first, ALPHA_CONFIG).rejected


def test_the_expected_law_is_a_proper_law_over_the_cells() -> None:
    law = ar_law()
    assert law.shape == (CELLS,) and abs(law.sum() - 1.0) < 1e-12 and (law >= 0).all()
