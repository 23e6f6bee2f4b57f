"""Greedy and DynaTree verification (docs/algorithms.md section 8) and the input contract of ``spec_ref.verify``."""

from __future__ import annotations

import itertools
import random
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spec_ref import DraftTree, METHODS, verify
from tests.ref.test_verify_exact import model, random_table

F = Fraction
V = 3


def tie_table(seed: int, depth: int) -> dict[tuple[int, ...], list[Fraction]]:
    """Tables with frequent exact ties (weights from {1, 2}), to exercise the lowest-id tie rule."""
    rnd = random.Random(seed)
    table = {}
    for d in range(depth + 1):
        for prefix in itertools.product(range(V), repeat=d):
            w = [rnd.choice((1, 2)) for _ in range(V)]
            table[prefix] = [F(x, sum(w)) for x in w]
    return table


def greedy_decode(table: dict[tuple[int, ...], list[Fraction]], length: int) -> tuple[int, ...]:
    out: tuple[int, ...] = ()
    for _ in range(length):
        row = table[out]
        out = out + (int(np.argmax(np.array([float(x) for x in row]))),)  # np.argmax: lowest id on ties
    return out


def deterministic_tree(paths: list[tuple[int, ...]]) -> DraftTree:
    merged = DraftTree.from_paths(paths, lambda prefix: [F(1, V)] * V)
    draws = tuple(tuple(dict.fromkeys(d)) for d in merged.draws)  # distinct siblings, draw order kept
    return DraftTree(merged.tokens, merged.parents, draws, (None,) * merged.num_nodes, process="deterministic")


paths_strategy = st.lists(
    st.lists(st.integers(0, V - 1), min_size=0, max_size=3).map(tuple), min_size=1, max_size=4
)


@settings(max_examples=min(settings.default.max_examples, 100))
@given(seed=st.integers(0, 2**32 - 1), paths=paths_strategy, ties=st.booleans())
def test_greedy_and_dynatree_emit_exactly_the_targets_greedy_continuation_and_the_longest_match(
    seed: int, paths: list[tuple[int, ...]], ties: bool
) -> None:
    target = tie_table(seed, 4) if ties else random_table(seed, 4)
    for tree in (deterministic_tree(paths), DraftTree.from_paths(paths, lambda prefix: [F(1, V)] * V)):
        result = verify(tree, model(target), "greedy", None)
        assert result.tokens == greedy_decode(target, len(result.tokens))
        # longest: no drafted path matches the greedy continuation further than the accepted node
        longest = max(
            (tree.depths[u] for u in range(tree.num_nodes) if tree.path_tokens(u) == greedy_decode(target, tree.depths[u])),
        )
        assert result.accepted_depth == longest
        assert verify(tree, model(target), "dynatree", None) == type(result)(
            result.tokens, result.accepted_node, result.accepted_depth, "dynatree"
        )


def test_dynatree_commits_the_targets_first_greedy_token_when_the_drafted_root_token_misses() -> None:
    target = {(): [F(1, 2), F(1, 4), F(1, 4)], (1,): [F(1), F(0), F(0)]}  # the draft 1, 0 would match below
    tree = deterministic_tree([(1, 0)])
    result = verify(tree, lambda prefix: target.get(prefix, [F(1, 3)] * 3), "dynatree", None)
    assert result.tokens == (0,) and result.accepted_depth == 0


def test_dynatree_appends_the_bonus_after_the_longest_greedy_consistent_path() -> None:
    target = {
        (): [F(0), F(1), F(0)],
        (1,): [F(1, 3), F(1, 3), F(1, 3)],  # tie: lowest id 0
        (1, 0): [F(0), F(0), F(1)],
        (1, 0, 2): [F(0), F(1), F(0)],
    }
    tree = deterministic_tree([(1, 0, 2), (1, 2)])
    result = verify(tree, lambda prefix: target.get(prefix, [F(1, 3)] * 3), "dynatree", None)
    assert result.tokens == (1, 0, 2, 1) and result.accepted_depth == 3


# ----- bad input -------------------------------------------------------------------------------------------
def small_tree() -> DraftTree:
    return DraftTree.from_paths([(0, 1), (2, 0)], lambda prefix: [F(1, 3)] * 3)


def uniform_target(prefix: tuple[int, ...]) -> list[Fraction]:
    return [F(1, 3)] * 3


@pytest.mark.parametrize("method", [m for m in METHODS if m not in ("nss", "greedy", "dynatree")])
def test_every_method_but_nss_and_greedy_refuses_a_deterministic_tree(method: str) -> None:
    with pytest.raises(ValueError, match="process='deterministic'.*lossy"):
        verify(deterministic_tree([(0, 1), (2,)]), uniform_target, method, 0)


@pytest.mark.parametrize("method", ["naive_tree", "spectr", "specinfer", "khisti", "naive", "bv", "tree_mc"])
def test_iid_verifiers_refuse_a_tree_drafted_without_replacement(method: str) -> None:
    tree = small_tree()
    wor = DraftTree(tree.tokens, tree.parents, tree.draws, tree.draft_probs, process="without_replacement")
    with pytest.raises(ValueError, match="without_replacement"):
        verify(wor, uniform_target, method, 0)
    with pytest.raises(ValueError, match="sibling_model='wr'.*without_replacement"):
        verify(wor, uniform_target, "traversal", 0, sibling_model="wr")
    verify(wor, uniform_target, "traversal", 0)  # WOR rounds are the without-replacement process


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"method": "beam"}, "method='beam' must be one of"),
        ({"method": "spectr", "specinfer_order": "draw"}, r"option\(s\) \['specinfer_order'\] do not apply"),
        ({"method": "traversal", "sibling_model": "random"}, "sibling_model must be 'wor' or 'wr'"),
        ({"method": "specinfer", "specinfer_order": "sorted"}, "specinfer_order must be"),
        ({"method": "khisti", "khisti_truncation": 0}, "khisti_truncation must be an integer >= 1"),
        ({"method": "spectr", "spectr_iterations": 1.5}, "spectr_iterations must be an integer >= 1"),
    ],
)
def test_unknown_methods_and_options_are_refused_by_name(kwargs: dict[str, Any], message: str) -> None:
    method = kwargs.pop("method")
    with pytest.raises(ValueError, match=message):
        verify(small_tree(), uniform_target, method, 0, **kwargs)


def test_a_target_with_another_vocabulary_size_than_the_tree_is_refused() -> None:
    with pytest.raises(ValueError, match=r"tree.draft_probs\[0\].shape=\(3,\) must be \(4,\)"):
        verify(small_tree(), lambda prefix: [F(1, 4)] * 4, "bv", 0)


def test_target_vectors_of_varying_length_are_refused() -> None:
    with pytest.raises(ValueError, match=r"target_model\(\(0,\)\)"):
        verify(small_tree(), lambda prefix: [F(1, 2)] * 2 if prefix else [F(1, 3)] * 3, "bv", 0)


def test_drafted_tokens_outside_the_target_vocabulary_are_refused() -> None:
    tree = DraftTree((-1, 3), (-1, 0), ((3,), ()), (None, None), process="deterministic")
    with pytest.raises(ValueError, match=r"tree.tokens\[1\]=3 is outside the target vocabulary"):
        verify(tree, uniform_target, "greedy", None)


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (lambda prefix: [0.5, 0.5, float("nan")], "must be finite"),
        (lambda prefix: [0.5, 0.6, -0.1], "must be non-negative"),
        (lambda prefix: [0.5, 0.6, 0.1], "must sum to 1"),
        (lambda prefix: [[1.0, 0.0, 0.0]], "must be a vector"),
    ],
)
def test_malformed_target_vectors_are_refused_naming_the_prefix(target: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        verify(small_tree(), target, "naive_tree", 0)


def test_non_tree_non_model_and_bad_rng_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="tree must be a spec_ref.DraftTree"):
        verify([(0, 1)], uniform_target, "bv", 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="target_model must be a function"):
        verify(small_tree(), [F(1, 3)] * 3, "bv", 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rng must be"):
        verify(small_tree(), uniform_target, "bv", "seed")


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: DraftTree((), (), (), ()), "at least the root"),
        (lambda: DraftTree((-1, 0, 1), (-1, 2, 0), ((1,), (), (0,)), (None,) * 3), "must be an earlier node"),
        (lambda: DraftTree((-1, 0), (-1, 1), ((0,), ()), (None, None)), "must be an earlier node"),  # a cycle
        (lambda: DraftTree((-1, 0), (-1, 0, 0), ((0,), ()), (None, None)), "len\\(parents\\)=3"),
        (lambda: DraftTree((-1, 0), (-1, 0), ((1,), ()), ([0.5, 0.5], None)), "must list exactly the child"),
    ],
)
def test_malformed_trees_are_refused_on_construction(build: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


def test_float_and_fraction_inputs_give_the_same_greedy_result_and_float_runs_on_a_generator() -> None:
    target = random_table(5, 3)
    tree = small_tree()
    float_target = {k: [float(x) for x in v] for k, v in target.items()}
    assert verify(tree, model(target), "greedy", None).tokens == verify(
        tree, lambda prefix: float_target[prefix], "greedy", None
    ).tokens
    for method in METHODS:
        result = verify(tree, lambda prefix: float_target[prefix], method, np.random.default_rng(0))
        assert result.tokens[:-1] == tree.path_tokens(result.accepted_node)
        assert 0 <= result.extra_token < V and float_target[result.tokens[:-1]][result.extra_token] > 0
