"""Monte Carlo check of delayed-tree drafting on the production ``numpy.random.Generator`` path.

The exact law (``exact_law``, tests/ref/test_drafting.py) proves the algorithm; this test checks that the
Generator path draws from that law. Pearson chi-square over tree shapes, cells pooled to expected >= 20,
alpha = 1e-6 per assertion, power 0.99 against the negative control (docs/testing.md section 4.4): a mutant that
drafts each branch token from its *parent's* row (the off-by-one row bug of docs/testing.md section 7). The test
asserts that the mutant is rejected and that N * chi2(mutant || expected) >= the noncentrality needed.
"""

from __future__ import annotations

from collections import Counter
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from spec_ref import draft_delayed_tree, exact_law
from spec_ref.drafting import tree_signature
from tests.stats import ALPHA, POWER, chi2_gof, config_seed, noncentrality, required_noncentrality

F = Fraction
N = 2**12  # the negative control needs ~153 here and has ~2800 (asserted below)
K, L1, L2 = 2, 1, 2


def q_table(prefix: tuple[int, ...]) -> list[Fraction]:
    tables = [[F(1, 2), F(1, 3), F(1, 6)], [F(1, 5), F(3, 5), F(1, 5)], [F(1, 4), F(1, 4), F(1, 2)]]
    return tables[(len(prefix) + sum(prefix)) % 3]


def parent_row_mutant(prefix: tuple[int, ...]) -> list[Fraction]:
    return q_table(prefix[:-1] if len(prefix) > L1 else prefix)


def law_vector(law: dict[Any, Fraction], cells: list[Any]) -> np.ndarray:
    return np.array([float(law.get(c, 0)) for c in cells])


def sample_counts(model: Any, seed: int) -> Counter[Any]:
    """N trees drafted with float64 probabilities (the production mode) on one seeded Generator."""

    def float_model(prefix: tuple[int, ...]) -> list[float]:
        return [float(x) for x in model(prefix)]

    gen = np.random.default_rng(seed)
    return Counter(tree_signature(draft_delayed_tree(float_model, K, L1, L2, gen)) for _ in range(N))


@pytest.mark.statistical
def test_delayed_tree_generator_path_matches_the_exact_law_and_rejects_the_parent_row_mutant() -> None:
    expected_law = exact_law(lambda rng: tree_signature(draft_delayed_tree(q_table, K, L1, L2, rng)))
    mutant_law = exact_law(lambda rng: tree_signature(draft_delayed_tree(parent_row_mutant, K, L1, L2, rng)))
    cells = sorted(set(expected_law) | set(mutant_law))
    expected = law_vector(expected_law, cells)
    mutant = law_vector(mutant_law, cells)
    lam, df = noncentrality(N, mutant, expected)
    assert lam >= required_noncentrality(df, ALPHA, POWER)  # the negative control has teeth at this N

    seed = config_seed("delayed_tree_generator_path")
    counts = sample_counts(q_table, seed)
    assert not chi2_gof([counts[c] for c in cells], expected, ALPHA).rejected
    mutant_counts = sample_counts(parent_row_mutant, seed + 1)
    assert chi2_gof([mutant_counts[c] for c in cells], expected, ALPHA).rejected
