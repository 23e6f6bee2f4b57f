"""Layer C (docs/testing.md section 4.3): every spec_fast verifier equals spec_ref draw for draw with replayed uniforms.

For each method the same ``[B, N, M]`` uniforms drive ``spec_fast.verify_tree`` and, row by row,
``spec_ref.verify(tree, target_model, method, NodeReplaySource(uniforms[b]))``. Probabilities are dyadic
(multiples of 2**-20) so that spec_ref's renormalisation is the identity; the only rows allowed to differ
are those whose reference outcome moves when the row's uniforms move by 1e-5 (a uniform within float
tolerance of a threshold). Their number is bounded by max(1, 0.1% of the rows) and they are listed.
Both execution modes are checked: ``compact=True`` (row compaction, the CPU default) and
``compact=False`` (fixed-bound masked loops, the device default).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import spec_ref
from spec_fast import FlatTree, counter_uniforms, uniforms_per_node, verify_tree
from spec_fast.verify import METHODS, child_slots
from tests.fast.test_kernels_helpers import single_thread_torch, Batch, dyadic_probs, fast_rows, near_threshold, random_batch, reference_rows

#: (method, options) pairs covering every method and every option value.
CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("naive_tree", {}),
    ("nss", {}),
    ("spectr", {}),
    ("spectr", {"spectr_iterations": 6}),
    ("specinfer", {}),
    ("specinfer", {"specinfer_order": "draw"}),
    ("khisti", {}),
    ("khisti", {"khisti_truncation": 2}),
    ("naive", {}),
    ("bv", {}),
    ("tree_mc", {}),
    ("traversal", {}),
    ("traversal", {"sibling_model": "wr"}),
    ("greedy", {}),
    ("dynatree", {}),
]
IDS = [m + "".join(f"-{v}" for v in o.values()) for m, o in CONFIGS]


def assert_parity(batch: Batch, method: str, uniforms: torch.Tensor, compact: bool, **options: Any) -> None:
    target, draft = batch.tensors()
    out = verify_tree(method, batch.flat, target, draft, uniforms, compact=compact, **options)
    got = fast_rows(out.emitted, out.accepted_depth)
    expected = reference_rows(batch, method, uniforms, **options)
    mismatched = [b for b in range(len(got)) if got[b] != expected[b]]
    unexplained = [b for b in mismatched if not near_threshold(batch, method, uniforms, b, **options)]
    report = [(b, expected[b], got[b]) for b in mismatched]
    assert not unexplained, f"{method} {options}: rows differ away from any threshold: {report}"
    assert len(mismatched) <= max(1, len(got) // 1000), f"{method}: too many near-threshold rows: {report}"
    # the structured outputs agree with the emitted block
    for b, row in enumerate(got):
        tau = int(out.accepted_depth[b])
        assert int(out.next_token[b]) == row[-1]
        assert int(out.accepted_slots[b, tau]) == int(out.accepted_node[b])
        assert (out.accepted_slots[b, tau + 1 :] == -1).all() and (out.emitted[b, tau + 1 :] == -1).all()


@pytest.mark.parametrize("compact", [True, False], ids=["compact", "dense"])
@pytest.mark.parametrize(("method", "options"), CONFIGS, ids=IDS)
def test_every_verifier_matches_spec_ref_row_for_row_on_seeded_batches(method: str, options: dict[str, Any], compact: bool) -> None:
    rng = np.random.default_rng(1000 + METHODS.index(method))
    for round_index, (vocab, paths, depth, family, equal_rate) in enumerate(
        [(5, 3, 3, "dirichlet", 0.0), (4, 2, 4, "peaked", 0.3), (7, 4, 2, "sparse", 0.1)]
    ):
        batch = random_batch(rng, 24, vocab, paths, depth, family, equal_rate)
        m = uniforms_per_node(method, batch.flat.max_draws, **options)
        uniforms = counter_uniforms(round_index, 17, (24, batch.flat.num_slots, m))
        assert_parity(batch, method, uniforms, compact, **options)


@settings(max_examples=12)
@given(
    config=st.sampled_from(CONFIGS),
    seed=st.integers(0, 2**32 - 1),
    vocab=st.integers(2, 6),
    paths=st.integers(1, 3),
    depth=st.integers(0, 3),
    family=st.sampled_from(["dirichlet", "peaked", "sparse"]),
    equal_rate=st.sampled_from([0.0, 0.5, 1.0]),
    compact=st.booleans(),
)
def test_hypothesis_configurations_match_spec_ref_row_for_row(
    config: tuple[str, dict[str, Any]], seed: int, vocab: int, paths: int, depth: int, family: str,
    equal_rate: float, compact: bool,
) -> None:
    method, options = config
    rng = np.random.default_rng(seed)
    batch = random_batch(rng, 6, vocab, paths, depth, family, equal_rate)
    m = uniforms_per_node(method, batch.flat.max_draws, **options)
    uniforms = counter_uniforms(seed, 0, (6, batch.flat.num_slots, m))
    assert_parity(batch, method, uniforms, compact, **options)


@pytest.mark.parametrize(("method", "options"), CONFIGS, ids=IDS)
def test_extreme_uniforms_zero_and_just_below_one_match_spec_ref(method: str, options: dict[str, Any]) -> None:
    rng = np.random.default_rng(7)
    batch = random_batch(rng, 16, 4, 3, 3, "sparse", 0.3)
    m = uniforms_per_node(method, batch.flat.max_draws, **options)
    for value in (0.0, 1.0 - 2.0**-24):
        uniforms = torch.full((16, batch.flat.num_slots, m), value, dtype=torch.float32)
        assert_parity(batch, method, uniforms, True, **options)


def _single_node_batch(target: np.ndarray, draft: np.ndarray, draws: list[int]) -> Batch:
    """One root with the given draws (children are leaves whose target is the root's)."""
    tree = spec_ref.DraftTree.from_paths([[t] for t in draws], lambda prefix: draft)
    n = tree.num_nodes
    tgt = np.stack([target] * n)[None]
    dft = np.stack([draft] * n)[None]
    k = len(draws)
    tokens = torch.tensor([tree.tokens]); parents = torch.tensor([tree.parents]); depths = torch.tensor([tree.depths])
    dr = torch.full((1, n, k), -1, dtype=torch.long)
    for u in range(n):
        dr[0, u, : len(tree.draws[u])] = torch.tensor(tree.draws[u], dtype=torch.long)
    flat = FlatTree(tokens, parents, depths, dr, torch.ones(1, n, dtype=torch.bool))
    return Batch([tree], tgt, dft, flat)


@pytest.mark.parametrize(("method", "options"), CONFIGS[:8], ids=IDS[:8])
def test_target_equal_to_draft_uses_the_residual_fallback_like_spec_ref(method: str, options: dict[str, Any]) -> None:
    probs = dyadic_probs(np.random.default_rng(3), (5,))
    batch = _single_node_batch(probs, probs, [int(np.argmax(probs)), 1, int(np.argmax(probs))])
    m = uniforms_per_node(method, batch.flat.max_draws, **options)
    for seed in range(20):
        assert_parity(batch, method, counter_uniforms(seed, 0, (1, batch.flat.num_slots, m)), True, **options)


@pytest.mark.parametrize(("method", "options"), CONFIGS[:8], ids=IDS[:8])
def test_disjoint_supports_never_accept_and_match_spec_ref(method: str, options: dict[str, Any]) -> None:
    target = np.array([0.5, 0.5, 0.0, 0.0])
    draft = np.array([0.0, 0.0, 0.25, 0.75])
    batch = _single_node_batch(target, draft, [2, 3, 3])
    m = uniforms_per_node(method, batch.flat.max_draws, **options)
    for seed in range(20):
        uniforms = counter_uniforms(seed, 0, (1, batch.flat.num_slots, m))
        assert_parity(batch, method, uniforms, seed % 2 == 0, **options)
        target_t, draft_t = batch.tensors()
        out = verify_tree(method, batch.flat, target_t, draft_t, uniforms, **options)
        assert int(out.accepted_depth[0]) == 0 and int(out.next_token[0]) in (0, 1)


def test_greedy_follows_the_argmax_with_the_lowest_id_on_ties() -> None:
    batch = _single_node_batch(np.array([0.4, 0.4, 0.2]), np.array([0.2, 0.4, 0.4]), [1, 0])
    target, draft = batch.tensors()
    out = verify_tree("greedy", batch.flat, target, draft, torch.zeros(1, batch.flat.num_slots, 0))
    assert out.emitted[0].tolist()[:2] == [0, 0]  # argmax ties -> token 0, which is a child; bonus argmax 0


def test_deterministic_trees_are_refused_for_sampling_verifiers_but_nss_runs() -> None:
    batch = _single_node_batch(np.array([0.5, 0.25, 0.25]), np.array([0.5, 0.25, 0.25]), [0, 1])
    flat = batch.flat
    det = FlatTree(flat.tokens, flat.parents, flat.depths, flat.draws, flat.valid, "deterministic")
    target, draft = batch.tensors()
    with pytest.raises(ValueError, match="deterministic"):
        verify_tree("naive_tree", det, target, draft, torch.zeros(1, flat.num_slots, 2))
    out = verify_tree("nss", det, target, draft, torch.full((1, flat.num_slots, 1), 0.1))
    assert int(out.accepted_depth[0]) == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"method": "bogus"}, "method"),
        ({"spectr_iterations": 0, "method": "spectr"}, "spectr_iterations"),
        ({"sibling_model": "x", "method": "traversal"}, "sibling_model"),
        ({"specinfer_order": "x", "method": "specinfer"}, "specinfer_order"),
        ({"unknown": 1, "method": "nss"}, "unknown"),
    ],
)
def test_bad_methods_and_options_raise_value_error_naming_them(kwargs: dict[str, Any], message: str) -> None:
    batch = _single_node_batch(np.array([0.5, 0.5]), np.array([0.5, 0.5]), [0])
    target, draft = batch.tensors()
    uniforms = torch.zeros(1, batch.flat.num_slots, 8)
    with pytest.raises(ValueError, match=message):
        verify_tree(tree=batch.flat, target_probs=target, draft_probs=draft, uniforms=uniforms, **kwargs)


def test_bad_shapes_raise_value_error_naming_the_argument() -> None:
    batch = _single_node_batch(np.array([0.5, 0.5]), np.array([0.5, 0.5]), [0])
    target, draft = batch.tensors()
    with pytest.raises(ValueError, match="uniforms.shape"):
        verify_tree("naive_tree", batch.flat, target, draft, torch.zeros(1, batch.flat.num_slots, 1))
    with pytest.raises(ValueError, match="draft_probs.shape"):
        verify_tree("naive_tree", batch.flat, target, draft[:, :, :1], torch.zeros(1, batch.flat.num_slots, 2))


def test_child_slots_point_every_draw_at_its_merged_child() -> None:
    batch = random_batch(np.random.default_rng(5), 8, 3, 4, 3)
    children = child_slots(batch.flat)
    for b, tree in enumerate(batch.trees):
        for u in range(tree.num_nodes):
            for j, token in enumerate(tree.draws[u]):
                assert int(children[b, u, j]) == tree.child(u, token)


@pytest.mark.parametrize("method", ["naive_tree", "spectr", "bv", "traversal"])
def test_float32_probabilities_at_a_large_vocabulary_match_up_to_near_threshold_rows(method: str) -> None:
    """Non-dyadic float32 softmax probabilities (V = 9000): spec_ref renormalises them, so a few rows may
    sit within rounding of a threshold; all others must match exactly. V = 9000 uses the two-level inverse CDF."""
    rng = np.random.default_rng(11)
    batch = random_batch(rng, 12, 9000, 2, 2)
    logits = torch.from_numpy(rng.normal(size=batch.target.shape) * 3).to(torch.float32)
    batch.target = torch.softmax(logits, dim=-1).to(torch.float64).numpy()
    # keep q as drawn (the draws came from it); p is the float32 softmax, handed to spec_ref in float64
    m = uniforms_per_node(method, batch.flat.max_draws)
    assert_parity(batch, method, counter_uniforms(99, 0, (12, batch.flat.num_slots, m)), True)


__all__ = ["single_thread_torch"]  # the module-scoped one-thread fixture is used via autouse


@pytest.mark.parametrize("vocab", [8191, 8192, 8193, 20000])
def test_two_level_inverse_cdf_equals_the_reference_rule_and_never_returns_a_zero_weight(vocab: int) -> None:
    """Vocabularies around and above the chunked threshold (chunk 1024): the index equals
    spec_ref.inverse_cdf except where u * total lies within 1e-6 of a partial sum; zero weights never win."""
    from spec_fast._sampling import _inverse_cdf

    gen = torch.Generator().manual_seed(vocab)
    weights = torch.rand(64, vocab, generator=gen) ** 4
    weights[weights < 0.3] = 0.0  # many zero-weight cells, including whole runs
    weights[:, -1] = 0.0
    u = torch.rand(64, generator=gen)
    u[0], u[1] = 0.0, 1.0 - 2.0**-24
    got = _inverse_cdf(weights, u)
    assert bool((weights.gather(1, got.unsqueeze(1)) > 0).all())
    w64 = weights.to(torch.float64).numpy()
    for b in range(64):
        expected = spec_ref.inverse_cdf(w64[b], float(u[b]))
        if int(got[b]) != expected:
            cumulative = np.cumsum(w64[b])
            threshold = float(u[b]) * cumulative[-1]
            gap = np.abs(cumulative[min(int(got[b]), expected) : max(int(got[b]), expected) + 1] - threshold).min()
            assert gap < 1e-6 * cumulative[-1], (b, int(got[b]), expected)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(("method", "options"), CONFIGS, ids=IDS)
def test_cuda_device_path_equals_the_cpu_path_row_for_row(method: str, options: dict[str, Any]) -> None:
    """docs/testing.md section 4.3 (C2): the fixed-bound masked (device) path on CUDA returns the CPU tokens."""
    batch = random_batch(np.random.default_rng(21), 32, 6, 3, 3, "dirichlet", 0.2)
    target, draft = batch.tensors()
    m = uniforms_per_node(method, batch.flat.max_draws, **options)
    uniforms = counter_uniforms(5, 0, (32, batch.flat.num_slots, m))
    cpu = verify_tree(method, batch.flat, target, draft, uniforms, **options)
    gpu = verify_tree(method, batch.flat.to("cuda"), target.cuda(), draft.cuda(), uniforms.cuda(), **options)
    assert torch.equal(cpu.emitted, gpu.emitted.cpu())


@pytest.mark.parametrize("method", METHODS)
def test_lone_roots_with_no_draw_column_emit_one_token_from_the_target(method: str) -> None:
    """A batch whose FlatTree has K = 0 (``draws [B, 1, 0]``) still verifies: tau = 0 and the bonus ~ p_root."""
    flat = FlatTree(torch.full((2, 1), -1), torch.full((2, 1), -1), torch.zeros(2, 1, dtype=torch.long),
                    torch.zeros(2, 1, 0, dtype=torch.long), torch.ones(2, 1, dtype=torch.bool))
    target = torch.tensor([[[0.0, 1.0, 0.0]], [[0.0, 0.0, 1.0]]])
    uniforms = torch.full((2, 1, uniforms_per_node(method, 0)), 0.5)
    out = verify_tree(method, flat, target, target, uniforms)
    assert out.accepted_depth.tolist() == [0, 0] and out.next_token.tolist() == [1, 2]
