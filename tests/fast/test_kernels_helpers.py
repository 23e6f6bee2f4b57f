"""Shared builders for the kernel tests (no tests here): random draft trees as both a batch of
:class:`spec_ref.DraftTree` and one :class:`spec_fast.FlatTree`, dyadic probabilities, and the
row-by-row comparison against :func:`spec_ref.verify` that tolerates only near-threshold rows."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

import spec_ref
from spec_fast.flat_tree import FlatTree

#: Dyadic resolution of test probabilities: every value is a multiple of 2**-20, exactly representable in
#: float32 and summing to exactly 1 in float64, so spec_ref's renormalisation is the identity.
DYADIC_BITS = 20


def dyadic_probs(rng: np.random.Generator, shape: tuple[int, ...], family: str = "dirichlet") -> np.ndarray:
    """Random probability vectors on the last axis, multiples of 2**-20 summing to 1 exactly."""
    vocab = shape[-1]
    if family == "peaked":
        raw = rng.dirichlet(np.full(vocab, 0.2), size=shape[:-1])
    elif family == "sparse":
        raw = rng.dirichlet(np.ones(vocab), size=shape[:-1]) * (rng.random(shape) < 0.6)
        raw[..., 0] += 1e-3
    else:
        raw = rng.dirichlet(np.ones(vocab), size=shape[:-1])
    raw = raw / raw.sum(axis=-1, keepdims=True)
    scale = 2**DYADIC_BITS
    counts = np.floor(raw * scale).astype(np.int64)
    deficit = scale - counts.sum(axis=-1)
    top = np.argmax(raw, axis=-1)
    np.put_along_axis(counts, top[..., None], np.take_along_axis(counts, top[..., None], -1) + deficit[..., None], -1)
    return counts.astype(np.float64) / scale


@dataclass
class Batch:
    trees: list[spec_ref.DraftTree]
    target: np.ndarray  # [B, N, V] float64 (dyadic), padded slots copy the root
    draft: np.ndarray  # [B, N, V]
    flat: FlatTree

    def target_model(self, b: int) -> Any:
        tree = self.trees[b]
        table = {tree.path_tokens(u): self.target[b, u] for u in range(tree.num_nodes)}
        return lambda prefix: table[tuple(prefix)]

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.from_numpy(self.target).to(torch.float32), torch.from_numpy(self.draft).to(torch.float32))


def random_batch(
    rng: np.random.Generator,
    batch: int,
    vocab: int,
    num_paths: int,
    depth: int,
    family: str = "dirichlet",
    target_equals_draft_rate: float = 0.0,
) -> Batch:
    """``batch`` merged trees of ``num_paths`` i.i.d. paths of length ``depth`` (lengths vary per row)."""
    trees = []
    q_tables = []
    p_tables = []
    for _ in range(batch):
        k = int(rng.integers(1, num_paths + 1))
        length = int(rng.integers(0, depth + 1))
        q_cache: dict[tuple[int, ...], np.ndarray] = {}
        p_cache: dict[tuple[int, ...], np.ndarray] = {}

        def q_of(prefix: tuple[int, ...]) -> np.ndarray:
            if prefix not in q_cache:
                q_cache[prefix] = dyadic_probs(rng, (vocab,), family)
            return q_cache[prefix]

        paths = []
        for _ in range(k):
            prefix: tuple[int, ...] = ()
            for _ in range(length):
                q = q_of(prefix)
                token = int(rng.choice(vocab, p=q))
                prefix = prefix + (token,)
            paths.append(prefix)
        tree = spec_ref.DraftTree.from_paths(paths, q_of)
        for u in range(tree.num_nodes):
            pre = tree.path_tokens(u)
            if rng.random() < target_equals_draft_rate and tree.draft_probs[u] is not None:
                p_cache[pre] = np.array(q_of(pre))
            else:
                p_cache[pre] = dyadic_probs(rng, (vocab,), family)
        trees.append(tree)
        q_tables.append(q_cache)
        p_tables.append(p_cache)
    n = max(t.num_nodes for t in trees)
    k_max = max(1, max(len(d) for t in trees for d in t.draws))
    tokens = np.full((batch, n), -1, dtype=np.int64)
    parents = np.full((batch, n), -1, dtype=np.int64)
    depths = np.full((batch, n), -1, dtype=np.int64)
    draws = np.full((batch, n, k_max), -1, dtype=np.int64)
    valid = np.zeros((batch, n), dtype=bool)
    target = np.zeros((batch, n, vocab))
    draft = np.zeros((batch, n, vocab))
    for b, tree in enumerate(trees):
        for u in range(tree.num_nodes):
            tokens[b, u] = tree.tokens[u]
            parents[b, u] = tree.parents[u]
            depths[b, u] = tree.depths[u]
            valid[b, u] = True
            draws[b, u, : len(tree.draws[u])] = tree.draws[u]
            target[b, u] = p_tables[b][tree.path_tokens(u)]
            q = tree.draft_probs[u]
            draft[b, u] = target[b, u] if q is None else q
        target[b, tree.num_nodes :] = target[b, 0]
        draft[b, tree.num_nodes :] = draft[b, 0]
    flat = FlatTree(
        torch.from_numpy(tokens), torch.from_numpy(parents), torch.from_numpy(depths),
        torch.from_numpy(draws), torch.from_numpy(valid),
    )
    return Batch(trees, target, draft, flat)


def reference_rows(batch: Batch, method: str, uniforms: torch.Tensor, **options: Any) -> list[tuple[int, ...]]:
    """spec_ref's emitted block per row with the same per-node uniforms."""
    out = []
    table = uniforms.to(torch.float64).numpy()
    for b, tree in enumerate(batch.trees):
        source = spec_ref.NodeReplaySource(table[b, : tree.num_nodes]) if table.shape[2] else None
        result = spec_ref.verify(tree, batch.target_model(b), method, source, **options)
        out.append(result.tokens)
    return out


def fast_rows(emitted: torch.Tensor, accepted_depth: torch.Tensor) -> list[tuple[int, ...]]:
    em = emitted.tolist()
    return [tuple(em[b][: int(t) + 1]) for b, t in enumerate(accepted_depth.tolist())]


def near_threshold(batch: Batch, method: str, uniforms: torch.Tensor, b: int, delta: float = 1e-5, **options: Any) -> bool:
    """Whether row b's reference outcome moves when every uniform of the row moves by +-delta."""
    tree = batch.trees[b]
    table = uniforms[b, : tree.num_nodes].to(torch.float64).numpy()
    base = spec_ref.verify(tree, batch.target_model(b), method, spec_ref.NodeReplaySource(table), **options).tokens
    for sign in (-1.0, 1.0):
        moved = np.clip(table + sign * delta, 0.0, np.nextafter(1.0, 0.0))
        other = spec_ref.verify(tree, batch.target_model(b), method, spec_ref.NodeReplaySource(moved), **options).tokens
        if other != base:
            return True
    return False


@pytest.fixture(autouse=True, scope="module")
def single_thread_torch() -> Iterator[None]:
    """Run torch on one intra-op thread for the module and restore the setting afterwards: on this shared
    2-core machine small batched ops are 10-40x slower with two contending OpenMP threads."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
