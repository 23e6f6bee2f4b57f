"""The conformance kit (spec_ref.testing) in exact mode: it certifies our verifiers and catches lossy ones.

Exact mode enumerates every random branch of the verifier (spec_ref.exact_law) and compares the output law
with the target law with ``==`` on Fractions, so these tests have no false-positive rate and no misses: each
mutant below is rejected on a named case with its exact total variation (docs/testing.md sections 4.1, 7).
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spec_ref import SOLVERS, exact_law, verify
from spec_ref import strategies as kit_strategies
from spec_ref.goodness_of_fit import power_at, required_noncentrality, samples_for_power
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
    naive_step,
    tree_by_verify,
    tree_from_step,
)

TREE = {"vocab_size": 3, "num_paths": 2, "depth": 2, "random_cases": 1}


@pytest.mark.parametrize("solver", sorted(SOLVERS))
def test_every_spec_ref_solver_passes_the_token_check_with_exact_laws(solver: str) -> None:
    report = assert_token_verifier(SOLVERS[solver].sample, vocab_size=3, num_drafts=2)
    assert report.mode == "exact" and report.arithmetic == "fraction"
    assert report.alpha == 0.0 and report.power == 1.0
    assert {c.name for c in report.cases} >= {"disjoint", "equal", "target_one_hot", "draft_one_hot", "ties", "tiny"}
    assert all(c.total_variation == 0.0 for c in report.cases)


def test_the_token_check_in_float_arithmetic_passes_within_its_tolerance() -> None:
    report = assert_token_verifier(SOLVERS["spectr"].sample, vocab_size=4, num_drafts=2, arithmetic="float")
    assert report.arithmetic == "float" and report.tv == 1e-12
    assert all(isinstance(c.target_probs, np.ndarray) and c.target_probs.dtype == np.float64 for c in report.cases)


@pytest.mark.parametrize("method", ["naive", "bv", "traversal", "tree_mc"])
def test_spec_ref_path_verifiers_pass_the_chain_check(method: str) -> None:
    assert_chain_verifier(chain_by_verify(method), vocab_size=3, draft_length=2)


def test_a_hand_written_naive_chain_passes_the_chain_check() -> None:
    assert_chain_verifier(chain_from_step(naive_step), vocab_size=3, draft_length=3, random_cases=1)


@pytest.mark.parametrize("method", ["naive_tree", "specinfer", "traversal", "bv"])
def test_spec_ref_tree_verifiers_pass_the_tree_check(method: str) -> None:
    assert_tree_verifier(tree_by_verify(method), **TREE)


def test_the_top_down_driver_with_a_hand_written_naive_step_passes_the_tree_check() -> None:
    assert_tree_verifier(tree_from_step(naive_step), **TREE)


@pytest.mark.parametrize("mutant", sorted(MUTANT_STEPS))
def test_the_three_checks_reject_each_lossy_mutant_and_report_the_worst_case(mutant: str) -> None:
    step = MUTANT_STEPS[mutant]
    reports = [
        check_token_verifier(step, vocab_size=4, num_drafts=1),
        check_chain_verifier(chain_from_step(step), vocab_size=3, draft_length=2),
        check_tree_verifier(tree_from_step(step), **TREE),
    ]
    for report in reports:
        assert not report.lossless
        worst = report.worst
        assert not worst.lossless and worst.total_variation == max(c.total_variation for c in report.cases)
        assert worst.total_variation >= 0.2  # measured 0.24 to 1.0: far above the statistical mode's tv
        assert worst.output_probability != worst.target_probability
        assert worst.p_value is None and worst.samples is None
    with pytest.raises(AssertionError, match=f"(?s)NOT lossless.*worst case '{reports[0].worst.name}'"):
        assert_token_verifier(step, vocab_size=4, num_drafts=1)


def test_the_tree_check_catches_a_verifier_reading_its_parents_target_row() -> None:
    # Context-dependent tables make the off-by-one row bug visible (docs/testing.md section 0, item 3).
    report = check_tree_verifier(tree_by_verify("specinfer", parents_row=True), **TREE)
    assert not report.lossless and report.worst.total_variation > 0.2


def test_the_report_is_frozen_and_its_text_names_the_case_inputs_and_rates() -> None:
    report = check_token_verifier(MUTANT_STEPS["wrong_ratio"], vocab_size=3, num_drafts=1)
    assert isinstance(report, VerifierReport)
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.lossless = True  # type: ignore[misc]
    text = str(report)
    for needle in ("NOT lossless", "exact mode", "target_probs =", "draft_probs  =", "drafts: 1 i.i.d. draws",
                   "total variation", "alpha 0, power 1"):
        assert needle in text, text
    # The worst case's inputs are the arrays the verifier saw: the disjoint-support case accepts everything.
    assert report.worst.name == "disjoint" and report.worst.total_variation == 1.0


def test_contract_violations_fail_the_case_with_a_message() -> None:
    out_of_range = check_token_verifier(lambda p, q, x, rng: len(p), vocab_size=3, num_drafts=1)
    assert not out_of_range.lossless and "outside [0, 3)" in (out_of_range.worst.violation or "")

    def not_a_prefix(p: Any, q: Any, x: tuple[int, ...], rng: Any) -> list[int]:
        return [rng.categorical(p[0]), 0]  # two tokens without checking that the first was drafted

    report = check_chain_verifier(not_a_prefix, vocab_size=2, draft_length=1)
    assert not report.lossless and "do not start with the accepted drafts" in (report.worst.violation or "")

    def not_a_path(tree: Any, target: Any, rng: Any) -> list[int]:
        return [rng.categorical(target(())), 0]

    report = check_tree_verifier(not_a_path, vocab_size=2, num_paths=1, depth=1, random_cases=0)
    assert not report.lossless and "not a root path" in (report.worst.violation or "")


def test_exact_mode_refuses_verifiers_it_cannot_enumerate_and_says_what_to_do() -> None:
    def numpy_generator_style(p: Any, q: Any, x: tuple[int, ...], rng: Any) -> int:
        return int(x[0]) if rng.random() * q[x[0]] < p[x[0]] else 0

    with pytest.raises(ValueError, match=r"rng.random is not part of the spec_ref RNG protocol.*mode='statistical'"):
        check_token_verifier(numpy_generator_style, vocab_size=3, num_drafts=1)

    def hidden_randomness(p: Any, q: Any, x: tuple[int, ...], rng: Any) -> int:
        return int(np.random.default_rng().integers(len(p)))

    with pytest.raises(ValueError, match="draws randomness outside rng"):
        check_token_verifier(hidden_randomness, vocab_size=3, num_drafts=1)

    def float_only(p: Any, q: Any, x: tuple[int, ...], rng: Any) -> int:
        return naive_step(np.exp(np.log(p)), q, x, rng)

    with pytest.raises(ValueError, match="arithmetic='float'"):
        check_token_verifier(float_only, vocab_size=3, num_drafts=1)
    with np.errstate(divide="ignore"):
        assert_token_verifier(float_only, vocab_size=3, num_drafts=1, arithmetic="float")


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("vocab_size", 0),
        ("vocab_size", 2.0),
        ("num_drafts", 0),
        ("num_drafts", True),
        ("mode", "monte_carlo"),
        ("arithmetic", "decimal"),
        ("alpha", 0.0),
        ("alpha", 1.5),
        ("power", 1.0),
        ("tv", 0.0),
        ("samples", 0),
        ("random_cases", -1),
        ("seed", -3),
        ("tolerance", -1e-9),
        ("max_paths", 0),
    ],
)
def test_bad_arguments_raise_value_error_naming_argument_and_value(argument: str, value: Any) -> None:
    options: dict[str, Any] = {"vocab_size": 3, "num_drafts": 1, argument: value}
    with pytest.raises(ValueError, match=f"{argument}.*{argument}={value!r}"):
        check_token_verifier(naive_step, **options)


def test_bad_shape_arguments_of_chain_and_tree_checks_and_a_non_callable_fn() -> None:
    with pytest.raises(ValueError, match="draft_length=0"):
        check_chain_verifier(chain_from_step(naive_step), vocab_size=3, draft_length=0)
    with pytest.raises(ValueError, match="num_paths=0"):
        check_tree_verifier(tree_from_step(naive_step), vocab_size=3, num_paths=0, depth=1)
    with pytest.raises(ValueError, match="depth=-1"):
        check_tree_verifier(tree_from_step(naive_step), vocab_size=3, num_paths=1, depth=-1)
    with pytest.raises(ValueError, match="fn must be callable"):
        check_token_verifier("naive", vocab_size=3, num_drafts=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"vocab_size=1000 and draft_length=2 give .* 1000000000 blocks"):
        check_chain_verifier(chain_from_step(naive_step), vocab_size=1000, draft_length=2, mode="statistical")
    with pytest.raises(ValueError, match=r"vocab_size=100 and depth=3"):
        check_tree_verifier(tree_from_step(naive_step), vocab_size=100, num_paths=1, depth=3)
    with pytest.raises(ValueError, match="max_paths=5 is too small"):
        check_token_verifier(naive_step, vocab_size=3, num_drafts=2, max_paths=5)


# ----- the public Hypothesis strategies ------------------------------------------------------------------
@settings(max_examples=30)
@given(kit_strategies.draft_tree(vocab_size=3, max_nodes=6), st.sampled_from(["specinfer", "naive_tree", "traversal"]))
def test_draft_tree_strategy_builds_trees_every_verifier_accepts(tree: Any, method: str) -> None:
    # Invariant B1 over every random branch: the block is a root path of the tree plus one supported token.
    target = [Fraction(1, 6), Fraction(1, 3), Fraction(1, 2)]
    law = exact_law(lambda rng: verify(tree, lambda prefix: target, method, rng).tokens)
    assert sum(law.values()) == 1
    for block in law:
        node = 0
        for token in block[:-1]:  # type: ignore[index]
            child = tree.child(node, token)
            assert child is not None, (block, tree)
            node = child
        assert len(block) <= tree.max_depth + 1 and target[block[-1]] > 0  # type: ignore[index, arg-type]


@settings(max_examples=40)
@given(kit_strategies.pair(max_size=4), st.integers(1, 2))
def test_pair_strategy_families_are_valid_laws_and_the_naive_step_is_lossless_on_them(pq: Any, k: int) -> None:
    p, q = pq
    assert sum(p) == 1 and sum(q) == 1 and min(p) >= 0 and min(q) >= 0
    law = exact_law(lambda rng: naive_step(p, q, tuple(rng.categorical(q) for _ in range(k)), rng))
    assert law == {y: w for y, w in enumerate(p) if w > 0}


@settings(max_examples=40)
@given(kit_strategies.probability_vector(max_size=16))
def test_float_probability_vectors_are_normalised_and_finite(p: Any) -> None:
    assert np.all(np.isfinite(p)) and np.all(p >= 0) and abs(p.sum() - 1) < 1e-12 and p.max() > 0


# ----- the power analysis behind statistical mode --------------------------------------------------------
@pytest.mark.parametrize(("df", "lam"), [(3, 59.5), (7, 68.5), (15, 80.8), (63, 121.8)])
def test_required_noncentrality_matches_the_table_of_the_test_plan(df: int, lam: float) -> None:
    # docs/testing.md section 4.4: lambda needed for power 0.99 at alpha = 1e-6.
    assert required_noncentrality(df, 1e-6, 0.99) == pytest.approx(lam, abs=0.1)


@pytest.mark.parametrize(("df", "tv"), [(3, 0.05), (7, 0.05), (26, 0.1), (63, 0.01)])
def test_samples_for_power_give_the_stated_power_and_no_more_samples_than_needed(df: int, tv: float) -> None:
    n = samples_for_power(df, tv, 1e-6, 0.99)
    assert power_at(n, df, tv, 1e-6) >= 0.99 > power_at(n - 1, df, tv, 1e-6)
    if (df, tv) == (7, 0.05):
        assert 6800 <= n <= 6900  # the test plan's "6.9 k samples at TV 0.05, df 7"
