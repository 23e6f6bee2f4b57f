"""Tensorisation of a draft tree for one verifier pass (seed 001 (docs/papers.md) sections 4.1-4.4).

One packed sequence of the N tree nodes (node 0 is the root: in the dual-draft seeds the root token
s_{t+1}; in :class:`~spec_ref.tree.DraftTree` terms the context whose next token is being decided):

* node order: the tree's own order, which lists ancestors first (``parents[i] < i``);
* ``parents [N]``: parent pointers (root: -1);
* ``positions [N]``: depth positions ``pos(0) = 0``, ``pos(i) = pos(parent(i)) + 1`` (seed 001 4.3; the
  verifier adds the prefix length t to get absolute positions);
* ``attention_mask [N, N]`` (bool): ``mask[i, j] = j in Anc(i)``, the ancestor-or-self set
  ``{i, parent(i), parent(parent(i)), ..., 0}`` (seed 001 4.2);
* ``path_matrix [P, D]`` (int64): one row per leaf (leaves in increasing node index), the node indices of
  the root-to-leaf path starting with 0, padded with -1; ``D = max depth + 1`` (seed 001 4.4).

All arrays are read-only NumPy arrays.

Theorem: proofs/T07_merge_and_greedy.md (mask and positions give each node its path's context).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from spec_ref.tree import DraftTree

__all__ = ["TensorizedTree", "tensorize", "tensorize_structure"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, eq=False)
class TensorizedTree:
    """The verifier-pass layout of one tree (module docstring). Arrays are read-only.

    ``tokens [N]`` (root: -1), ``parents [N]`` (root: -1), ``positions [N]``, ``attention_mask [N, N]``,
    ``path_matrix [P, D]`` (-1 padded), ``leaves [P]`` (the leaf ending each row).
    """

    tokens: IntArray
    parents: IntArray
    positions: IntArray
    attention_mask: BoolArray
    path_matrix: IntArray
    leaves: IntArray

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.shape[0])


def _frozen(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    array.flags.writeable = False
    return array


def tensorize_structure(tokens: Sequence[int], parents: Sequence[int]) -> TensorizedTree:
    """Tensorise any ancestors-first tree given by ``tokens [N]`` and ``parents [N]``.

    Unlike :class:`DraftTree` this does not require children merged by token, so it also serves the
    merged dual-draft tree of :mod:`spec_ref.dual`, whose two subtrees may repeat a token under the root.
    Raises ``ValueError`` for an empty tree, mismatched lengths, or a parent that is not an earlier node.
    """
    n = len(tokens)
    if n == 0:
        raise ValueError("tokens=() is empty: a tree needs at least its root")
    if len(parents) != n:
        raise ValueError(f"len(parents)={len(parents)} must equal len(tokens)={n}")
    if int(parents[0]) != -1:
        raise ValueError(f"parents[0]={parents[0]} must be -1 (node 0 is the root)")
    parent_array = np.asarray([int(p) for p in parents], dtype=np.int64)
    for i in range(1, n):
        if not 0 <= parent_array[i] < i:
            raise ValueError(f"parents[{i}]={parent_array[i]} must be an earlier node (0 <= parent < {i})")
    positions = np.zeros(n, dtype=np.int64)
    mask = np.zeros((n, n), dtype=np.bool_)
    mask[0, 0] = True
    has_child = np.zeros(n, dtype=np.bool_)
    for i in range(1, n):
        parent = parent_array[i]
        positions[i] = positions[parent] + 1
        mask[i] = mask[parent]
        mask[i, i] = True
        has_child[parent] = True
    leaves = np.flatnonzero(~has_child).astype(np.int64)
    width = int(positions.max()) + 1
    paths = np.full((leaves.shape[0], width), -1, dtype=np.int64)
    for row, leaf in enumerate(leaves):
        chain = np.flatnonzero(mask[leaf])  # ancestors-first order == increasing index == root to leaf
        paths[row, : chain.shape[0]] = chain
    return TensorizedTree(
        tokens=_frozen(np.asarray([int(t) for t in tokens], dtype=np.int64)),
        parents=_frozen(parent_array),
        positions=_frozen(positions),
        attention_mask=_frozen(mask),
        path_matrix=_frozen(paths),
        leaves=_frozen(leaves),
    )


def tensorize(tree: DraftTree) -> TensorizedTree:
    """The one-pass verifier layout of ``tree`` (module docstring)."""
    if not isinstance(tree, DraftTree):
        raise ValueError(f"tree must be a spec_ref.DraftTree, got {type(tree).__name__}")
    return tensorize_structure(tree.tokens, tree.parents)
