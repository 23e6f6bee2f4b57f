"""Layer D (docs/testing.md section 4.4) for spec_fast: the torch Generator path of ``verify_tree`` has the exact law.

One fixed draft tree (V = 3, two i.i.d. paths of length 2, context-dependent tables) is replicated over
N = 2**18 rows and verified in one call with ``draw_uniforms(method, tree, generator)`` (``torch.rand``).
The expected law of the emitted block given this tree is computed exactly by ``spec_ref.exact_law`` over
``spec_ref.verify`` (Layer A; not from the code under test). Per configuration:

* D1 support: no emitted block outside the exact law's support (exact, no alpha);
* D2 Pearson chi-square of the emitted-block law, cells pooled to expected count >= 20,
  alpha = 1e-6 (``tests.stats.ALPHA``), power 0.99 (``tests.stats.POWER``) against the negative control;
* D3 the same for the law of tau.

Negative control (defined only here): the *parent-row mutant*, which hands every node the target row of its
parent (an off-by-one gather, docs/testing.md section 7). Its exact law comes from ``spec_ref.exact_law`` on the
shifted target model; the test asserts N * chi2(mutant || expected) >= required_noncentrality(df) and that
the same chi-square test rejects the mutant's samples.
"""

from __future__ import annotations

import zlib
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch

import spec_ref
from spec_fast import FlatTree, draw_uniforms, verify_tree
from tests.fast.test_kernels_helpers import single_thread_torch, dyadic_probs
from tests.stats import ALPHA, POWER, chi2_gof, noncentrality, required_noncentrality

N = 2**18
VOCAB = 3
CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("naive_tree", {}), ("nss", {}), ("spectr", {}), ("specinfer", {}), ("specinfer", {"specinfer_order": "draw"}),
    ("khisti", {}), ("naive", {}), ("bv", {}), ("tree_mc", {}), ("traversal", {}), ("traversal", {"sibling_model": "wr"}),
]
IDS = [m + "".join(f"-{v}" for v in o.values()) for m, o in CONFIGS]


def _fixed_tree() -> tuple[spec_ref.DraftTree, dict[tuple[int, ...], np.ndarray]]:
    rng = np.random.default_rng(zlib.crc32(b"spec_fast statistical tree"))
    draft_tables: dict[tuple[int, ...], np.ndarray] = {}

    def draft_model(prefix: tuple[int, ...]) -> np.ndarray:
        if prefix not in draft_tables:
            draft_tables[prefix] = dyadic_probs(rng, (VOCAB,))
        return draft_tables[prefix]

    # paths chosen so that the root has a duplicate-free pair and one child repeats below
    tree = spec_ref.DraftTree.from_paths([(0, 1), (2, 1), (0, 2)], draft_model)
    target = {tree.path_tokens(u): dyadic_probs(rng, (VOCAB,), "peaked") for u in range(tree.num_nodes)}
    return tree, target


def _flat(tree: spec_ref.DraftTree, rows: int) -> FlatTree:
    n = tree.num_nodes
    k = max(len(d) for d in tree.draws)
    draws = torch.full((n, k), -1, dtype=torch.long)
    for u in range(n):
        draws[u, : len(tree.draws[u])] = torch.tensor(tree.draws[u], dtype=torch.long)

    def rep(t: torch.Tensor) -> torch.Tensor:
        return t.unsqueeze(0).expand(rows, *t.shape).contiguous()

    return FlatTree(
        rep(torch.tensor(tree.tokens)), rep(torch.tensor(tree.parents)), rep(torch.tensor(tree.depths)),
        rep(draws), rep(torch.ones(n, dtype=torch.bool)),
    )


def _tables(tree: spec_ref.DraftTree, target: dict[tuple[int, ...], np.ndarray], shift: bool) -> tuple[np.ndarray, np.ndarray]:
    n = tree.num_nodes
    p = np.stack([target[tree.path_tokens(tree.parents[u] if shift and u > 0 else u)] for u in range(n)])
    q = np.stack([tree.draft_probs[u] if tree.draft_probs[u] is not None else p[u] for u in range(n)])
    return p, q


def _exact_law(tree: spec_ref.DraftTree, p: np.ndarray, method: str, options: dict[str, Any]) -> dict[tuple[int, ...], float]:
    table = {tree.path_tokens(u): p[u] for u in range(tree.num_nodes)}
    law = spec_ref.exact_law(lambda rng: spec_ref.verify(tree, lambda pre: table[tuple(pre)], method, rng, **options).tokens)
    return {tuple(k): float(v) for k, v in law.items()}  # type: ignore[arg-type]


def _sample(tree: spec_ref.DraftTree, p: np.ndarray, q: np.ndarray, method: str, options: dict[str, Any], seed: int) -> Counter[tuple[int, ...]]:
    flat = _flat(tree, N)
    target = torch.from_numpy(p).to(torch.float32).unsqueeze(0).expand(N, -1, -1).contiguous()
    draft = torch.from_numpy(q).to(torch.float32).unsqueeze(0).expand(N, -1, -1).contiguous()
    generator = torch.Generator().manual_seed(seed)
    uniforms = draw_uniforms(method, flat, generator, **options)
    out = verify_tree(method, flat, target, draft, uniforms, **options)
    emitted = out.emitted.tolist()
    taus = out.accepted_depth.tolist()
    return Counter(tuple(emitted[b][: taus[b] + 1]) for b in range(N))


def _cells(law: dict[tuple[int, ...], float], counts: Counter[tuple[int, ...]]) -> tuple[list[tuple[int, ...]], np.ndarray, np.ndarray]:
    keys = sorted(set(law) | set(counts))
    return keys, np.array([counts.get(k, 0) for k in keys], dtype=float), np.array([law.get(k, 0.0) for k in keys])


def _tau_law(law: dict[tuple[int, ...], float]) -> np.ndarray:
    out = np.zeros(4)
    for block, mass in law.items():
        out[len(block) - 1] += mass
    return out


@pytest.mark.statistical
@pytest.mark.parametrize(("method", "options"), CONFIGS, ids=IDS)
def test_generator_path_has_the_exact_block_law_and_rejects_the_parent_row_mutant(method: str, options: dict[str, Any]) -> None:
    tree, target = _fixed_tree()
    p, q = _tables(tree, target, shift=False)
    expected = _exact_law(tree, p, method, options)
    seed = zlib.crc32(f"{method}{options}".encode())
    counts = _sample(tree, p, q, method, options, seed)
    keys, observed, probs = _cells(expected, counts)
    result = chi2_gof(observed, probs, ALPHA)
    assert not result.support_violations, [keys[i] for i in result.support_violations]  # D1
    assert not result.rejected, (method, result)  # D2
    tau_counts = np.zeros(4)
    for block, c in counts.items():
        tau_counts[len(block) - 1] += c
    assert not chi2_gof(tau_counts, _tau_law(expected), ALPHA).rejected  # D3

    # negative control: the parent-row mutant, with its exact law for the power certificate
    p_mutant, _ = _tables(tree, target, shift=True)
    mutant_law = _exact_law(tree, p_mutant, method, options)
    keys_m = sorted(set(expected) | set(mutant_law))
    mutant_vec = np.array([mutant_law.get(k, 0.0) for k in keys_m])
    expected_vec = np.array([expected.get(k, 0.0) for k in keys_m])
    if (mutant_vec[expected_vec == 0] > 0).any():
        lam, df = float("inf"), 1  # the mutant puts mass outside the support: D1 rejects it surely
    else:
        lam, df = noncentrality(N, mutant_vec, expected_vec)
    assert lam >= required_noncentrality(df, ALPHA, POWER), (method, lam, df)
    mutant_counts = _sample(tree, p_mutant, q, method, options, seed + 1)
    _, observed_m, probs_m = _cells(expected, mutant_counts)
    assert chi2_gof(observed_m, probs_m, ALPHA).rejected


__all__ = ["single_thread_torch"]  # the module-scoped one-thread fixture is used via autouse
