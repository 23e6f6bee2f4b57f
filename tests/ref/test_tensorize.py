"""Tensorisation for one verifier pass (seed 001 (docs/papers.md) sections 4.1-4.4): exact structural properties."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from spec_ref import DraftTree, tensorize, tensorize_structure


@st.composite
def deterministic_trees(draw: st.DrawFn, max_nodes: int = 9, vocab: int = 4) -> DraftTree:
    """Random ancestors-first trees (parents[i] < i), sibling tokens distinct, draws = children in order."""
    size = draw(st.integers(1, max_nodes))
    tokens, parents = [-1], [-1]
    used: list[list[int]] = [[]]
    for i in range(1, size):
        open_nodes = [j for j in range(i) if len(used[j]) < vocab]
        parent = open_nodes[draw(st.integers(0, len(open_nodes) - 1))]
        free = [t for t in range(vocab) if t not in used[parent]]
        token = free[draw(st.integers(0, len(free) - 1))]
        used[parent].append(token)
        used.append([])
        tokens.append(token)
        parents.append(parent)
    draws = tuple(tuple(u) for u in used)
    return DraftTree(tuple(tokens), tuple(parents), draws, (None,) * size, "deterministic")


def check_layout(tree: DraftTree) -> None:
    layout = tensorize(tree)
    n = tree.num_nodes
    assert layout.tokens.tolist() == list(tree.tokens)
    assert layout.parents.tolist() == list(tree.parents)
    assert layout.positions[0] == 0
    for i in range(1, n):
        assert layout.positions[i] == layout.positions[tree.parents[i]] + 1
    for i in range(n):
        ancestors = set(tree.path_nodes(i))
        assert {j for j in range(n) if layout.attention_mask[i, j]} == ancestors
    assert layout.path_matrix.shape == (len(tree.leaves()), tree.max_depth + 1)
    assert layout.leaves.tolist() == list(tree.leaves())
    for row, leaf in zip(layout.path_matrix, layout.leaves):
        nodes = [int(x) for x in row if x >= 0]
        assert nodes == list(tree.path_nodes(int(leaf)))  # a valid root-to-leaf path, root first
        assert all(x == -1 for x in row[len(nodes):])  # padding only at the end
        for parent, child in zip(nodes, nodes[1:]):
            assert tree.parents[child] == parent


@given(deterministic_trees())
def test_tensorized_tree_has_ancestor_mask_depth_positions_and_valid_path_rows(tree: DraftTree) -> None:
    check_layout(tree)


def test_hand_tree_layout_matches_seed_001_definitions() -> None:
    # root -> 0 -> 2, root -> 1 -> {0, 3}
    tree = DraftTree.from_paths([(0, 2), (1, 0), (1, 3)], lambda prefix: [0.25] * 4)
    layout = tensorize(tree)
    assert tree.tokens == (-1, 0, 2, 1, 0, 3)
    assert layout.positions.tolist() == [0, 1, 2, 1, 2, 2]
    assert layout.attention_mask.astype(int).tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 0, 0, 1, 0, 0],
        [1, 0, 0, 1, 1, 0],
        [1, 0, 0, 1, 0, 1],
    ]
    assert layout.path_matrix.tolist() == [[0, 1, 2], [0, 3, 4], [0, 3, 5]]


def test_root_only_tree_has_one_path_row_holding_the_root() -> None:
    layout = tensorize(DraftTree((-1,), (-1,), ((),), (None,), "deterministic"))
    assert layout.path_matrix.tolist() == [[0]]
    assert layout.attention_mask.tolist() == [[True]]


def test_tensorized_arrays_are_read_only() -> None:
    layout = tensorize(DraftTree.from_paths([(0, 1)], lambda prefix: [0.5, 0.5]))
    with pytest.raises(ValueError):
        layout.attention_mask[0, 1] = True


@pytest.mark.parametrize(
    "tokens,parents,match",
    [
        ((), (), "empty"),
        ((-1, 0), (-1,), "len\\(parents\\)=1"),
        ((-1, 0, 1), (-1, 2, 0), "parents\\[1\\]=2 must be an earlier node"),
        ((-1, 0), (0, 0), "parents\\[0\\]=0 must be -1"),
        ((-1, 0, 1), (-1, 0, 2), "parents\\[2\\]=2 must be an earlier node"),  # a self-loop (cycle)
    ],
)
def test_tensorize_structure_rejects_malformed_trees(tokens: Any, parents: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        tensorize_structure(tokens, parents)


def test_tensorize_rejects_a_non_tree() -> None:
    with pytest.raises(ValueError, match="tree must be a spec_ref.DraftTree"):
        tensorize(np.zeros(3))  # type: ignore[arg-type]
