"""Expected block efficiency (seed 002 (docs/papers.md) eq. 1-3; docs/algorithms.md section 4, 5.1, 5.2), checked exactly.

* eq. 3 (sum over nodes of products of branching probabilities, root included) equals E[tau + 1 | tree]
  obtained by enumerating every random branch of the real verifier, for every OT method;
* the naive and BV closed forms equal the enumerated values (tree_mc shares BV's);
* the s-sample estimator over random delayed trees is unbiased: its exact expectation over the drafts
  equals E[tau + 1] of drafting followed by verification, both by exact enumeration.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spec_ref import (
    DraftTree,
    accepted_depth_law,
    estimate_block_efficiency,
    exact_block_efficiency,
    exact_law,
    expected_block_efficiency,
    draft_delayed_tree,
    verify,
)
from spec_ref.rng import RandomSource
from tests.ref.test_verify_exact import delayed_tree, model, random_table

F = Fraction
OT_VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("naive_tree", {}),
    ("nss", {}),
    ("spectr", {}),
    ("specinfer", {}),
    ("specinfer", {"specinfer_order": "draw"}),
    ("khisti", {}),
]
TREES = [
    [(0, 1), (2, 0)],
    [(1, 1), (1, 2), (0, 0)],
    [(2, 2), (2, 2)],
    [(0, 1, 2)],
    [(1, 0, 1), (1, 0, 0)],
]


@pytest.mark.parametrize("paths", TREES, ids=str)
@pytest.mark.parametrize(("method", "options"), OT_VARIANTS, ids=lambda v: str(v) if isinstance(v, str) else "-".join(v.values()))
def test_eq3_equals_the_exact_expected_block_length_for_ot_methods(
    paths: list[tuple[int, ...]], method: str, options: dict[str, Any]
) -> None:
    target, draft = random_table(7, 4), random_table(8, 3, zeros=False)
    tree = DraftTree.from_paths(paths, model(draft))
    eq3 = expected_block_efficiency(tree, model(target), method, **options)
    assert isinstance(eq3, Fraction)
    assert eq3 == exact_block_efficiency(tree, model(target), method, **options)


@settings(max_examples=min(settings.default.max_examples, 40))
@given(seed=st.integers(0, 2**32 - 1), paths=st.sampled_from(TREES))
def test_naive_and_bv_closed_forms_equal_the_enumerated_expected_block_length(
    seed: int, paths: list[tuple[int, ...]]
) -> None:
    target, draft = random_table(seed, 4), random_table(seed + 1, 3, zeros=False)
    tree = DraftTree.from_paths(paths, model(draft))
    for method in ("naive", "bv", "tree_mc"):
        assert expected_block_efficiency(tree, model(target), method) == exact_block_efficiency(
            tree, model(target), method
        ), method


def test_traversal_and_greedy_efficiencies_are_the_enumerated_and_deterministic_values() -> None:
    target, draft = random_table(17, 4), random_table(18, 3, zeros=False)
    tree = DraftTree.from_paths(TREES[1], model(draft))
    law = accepted_depth_law(tree, model(target), "traversal")
    assert sum(law.values()) == 1
    assert expected_block_efficiency(tree, model(target), "traversal") == sum(
        (m * (d + 1) for d, m in law.items()), F(0)
    )
    greedy = verify(tree, model(target), "greedy", None)
    assert expected_block_efficiency(tree, model(target), "greedy") == greedy.accepted_depth + 1


def test_float_inputs_give_float_efficiencies_equal_to_the_exact_ones_to_rounding() -> None:
    target, draft = random_table(27, 4), random_table(28, 3, zeros=False)
    float_target = {k: [float(x) for x in v] for k, v in target.items()}
    float_draft = {k: [float(x) for x in v] for k, v in draft.items()}
    exact_tree = DraftTree.from_paths(TREES[0], model(draft))
    float_tree = DraftTree.from_paths(TREES[0], lambda prefix: float_draft[prefix])
    for method in ("naive_tree", "spectr", "specinfer", "khisti", "naive", "bv", "traversal"):
        exact = expected_block_efficiency(exact_tree, model(target), method)
        approx = expected_block_efficiency(float_tree, lambda prefix: float_target[prefix], method)
        assert isinstance(approx, float) and abs(approx - float(exact)) < 1e-12, method


@pytest.mark.parametrize(
    ("K", "L1", "L2", "method", "num_trees"),
    [
        (2, 0, 2, "specinfer", 1),
        (2, 0, 2, "naive_tree", 1),
        (2, 1, 1, "spectr", 1),
        (3, 1, 1, "specinfer", 1),
        (2, 1, 1, "bv", 1),
        (1, 2, 1, "naive_tree", 2),
        (2, 0, 1, "khisti", 2),
    ],
)
def test_the_delayed_tree_estimator_is_unbiased_for_drafting_followed_by_verification(
    K: int, L1: int, L2: int, method: str, num_trees: int
) -> None:
    target, draft = random_table(37, L1 + L2 + 1), random_table(38, L1 + L2, zeros=False)

    # exact E[tau + 1] of the whole step: drafts and verifier enumerated together
    def step(rng: RandomSource) -> int:
        tree = delayed_tree(K, L1, L2)(rng, draft)
        return verify(tree, model(target), method, rng).accepted_depth + 1

    truth = sum((m * v for v, m in exact_law(step).items()), F(0))  # type: ignore[misc]

    # exact expectation of the s-sample estimator over its own tree draws
    def estimate(rng: RandomSource) -> Fraction:
        value = estimate_block_efficiency(model(target), model(draft), method, K, L1, L2, rng, num_trees=num_trees)
        assert isinstance(value, Fraction)
        return value

    mean_estimate = sum((m * v for v, m in exact_law(estimate).items()), F(0))  # type: ignore[misc]
    assert mean_estimate == truth


def test_the_delayed_tree_sampler_has_single_draws_on_the_trunk_and_k_at_the_branch_node() -> None:
    draft = random_table(47, 4, zeros=False)
    tree = draft_delayed_tree(model(draft), 3, 2, 2, 5)
    nodes = [0]
    for _ in range(2):
        assert len(tree.draws[nodes[-1]]) == 1
        child = tree.child(nodes[-1], tree.draws[nodes[-1]][0])
        assert child is not None
        nodes.append(child)
    assert len(tree.draws[nodes[-1]]) == 3 and tree.max_depth == 4
    assert sum(len(d) for d in tree.draws) == 2 + 3 * 2


@pytest.mark.parametrize(
    ("args", "message"),
    [((0, 1, 1), "K must be an integer >= 1"), ((1, -1, 1), "L1 must be"), ((1, 1, 1.0), "L2 must be")],
)
def test_bad_delayed_tree_parameters_are_refused(args: tuple[Any, ...], message: str) -> None:
    draft = random_table(47, 3)
    with pytest.raises(ValueError, match=message):
        draft_delayed_tree(model(draft), *args, 0)
    with pytest.raises(ValueError, match="num_trees must be"):
        estimate_block_efficiency(model(draft), model(draft), "bv", 1, 1, 1, 0, num_trees=0)


def test_efficiency_refuses_the_same_lossy_combinations_as_verify() -> None:
    tree = DraftTree.from_paths([(0, 1)], lambda prefix: [F(1, 3)] * 3)
    wor = DraftTree(tree.tokens, tree.parents, tree.draws, tree.draft_probs, process="without_replacement")
    with pytest.raises(ValueError, match="without_replacement"):
        expected_block_efficiency(wor, lambda prefix: [F(1, 3)] * 3, "specinfer")
    with pytest.raises(ValueError, match="must be one of"):
        expected_block_efficiency(tree, lambda prefix: [F(1, 3)] * 3, "sequoia")
