"""Dual draft: merge of seed 001 (docs/papers.md) (remap phi, block mask, positions, path matrix, greedy DFS) and routing
of seed 000 (mean confidence, tie rule, refusal of sampled drafts, tau accounting). All exact."""

from __future__ import annotations

import itertools
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from spec_ref import (
    DraftTree,
    ScoredDraftTree,
    draft_delayed_tree,
    draft_topk_tree,
    exact_law,
    mean_tokens_per_step,
    merge_trees,
    route,
    tensorize,
    tokens_per_step,
    verify,
    verify_merged_greedy,
)
from tests.ref.test_tensorize import deterministic_trees

F = Fraction
UNIFORM4 = [F(1, 4)] * 4


def det_tree(paths: list[tuple[int, ...]]) -> DraftTree:
    tree = DraftTree.from_paths(paths, lambda prefix: UNIFORM4)
    return DraftTree(tree.tokens, tree.parents, tree.draws, (None,) * tree.num_nodes, "deterministic")


def target_table(seed: int, vocab: int = 4) -> Any:
    """Context-dependent target with ties (integer weights), so the greedy tie rule matters."""

    def model(prefix: tuple[int, ...]) -> list[Fraction]:
        gen = np.random.default_rng([seed, 7, len(prefix), *prefix])
        weights = [int(w) for w in gen.integers(1, 4, size=vocab)]
        return [F(w, sum(weights)) for w in weights]

    return model


def greedy(model: Any, prefix: tuple[int, ...]) -> int:
    probs = model(prefix)
    return max(range(len(probs)), key=lambda t: (probs[t], -t))


# ----- merge -------------------------------------------------------------------------------------------
HEAD1 = det_tree([(0, 1), (2,)])  # nodes: root, 0, 0.1, 2   (n1 = 3)
HEAD2 = det_tree([(0, 3, 1)])  # nodes: root, 0, 0.3, 0.3.1 (n2 = 3); token 0 duplicates head 1's


def test_seed_001_worked_example_maps_head_two_nodes_1_2_3_to_4_5_6() -> None:
    merged = merge_trees(HEAD1, HEAD2)
    assert merged.num_head_nodes == (3, 3)
    assert merged.phi == (0, 4, 5, 6)
    assert merged.parents == (-1, 0, 1, 0, 0, 4, 5)
    assert merged.tokens == (-1, 0, 1, 2, 0, 3, 1)
    assert merged.heads == (0, 1, 1, 1, 2, 2, 2)


def test_merged_mask_is_block_structured_with_a_shared_root() -> None:
    merged = merge_trees(HEAD1, HEAD2)
    mask = merged.layout.attention_mask
    m1 = tensorize(HEAD1).attention_mask
    m2 = tensorize(HEAD2).attention_mask
    assert mask[0].tolist() == [True] + [False] * 6
    assert mask[:, 0].all()  # every node attends to the shared root
    assert (mask[1:4, 1:4] == m1[1:, 1:]).all()
    assert (mask[4:, 4:] == m2[1:, 1:]).all()
    assert not mask[1:4, 4:].any() and not mask[4:, 1:4].any()  # disjoint subtrees
    assert merged.layout.positions.tolist() == [0, 1, 2, 1, 1, 2, 3]
    assert merged.layout.path_matrix.tolist() == [[0, 1, 2, -1], [0, 3, -1, -1], [0, 4, 5, 6]]


@given(deterministic_trees(), deterministic_trees())
def test_phi_keeps_parent_pointers_valid_for_random_trees(tree_a: DraftTree, tree_b: DraftTree) -> None:
    merged = merge_trees(tree_a, tree_b)
    n1 = tree_a.num_nodes - 1
    assert merged.tokens[: n1 + 1] == tree_a.tokens and merged.parents[: n1 + 1] == tree_a.parents
    for i in range(1, tree_b.num_nodes):
        assert merged.phi[i] == n1 + i
        assert merged.tokens[merged.phi[i]] == tree_b.tokens[i]
        assert merged.parents[merged.phi[i]] == merged.phi[tree_b.parents[i]]
        assert merged.path_tokens(merged.phi[i]) == tree_b.path_tokens(i)
    positions = merged.layout.positions
    for i in range(1, merged.num_nodes):
        assert positions[i] == positions[merged.parents[i]] + 1
        assert merged.layout.attention_mask[i, 0]
        if merged.heads[i] == 1:
            assert not merged.layout.attention_mask[i, n1 + 1:].any()
        else:
            assert not merged.layout.attention_mask[i, 1 : n1 + 1].any()
    rows = [tuple(int(x) for x in row if x >= 0) for row in merged.layout.path_matrix]
    rows_a = [tuple(int(x) for x in row if x >= 0) for row in tensorize(tree_a).path_matrix]
    rows_b = [tuple(merged.phi[int(x)] for x in row if x >= 0) for row in tensorize(tree_b).path_matrix]
    expected = [r for r in rows_a if len(r) > 1 or tree_a.num_nodes == 1 == tree_b.num_nodes]
    expected += [r for r in rows_b if len(r) > 1]
    if tree_a.num_nodes == 1 and tree_b.num_nodes == 1:
        expected = [(0,)]
    assert rows == expected


@given(deterministic_trees(max_nodes=7, vocab=3), deterministic_trees(max_nodes=7, vocab=3), st.integers(0, 2**32 - 1))
def test_verifying_the_merged_tree_equals_verifying_each_candidate_path_in_context(
    tree_a: DraftTree, tree_b: DraftTree, seed: int
) -> None:
    merged = merge_trees(tree_a, tree_b)
    target = target_table(seed, vocab=3)
    result = verify_merged_greedy(merged, target)
    # each candidate path (row of the path matrix) verified on its own, in its own context
    best_length, best_row = -1, None
    for row in merged.layout.path_matrix:
        nodes = [int(x) for x in row if x >= 0]
        length = 0
        for node in nodes[1:]:
            if merged.tokens[node] != greedy(target, merged.path_tokens(merged.parents[node])):
                break
            length += 1
        if length > best_length:
            best_length, best_row = length, nodes
    assert best_row is not None
    assert result.accepted_length == best_length
    assert result.path_nodes == tuple(best_row[: best_length + 1])
    assert result.head == merged.heads[best_row[best_length]]
    # and the emitted block is exactly greedy decoding of the target
    prefix: tuple[int, ...] = ()
    for _ in range(best_length + 1):
        prefix += (greedy(target, prefix),)
    assert result.tokens == prefix
    assert result.bonus_token == prefix[-1]


def test_duplicate_root_token_explores_both_heads_and_takes_the_longer_match() -> None:
    # target greedy continuation: 0, 3, 1, 2, ...; head 1 matches (0,) only, head 2 matches (0, 3, 1)
    def target(prefix: tuple[int, ...]) -> list[Fraction]:
        nxt = {(): 0, (0,): 3, (0, 3): 1, (0, 3, 1): 2}.get(prefix, 2)
        return [F(1, 2) if t == nxt else F(1, 6) for t in range(4)]

    result = verify_merged_greedy(merge_trees(HEAD1, HEAD2), target)
    assert (result.accepted_length, result.head, result.node) == (3, 2, 6)
    assert result.tokens == (0, 3, 1, 2)
    assert tokens_per_step(result.accepted_length) == 4


def test_equal_matches_in_both_heads_go_to_head_one() -> None:
    def target(prefix: tuple[int, ...]) -> list[Fraction]:
        nxt = {(): 0}.get(prefix, 2)  # after 0 the target wants 2: neither head continues
        return [F(1, 2) if t == nxt else F(1, 6) for t in range(4)]

    result = verify_merged_greedy(merge_trees(HEAD1, HEAD2), target)
    assert (result.accepted_length, result.head, result.node) == (1, 1, 1)


def test_merged_greedy_agrees_with_the_single_tree_greedy_verifier_when_head_two_is_empty() -> None:
    root_only = det_tree([])
    for seed in range(20):
        target = target_table(seed)
        tree = draft_topk_tree(target_table(seed + 100), depth=3, top_k=2, budget=6)
        ours = verify_merged_greedy(merge_trees(tree, root_only), target)
        theirs = verify(tree, target, "greedy", None)
        assert ours.tokens == theirs.tokens and ours.node == theirs.accepted_node


def test_union_tree_merges_duplicate_tokens_for_sampling_verifiers() -> None:
    union = merge_trees(HEAD1, HEAD2).union_tree()
    assert union.process == "deterministic"
    assert {union.path_tokens(u) for u in range(union.num_nodes)} == {
        (), (0,), (0, 1), (2,), (0, 3), (0, 3, 1)
    }
    assert union.draws[0] == (0, 2)
    assert union.draws[union.child(0, 0) or -1] == (1, 3)


def q_shared(prefix: tuple[int, ...]) -> list[Fraction]:
    return [F(1, 2), F(1, 3), F(1, 6)] if len(prefix) % 2 == 0 else [F(1, 3), F(1, 3), F(1, 3)]


def test_merging_iid_trees_of_the_same_q_concatenates_the_draws() -> None:
    tree_a = draft_delayed_tree(q_shared, 2, 0, 2, 1)
    tree_b = draft_delayed_tree(q_shared, 1, 0, 2, 2)
    union = merge_trees(tree_a, tree_b).union_tree()
    assert union.process == "iid"
    assert union.draws[0] == tree_a.draws[0] + tree_b.draws[0]
    assert union.draft_probs[0] is not None and list(union.draft_probs[0]) == q_shared(())


def test_merging_iid_trees_of_heads_with_different_q_is_refused() -> None:
    tree_a = draft_delayed_tree(q_shared, 2, 0, 2, 1)
    tree_b = draft_delayed_tree(lambda prefix: [F(1, 3)] * 3, 2, 0, 2, 1)
    with pytest.raises(ValueError, match="different q under one shared q is lossy"):
        merge_trees(tree_a, tree_b)


def test_merging_trees_of_different_processes_or_without_replacement_is_refused() -> None:
    sampled = draft_delayed_tree(q_shared, 2, 0, 2, 1)
    with pytest.raises(ValueError, match="process='iid' and tree_b.process='deterministic' differ"):
        merge_trees(sampled, HEAD1)
    wr = DraftTree((-1, 0, 1), (-1, 0, 0), ((0, 1), (), ()), (q_shared(()), None, None), "without_replacement")
    with pytest.raises(ValueError, match="without_replacement"):
        merge_trees(wr, wr)
    with pytest.raises(ValueError, match="tree_b must be a spec_ref.DraftTree"):
        merge_trees(HEAD1, [0, 1])  # type: ignore[arg-type]


def test_verify_merged_greedy_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="merged must be a MergedTree"):
        verify_merged_greedy(HEAD1, target_table(0))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"target_model\(\(\)\) must sum to 1"):
        verify_merged_greedy(merge_trees(HEAD1, HEAD2), lambda prefix: [0.5, 0.1, 0.1, 0.1])


# ----- routing -----------------------------------------------------------------------------------------
def scored(paths: list[tuple[int, ...]], confidences: tuple[Any, ...]) -> ScoredDraftTree:
    tree = det_tree(paths)
    return ScoredDraftTree(tree.tokens, tree.parents, tree.draws, tree.draft_probs, "deterministic",
                           confidences=confidences)


def test_route_picks_the_head_with_the_larger_mean_confidence() -> None:
    low = scored([(0, 1)], (1, F(1, 2), F(1, 4)))  # mu = 3/8
    high = scored([(2,), (3,)], (1, F(1, 2), F(1, 3)))  # mu = 5/12
    result = route(low, high)
    assert result.head == 2 and result.tree is high
    assert result.mean_confidences == (F(3, 8), F(5, 12))
    assert route(high, low).head == 1


def test_route_ties_go_to_head_one() -> None:
    a = scored([(0, 1)], (1, F(1, 2), F(1, 4)))
    b = scored([(2,), (3,)], (1, F(1, 4), F(1, 2)))
    result = route(a, b)
    assert result.mean_confidences == (F(3, 8), F(3, 8))
    assert result.head == 1 and result.tree is a
    assert route(b, a).tree is b


def test_route_uses_the_topk_trees_exponentiated_cumulative_log_scores() -> None:
    def q(prefix: tuple[int, ...]) -> list[Fraction]:
        return [F(1, 2), F(1, 4), F(1, 4), F(0)] if prefix == () else [F(0), F(1, 2), F(1, 2), F(0)]

    tree = draft_topk_tree(q, depth=2, top_k=2, budget=3)  # confidences 1/2, 1/4, 1/4
    other = draft_topk_tree(lambda prefix: [F(1, 3)] * 3, depth=1, top_k=3, budget=3)  # 1/3 each
    result = route(tree, other)
    assert result.mean_confidences == (F(1, 3), F(1, 3)) and result.head == 1


def test_routing_on_sampled_drafts_is_refused() -> None:
    sampled = draft_delayed_tree(q_shared, 2, 0, 2, 3)
    with pytest.raises(ValueError, match="routing on sampled drafts is lossy"):
        route(sampled, HEAD1)
    with pytest.raises(ValueError, match="tree_b.process='iid': routing on sampled drafts is lossy"):
        route(scored([(0,)], (1, F(1, 2))), sampled)


def test_routing_needs_confidences() -> None:
    with pytest.raises(ValueError, match="tree_a has no confidences"):
        route(HEAD1, HEAD2)


def test_a_head_without_draft_nodes_scores_zero() -> None:
    empty = scored([], (1,))
    assert route(empty, scored([(1,)], (1, F(1, 9)))).head == 2
    assert route(empty, empty).head == 1


def test_tau_counts_the_root_token_plus_the_accepted_tokens() -> None:
    assert tokens_per_step(0) == 1 and tokens_per_step(3) == 4
    assert mean_tokens_per_step([0, 2, 1]) == F(6, 3)
    with pytest.raises(ValueError, match="accepted_length must be an integer >= 0"):
        tokens_per_step(-1)
    with pytest.raises(ValueError, match="empty"):
        mean_tokens_per_step([])


def test_nss_on_the_token_merged_union_is_exactly_lossless() -> None:
    # docs/algorithms.md section 8: sampling on merged dual-draft trees is NSS on the deterministic union, one
    # target draw per visited node shared by all paths. Emitted block extended with target samples to a
    # fixed length must have exactly the autoregressive law of the (context-dependent) target.
    union = merge_trees(HEAD1, HEAD2).union_tree()
    target = target_table(3)
    length = union.max_depth + 1

    def run(rng: Any) -> tuple[int, ...]:
        block = verify(union, target, "nss", rng).tokens
        while len(block) < length:
            block += (rng.categorical(np.asarray(target(block), dtype=object)),)
        return block

    expected = {}
    for seq in itertools.product(range(4), repeat=length):
        prob = F(1)
        for j in range(length):
            prob *= target(seq[:j])[seq[j]]
        expected[seq] = prob
    assert exact_law(run) == expected
