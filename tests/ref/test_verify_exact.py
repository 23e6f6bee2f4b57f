"""Exact laws of every tree/path verifier by enumeration (docs/testing.md section 4.1, layer A5; docs/algorithms.md section 4-8).

The drafts are sampled from q *inside* the enumerated function (Hypothesis never picks draft tokens in a
losslessness test), then the verifier runs, then the emitted block is extended with target samples to the
fixed length L + 1. Its exact law must equal the autoregressive law prod_j p(y_j | y_<j) (``==`` on
Fractions). The target and draft tables are context dependent (p(.|a) != p(.|b), depth d != d + 1), so a
verifier that reads its parent's row fails (the mutant below).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spec_ref import DraftTree, ExactLaw, NodeReplaySource, exact_law, draft_delayed_tree, verify
from spec_ref.rng import RandomSource
from proofs._checks import traversal_oracle  # the runner's independent Traversal, with the 6.4 mutants
from tests.tables import Table, model, random_table

F = Fraction
V = 3
SAMPLING_METHODS = ("naive_tree", "nss", "spectr", "specinfer", "khisti", "naive", "bv", "tree_mc", "traversal")
#: (method, options) pairs: every sampling verifier plus the option variants that change the algorithm.
VARIANTS: list[tuple[str, dict[str, Any]]] = [(m, {}) for m in SAMPLING_METHODS] + [
    ("specinfer", {"specinfer_order": "draw"}),
    ("khisti", {"khisti_truncation": 2}),
    ("traversal", {"sibling_model": "wr"}),
]
VARIANT_IDS = [m + "".join(f"-{v}" for v in o.values()) for m, o in VARIANTS]


# ----- helpers shared by the tree tests (imported by test_efficiency_exact and test_verify_statistical) ----
def sample_paths(rng: RandomSource, draft: Table, K: int, L: int) -> list[tuple[int, ...]]:
    paths = []
    for _ in range(K):
        prefix: tuple[int, ...] = ()
        for _ in range(L):
            prefix = prefix + (rng.categorical(np.array(draft[prefix], dtype=object)),)
        paths.append(prefix)
    return paths


def iid_tree(K: int, L: int) -> Callable[[RandomSource, Table], DraftTree]:
    return lambda rng, draft: DraftTree.from_paths(sample_paths(rng, draft, K, L), model(draft))


def delayed_tree(K: int, L1: int, L2: int) -> Callable[[RandomSource, Table], DraftTree]:
    return lambda rng, draft: draft_delayed_tree(model(draft), K, L1, L2, rng)


def extend(rng: RandomSource, target: Table, tokens: tuple[int, ...], length: int) -> tuple[int, ...]:
    while len(tokens) < length:
        tokens = tokens + (rng.categorical(np.array(target[tokens], dtype=object)),)
    return tokens


def extended_block_law(
    target: Table,
    draft: Table,
    build: Callable[[RandomSource, Table], DraftTree],
    length: int,
    method: str,
    verifier_target: Callable[[tuple[int, ...]], Any] | None = None,
    **options: Any,
) -> ExactLaw:
    """Exact law of (drafts -> verify -> extend to ``length``) with everything enumerated."""
    seen_by_verifier = verifier_target or model(target)

    def step(rng: RandomSource) -> tuple[int, ...]:
        tree = build(rng, draft)
        result = verify(tree, seen_by_verifier, method, rng, **options)
        assert len(result.tokens) == result.accepted_depth + 1
        assert result.tokens[:-1] == tree.path_tokens(result.accepted_node)
        return extend(rng, target, result.tokens, length)

    return {k: v for k, v in exact_law(step).items() if v}


def autoregressive_law(target: Table, length: int) -> ExactLaw:
    law: ExactLaw = {}
    for seq in itertools.product(range(len(target[()])), repeat=length):
        mass = F(1)
        for i in range(length):
            mass *= target[seq[:i]][seq[i]]
        if mass:
            law[seq] = mass
    return law


def total_variation(a: ExactLaw, b: ExactLaw) -> Fraction:
    return sum((abs(a.get(k, F(0)) - b.get(k, F(0))) for k in set(a) | set(b)), F(0)) / 2


# ----- losslessness ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("method", "options"), VARIANTS, ids=VARIANT_IDS)
def test_every_sampling_verifier_emits_the_autoregressive_law_on_two_by_two_iid_trees(
    method: str, options: dict[str, Any]
) -> None:
    target, draft = random_table(11, 3), random_table(12, 2)
    law = extended_block_law(target, draft, iid_tree(2, 2), 3, method, **options)
    assert law == autoregressive_law(target, 3)


@pytest.mark.parametrize(("method", "options"), VARIANTS, ids=VARIANT_IDS)
def test_every_sampling_verifier_is_lossless_on_a_delayed_two_one_one_tree(method: str, options: dict[str, Any]) -> None:
    target, draft = random_table(21, 3), random_table(22, 2)
    law = extended_block_law(target, draft, delayed_tree(2, 1, 1), 3, method, **options)
    assert law == autoregressive_law(target, 3)


@pytest.mark.parametrize(
    ("method", "options", "K", "L"),
    [
        ("naive_tree", {}, 1, 3),
        ("spectr", {}, 1, 3),
        ("naive", {}, 1, 3),
        ("bv", {}, 1, 3),
        ("tree_mc", {}, 1, 3),
        ("traversal", {}, 1, 3),
        ("specinfer", {}, 3, 2),
        ("spectr", {}, 3, 2),
        ("khisti", {}, 3, 2),
        ("traversal", {}, 3, 2),
        ("traversal", {"sibling_model": "wr"}, 3, 2),
        ("bv", {}, 3, 2),
    ],
    ids=lambda v: str(v) if not isinstance(v, dict) else "-".join(map(str, v.values())) or "default",
)
def test_verifiers_are_lossless_on_deeper_and_wider_trees(method: str, options: dict[str, Any], K: int, L: int) -> None:
    target, draft = random_table(31 + K, L + 1), random_table(41 + L, L)
    law = extended_block_law(target, draft, iid_tree(K, L), L + 1, method, **options)
    assert law == autoregressive_law(target, L + 1)


@pytest.mark.parametrize("method", ["specinfer", "traversal"])
def test_verifiers_are_lossless_on_a_delayed_three_one_one_tree_with_forced_duplicates(method: str) -> None:
    target, draft = random_table(51, 3, zeros=False), random_table(52, 2, zeros=False)
    law = extended_block_law(target, draft, delayed_tree(3, 1, 1), 3, method)
    assert law == autoregressive_law(target, 3)


@settings(max_examples=min(settings.default.max_examples, 30))
@given(
    seed=st.integers(0, 2**32 - 1),
    shape=st.sampled_from([(1, 1), (2, 1), (3, 1), (1, 2), (2, 2)]),
    variant=st.sampled_from(range(len(VARIANTS))),
)
def test_random_tables_and_shapes_are_verified_losslessly(seed: int, shape: tuple[int, int], variant: int) -> None:
    K, L = shape
    method, options = VARIANTS[variant]
    target, draft = random_table(seed, L + 1), random_table(seed + 1, L)
    law = extended_block_law(target, draft, iid_tree(K, L), L + 1, method, **options)
    assert law == autoregressive_law(target, L + 1)


@pytest.mark.parametrize(("method", "options"), VARIANTS, ids=VARIANT_IDS)
def test_a_verifier_that_reads_the_parents_target_row_is_caught(method: str, options: dict[str, Any]) -> None:
    # Mutant (test only): the verifier sees p(. | parent's prefix) at every non-root node.
    target, draft = random_table(11, 3), random_table(12, 2)

    def parents_row(prefix: tuple[int, ...]) -> list[Fraction]:
        return target[prefix[:-1]]

    law = extended_block_law(target, draft, iid_tree(2, 2), 3, method, verifier_target=parents_row, **options)
    assert total_variation(law, autoregressive_law(target, 3)) > F(1, 100)


def test_nss_is_lossless_on_a_deterministic_tree_and_its_q_is_not_needed() -> None:
    target = random_table(61, 3)
    # A top-k style tree: distinct siblings, no draft distribution (q is a point mass at each draft).
    tree = DraftTree(
        tokens=(-1, 0, 2, 1, 0),
        parents=(-1, 0, 0, 1, 2),
        draws=((0, 2), (1,), (0,), (), ()),
        draft_probs=(None, None, None, None, None),
        process="deterministic",
    )

    def step(rng: RandomSource) -> tuple[int, ...]:
        return extend(rng, target, verify(tree, model(target), "nss", rng).tokens, 3)

    assert {k: v for k, v in exact_law(step).items() if v} == autoregressive_law(target, 3)


def wor_tree(K: int, L: int) -> Callable[[RandomSource, Table], DraftTree]:
    """Every node above depth L draws min(K, |supp q|) distinct children successively without replacement."""

    def build(rng: RandomSource, draft: Table) -> DraftTree:
        draws_of: dict[tuple[int, ...], list[int]] = {}
        frontier: list[tuple[int, ...]] = [()]
        for _ in range(L):
            nxt = []
            for prefix in frontier:
                weights = list(draft[prefix])
                draws_of[prefix] = []
                for _ in range(min(K, sum(1 for w in weights if w))):
                    token = rng.categorical(np.array(weights, dtype=object))
                    weights[token] = F(0)
                    draws_of[prefix].append(token)
                    nxt.append(prefix + (token,))
            frontier = nxt
        order: list[tuple[int, ...]] = []

        def visit(prefix: tuple[int, ...]) -> None:
            order.append(prefix)
            for t in draws_of.get(prefix, []):
                visit(prefix + (t,))

        visit(())
        index = {p: i for i, p in enumerate(order)}
        return DraftTree(
            tokens=tuple(-1 if not p else p[-1] for p in order),
            parents=tuple(-1 if not p else index[p[:-1]] for p in order),
            draws=tuple(tuple(draws_of.get(p, [])) for p in order),
            draft_probs=tuple(np.array(draft[p], dtype=object) if draws_of.get(p) else None for p in order),
            process="without_replacement",
        )

    return build


def test_traversal_wor_is_lossless_on_trees_drafted_without_replacement() -> None:
    target, draft = random_table(71, 3, zeros=False), random_table(72, 2, zeros=False)
    law = extended_block_law(target, draft, wor_tree(2, 2), 3, "traversal")
    assert law == autoregressive_law(target, 3)


def test_specinfer_on_trees_drafted_without_replacement_is_lossy_which_is_why_verify_refuses_it() -> None:
    # Relabel the without-replacement tree as i.i.d. to get past the refusal (test-only mutant).
    target, draft = random_table(71, 3, zeros=False), random_table(72, 2, zeros=False)
    build = wor_tree(2, 2)

    def relabelled(rng: RandomSource, table: Table) -> DraftTree:
        tree = build(rng, table)
        return DraftTree(tree.tokens, tree.parents, tree.draws, tree.draft_probs, process="iid")

    law = extended_block_law(target, draft, relabelled, 3, "specinfer")
    assert total_variation(law, autoregressive_law(target, 3)) > F(1, 100)


# ----- reductions and equal laws ----------------------------------------------------------------------------
def conditional_law(tree: DraftTree, target: Table, method: str, **options: Any) -> ExactLaw:
    law = exact_law(lambda rng: verify(tree, model(target), method, rng, **options).tokens)
    return {k: v for k, v in law.items() if v}


@settings(max_examples=min(settings.default.max_examples, 40))
@given(seed=st.integers(0, 2**32 - 1), chain=st.lists(st.integers(0, V - 1), min_size=0, max_size=3))
def test_bv_tree_verification_and_traversal_with_one_path_have_identical_laws(seed: int, chain: list[int]) -> None:
    target, draft = random_table(seed, 4), random_table(seed + 1, 3, zeros=False)
    tree = DraftTree.from_paths([tuple(chain)], model(draft))
    bv = conditional_law(tree, target, "bv")
    assert conditional_law(tree, target, "tree_mc") == bv
    assert conditional_law(tree, target, "traversal") == bv
    assert conditional_law(tree, target, "traversal", sibling_model="wr") == bv


@settings(max_examples=min(settings.default.max_examples, 40))
@given(seed=st.integers(0, 2**32 - 1), chain=st.lists(st.integers(0, V - 1), min_size=0, max_size=3))
def test_every_ot_method_on_a_single_path_reduces_to_naive_speculative_sampling(seed: int, chain: list[int]) -> None:
    target, draft = random_table(seed, 4), random_table(seed + 1, 3, zeros=False)
    tree = DraftTree.from_paths([tuple(chain)], model(draft))
    naive = conditional_law(tree, target, "naive")
    for method in ("naive_tree", "spectr", "specinfer", "khisti"):
        assert conditional_law(tree, target, method) == naive, method


def test_naive_on_path_zero_ignores_the_other_paths() -> None:
    target, draft = random_table(81, 3), random_table(82, 2, zeros=False)
    wide = DraftTree.from_paths([(0, 1), (2, 2), (0, 0)], model(draft))
    chain = DraftTree.from_paths([(0, 1)], model(draft))
    for method in ("naive", "bv", "tree_mc"):
        assert conditional_law(wide, target, method) == conditional_law(chain, target, method)


def float_table(table: Table) -> dict[tuple[int, ...], np.ndarray]:
    return {k: np.array([float(x) for x in v]) for k, v in table.items()}


@pytest.mark.parametrize("seed", range(20))
def test_bv_and_single_path_traversal_consume_the_same_node_uniforms_and_emit_the_same_tokens(seed: int) -> None:
    target, draft = float_table(random_table(seed, 4)), float_table(random_table(seed + 100, 3, zeros=False))
    rnd = np.random.default_rng(seed)
    chain = tuple(int(rnd.choice(V, p=draft[()])) for _ in range(1))
    for _ in range(2):
        chain = chain + (int(rnd.choice(V, p=draft[chain])),)
    tree = DraftTree.from_paths([chain], lambda prefix: draft[prefix])
    table = rnd.random((tree.num_nodes, 2))
    bv = verify(tree, lambda prefix: target[prefix], "bv", NodeReplaySource(table))
    traversal = verify(tree, lambda prefix: target[prefix], "traversal", NodeReplaySource(table))
    assert (bv.tokens, bv.accepted_node) == (traversal.tokens, traversal.accepted_node)


@pytest.mark.parametrize("seed", range(20))
def test_naive_and_naive_tree_consume_the_same_node_uniforms_on_a_chain(seed: int) -> None:
    target, draft = float_table(random_table(seed, 4)), float_table(random_table(seed + 100, 3, zeros=False))
    tree = DraftTree.from_paths([(0, 1, 2)], lambda prefix: draft[prefix])
    table = np.random.default_rng(seed).random((tree.num_nodes, 2))
    naive = verify(tree, lambda prefix: target[prefix], "naive", NodeReplaySource(table))
    ot = verify(tree, lambda prefix: target[prefix], "naive_tree", NodeReplaySource(table))
    assert (naive.tokens, naive.accepted_node) == (ot.tokens, ot.accepted_node)


# ----- Traversal negative controls (docs/algorithms.md section 6.3, 6.4): test-only mutants --------------------------------
def sorted_by_token(tree: DraftTree) -> DraftTree:
    """Mutant input: siblings visited in token-id order instead of draw order."""
    return DraftTree(tree.tokens, tree.parents, tuple(tuple(sorted(d)) for d in tree.draws), tree.draft_probs)


def test_traversal_that_visits_siblings_in_token_id_order_is_lossy() -> None:
    target, draft = random_table(91, 3, zeros=False), random_table(92, 2, zeros=False)
    build = iid_tree(3, 2)
    law = extended_block_law(target, draft, lambda rng, d: sorted_by_token(build(rng, d)), 3, "traversal")
    assert total_variation(law, autoregressive_law(target, 3)) > F(1, 1000)


def traversal_mutant_law(rule: str, K: int, L: int, seed: int) -> tuple[ExactLaw, ExactLaw]:
    target, draft = random_table(seed, L + 1, zeros=False), random_table(seed + 1, L, zeros=False)
    build = iid_tree(K, L)

    def step(rng: RandomSource) -> tuple[int, ...]:
        return extend(rng, target, traversal_oracle(build(rng, draft), target, rng, rule=rule), L + 1)

    return {k: v for k, v in exact_law(step).items() if v}, autoregressive_law(target, L + 1)


def test_the_test_local_traversal_with_the_specified_update_is_lossless_so_the_mutants_below_are_fair() -> None:
    law, expected = traversal_mutant_law("current", 2, 2, 101)
    assert law == expected


def test_traversal_weight_update_with_the_draft_mass_of_the_rejected_token_is_lossy_even_with_one_path() -> None:
    law, expected = traversal_mutant_law("draft_mass", 1, 2, 101)
    assert total_variation(law, expected) > F(1, 1000)


def test_traversal_weight_update_with_the_initial_weight_is_lossy_with_two_paths() -> None:
    law, expected = traversal_mutant_law("initial", 2, 2, 101)
    assert total_variation(law, expected) > F(1, 1000)


def test_traversal_weight_update_with_the_initial_weight_equals_bv_with_one_path() -> None:
    # Each node is updated at most once on a chain, so this mutant only shows up at K >= 2 (6.4).
    law, expected = traversal_mutant_law("initial", 1, 2, 101)
    assert law == expected
