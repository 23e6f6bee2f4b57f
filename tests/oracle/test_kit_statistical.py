"""The conformance kit in statistical mode (``pytest -m statistical``): verifiers driven by a numpy Generator.

Each check runs a Pearson chi-square per case at alpha / (number of cases), so a lossless verifier fails a
whole check with probability at most ALPHA = 1e-6; the sample size per case is the kit's power analysis for
power 0.99 against any output law at total variation >= TV = 0.1 (docs/testing.md section 4.4).

Negative controls: each mutant is first run through the kit's exact mode, which measures its worst-case total
variation exactly (0.24 to 1.0 here); asserting that it is >= TV proves that the statistical check below has
power >= 0.99 against it, and the statistical check must then reject it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from spec_ref import SOLVERS
from spec_ref.testing import (
    VerifierReport,
    assert_chain_verifier,
    assert_token_verifier,
    assert_tree_verifier,
    check_chain_verifier,
    check_token_verifier,
    check_tree_verifier,
)
from tests.oracle.verifiers import (
    MUTANT_STEPS,
    chain_by_verify,
    chain_from_step,
    on_generator,
    tree_by_verify,
    tree_from_step,
)

pytestmark = pytest.mark.statistical
ALPHA = 1e-6
TV = 0.1
STATISTICAL: dict[str, Any] = {"mode": "statistical", "alpha": ALPHA, "tv": TV, "random_cases": 1}
TOKEN: dict[str, Any] = {"vocab_size": 4, "num_drafts": 2}
CHAIN: dict[str, Any] = {"vocab_size": 3, "draft_length": 2}
TREE: dict[str, Any] = {"vocab_size": 2, "num_paths": 2, "depth": 2}


def _stated_rates(report: VerifierReport) -> None:
    assert report.mode == "statistical" and report.alpha == ALPHA and report.tv == TV
    assert report.power >= 0.99
    assert all(c.samples is not None and c.p_value is not None for c in report.cases)


def test_spec_ref_verifiers_on_a_numpy_generator_pass_all_three_checks() -> None:
    # Solver.sample takes a numpy Generator directly: the production path of spec_ref.
    _stated_rates(assert_token_verifier(SOLVERS["specinfer"].sample, **TOKEN, **STATISTICAL))
    _stated_rates(assert_chain_verifier(on_generator(chain_by_verify("bv")), **CHAIN, **STATISTICAL))
    _stated_rates(assert_tree_verifier(on_generator(tree_by_verify("specinfer")), **TREE, **STATISTICAL))


CHECKS: dict[str, tuple[Callable[..., VerifierReport], Callable[[Any], Any], dict[str, Any]]] = {
    "token": (check_token_verifier, lambda step: step, {**TOKEN, "num_drafts": 1}),
    "chain": (check_chain_verifier, chain_from_step, CHAIN),
    "tree": (check_tree_verifier, tree_from_step, TREE),
}


@pytest.mark.parametrize("mutant", sorted(MUTANT_STEPS))
@pytest.mark.parametrize("shape", sorted(CHECKS))
def test_each_lossy_mutant_is_rejected_with_certified_power(shape: str, mutant: str) -> None:
    check, build, sizes = CHECKS[shape]
    verifier = build(MUTANT_STEPS[mutant])
    exact = check(verifier, **sizes, random_cases=1)
    assert exact.worst.total_variation >= TV, f"the mutant is within TV {TV} of lossless: no stated power ({exact})"
    report = check(on_generator(verifier), **sizes, **STATISTICAL)
    _stated_rates(report)
    assert not report.lossless, str(report)
    worst = report.worst
    assert worst.p_value is not None and (worst.p_value < ALPHA / len(report.cases) or worst.violation is not None)
