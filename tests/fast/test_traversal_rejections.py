"""Traversal parity (spec_fast vs spec_ref, docs/testing.md section 4.3) on trees built to reject several
times at the same non-root node.

The seeded parity batches rarely reject twice at one node below the root, and at the root the weight update
``w <- Z / (Z + 1 - w)`` leaves ``w = 1`` unchanged, so a kernel that kept the old weight after a REJECT
passed them. Here the root's draft law is peaked (the root draws the same token several times: one child A
with many draws), the vocabulary is tiny (A's children cover most tokens) and the target is drawn
independently (low weights): A's updated weight then decides its later children and A's own test.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import spec_ref
from spec_fast import FlatTree, counter_uniforms, uniforms_per_node
from tests.fast.test_kernels_helpers import Batch, dyadic_probs, single_thread_torch
from tests.fast.test_kernels_parity import assert_parity

__all__ = ["single_thread_torch"]


def repeated_rejection_batch(rng: np.random.Generator, batch: int, vocab: int, draws: int, depth: int) -> Batch:
    trees, p_tables = [], []
    peaked_root = np.zeros(vocab)
    peaked_root[0] = 0.75  # vocab 3 or 5: every entry dyadic, so spec_ref does not renormalise
    peaked_root[1:] = 0.25 / (vocab - 1)
    for _ in range(batch):
        q_cache: dict[tuple[int, ...], np.ndarray] = {(): peaked_root}

        def q_of(prefix: tuple[int, ...]) -> np.ndarray:
            if prefix not in q_cache:
                q_cache[prefix] = dyadic_probs(rng, (vocab,), "dirichlet")
            return q_cache[prefix]

        paths = []
        for _ in range(draws):
            prefix: tuple[int, ...] = ()
            for _ in range(depth):
                prefix += (int(rng.choice(vocab, p=q_of(prefix))),)
            paths.append(prefix)
        tree = spec_ref.DraftTree.from_paths(paths, q_of)
        p_tables.append({tree.path_tokens(u): dyadic_probs(rng, (vocab,), "dirichlet") for u in range(tree.num_nodes)})
        trees.append(tree)
    n = max(t.num_nodes for t in trees)
    k = max(max(len(d) for d in t.draws) for t in trees)
    tokens = torch.full((batch, n), -1, dtype=torch.long)
    parents = torch.full((batch, n), -1, dtype=torch.long)
    depths = torch.full((batch, n), -1, dtype=torch.long)
    draw_t = torch.full((batch, n, k), -1, dtype=torch.long)
    valid = torch.zeros(batch, n, dtype=torch.bool)
    target = np.zeros((batch, n, vocab))
    draft = np.zeros((batch, n, vocab))
    for b, tree in enumerate(trees):
        for u in range(tree.num_nodes):
            tokens[b, u], parents[b, u], depths[b, u] = tree.tokens[u], tree.parents[u], tree.depths[u]
            if tree.draws[u]:
                draw_t[b, u, : len(tree.draws[u])] = torch.tensor(tree.draws[u])
                draft[b, u] = tree.draft_probs[u]
            else:
                draft[b, u] = np.full(vocab, 1.0 / vocab)
            target[b, u] = p_tables[b][tree.path_tokens(u)]
            valid[b, u] = True
        for u in range(tree.num_nodes, n):
            target[b, u] = draft[b, u] = np.full(vocab, 1.0 / vocab)
    return Batch(trees, target, draft, FlatTree(tokens, parents, depths, draw_t, valid))


@pytest.mark.parametrize("compact", [True, False], ids=["compact", "dense"])
@pytest.mark.parametrize("sibling_model", ["wor", "wr"])
def test_traversal_matches_spec_ref_when_a_node_rejects_several_children(sibling_model: str, compact: bool) -> None:
    options: dict[str, Any] = {"sibling_model": sibling_model}
    for seed, (vocab, draws, depth) in enumerate([(3, 6, 2), (5, 8, 3)]):
        batch = repeated_rejection_batch(np.random.default_rng(100 + seed), 48, vocab, draws, depth)
        m = uniforms_per_node("traversal", batch.flat.max_draws)
        uniforms = counter_uniforms(seed, 7, (48, batch.flat.num_slots, m))
        assert_parity(batch, "traversal", uniforms, compact, **options)
