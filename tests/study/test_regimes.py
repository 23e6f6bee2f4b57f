"""The controlled draft family (spec_ref.controlled_draft) and the regimes study (bench/study_regimes.py).

* both mixtures' acceptance is exactly 1 - TV(p, q) = 1 - eps TV(p, r) (Fractions); the rank version keeps
  p's support and masses;
* the K = 1 reductions hold on its drafts: SpecTr, SpecInfer, Khisti and NaiveTree equal naive, Traversal
  equals BV (exact, Traversal by enumeration of its random draws);
* BV >= naive at every root, in expectation over the drafted chain (every chain enumerated, exact);
* the study's exact vocabulary reduction and its Traversal depth law equal spec_ref on the full vocabulary;
* the ``--quick`` grid runs end to end and its rows satisfy the K = 1 reductions.
"""

from __future__ import annotations

import itertools
import json
import os
from fractions import Fraction

import numpy as np
import pytest

from bench.regimes_eval import action_draws, ot_depth_mass, reduce_pair, traversal_depth_law, tree_of
from spec_fast.nde.selector_data import DelayedDraws
from spec_ref.controlled_draft import (
    acceptance,
    mixture_acceptance,
    permuted_mixture,
    rank_permuted,
    rank_permuted_mixture,
    solve_strength,
    total_variation,
    vocab_permutation,
)
from spec_ref.drafting import _assemble
from spec_ref.efficiency import exact_block_efficiency, expected_block_efficiency
from spec_ref.tree import DraftTree

V = 6


def fraction_law(seed: int, zeros: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    weights = [int(w) for w in rng.integers(1, 9, V)]
    for i in rng.choice(V, zeros, replace=False):
        weights[int(i)] = 0
    total = sum(weights)
    return np.array([Fraction(w, total) for w in weights], dtype=object)


SIGMA = vocab_permutation(V, 7)


def target(prefix: tuple[int, ...]) -> np.ndarray:
    return fraction_law(1000 + hash(prefix) % 997, zeros=len(prefix) % 3)


def draft(eps: Fraction, family: str = "rank"):
    if family == "rank":
        return lambda prefix: rank_permuted_mixture(target(prefix), eps, 5)
    return lambda prefix: permuted_mixture(target(prefix), eps, SIGMA)


@pytest.mark.parametrize("eps", [Fraction(0), Fraction(1, 3), Fraction(7, 10), Fraction(1)])
@pytest.mark.parametrize("seed", range(4))
def test_acceptance_is_one_minus_tv_exactly(seed: int, eps: Fraction) -> None:
    p = fraction_law(seed, zeros=seed % 3)
    q = permuted_mixture(p, eps, SIGMA)
    assert sum(q) == 1 and all(v >= 0 for v in q)
    assert acceptance(p, q) == 1 - total_variation(p, q) == mixture_acceptance(p, eps, SIGMA)
    assert mixture_acceptance(p, eps, SIGMA) == 1 - eps * total_variation(p, p[SIGMA])
    if eps == 0:
        assert list(q) == list(p) and acceptance(p, q) == 1


@pytest.mark.parametrize("eps", [Fraction(0), Fraction(2, 5), Fraction(1)])
@pytest.mark.parametrize("seed", range(4))
def test_rank_permuted_mixture_keeps_the_support_and_its_acceptance_is_one_minus_tv(seed: int, eps: Fraction) -> None:
    p = fraction_law(seed, zeros=seed % 3)
    r = rank_permuted(p, seed)
    assert sorted(r) == sorted(p) and [v > 0 for v in r] == [v > 0 for v in p]
    q = rank_permuted_mixture(p, eps, seed)
    assert acceptance(p, q) == 1 - total_variation(p, q) == 1 - eps * total_variation(p, r)


def test_the_study_hot_path_equals_the_family() -> None:
    from bench.study_regimes import rank_permuted_fast

    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(50) * 0.2)
    p[rng.choice(50, 10, replace=False)] = 0
    p /= p.sum()
    np.testing.assert_allclose(rank_permuted_fast(p, 0.37, 3), rank_permuted_mixture(p, 0.37, 3), rtol=0, atol=1e-15)
    assert sorted(vocab_permutation(50, 3).tolist()) == list(range(50))
    assert vocab_permutation(50, 3).tolist() == vocab_permutation(50, 3).tolist()  # seeded


def test_solve_strength_hits_reachable_targets_and_reports_unreachable_ones() -> None:
    solved = solve_strength([0.9, 0.7, 0.8], 0.6)
    assert solved.eps == pytest.approx(0.5) and solved.achieved_acceptance == pytest.approx(0.6)
    clipped = solve_strength([0.5, 0.5], 0.3)
    assert clipped.eps == 1.0 and clipped.achieved_acceptance == pytest.approx(0.5)


@pytest.mark.parametrize("call, name", [
    (lambda: permuted_mixture([0.5, 0.5], 1.5, [1, 0]), "eps"),
    (lambda: permuted_mixture([0.5, 0.5], 0.5, [0, 0]), "sigma"),
    (lambda: solve_strength([], 0.5), "distances"),
    (lambda: solve_strength([0.5], 1.5), "target_acceptance"),
    (lambda: vocab_permutation(0, 1), "vocab_size"),
])
def test_bad_arguments_name_themselves(call, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        call()


def chain(tokens: tuple[int, ...], q_model) -> DraftTree:
    draws = {tokens[:j]: [tokens[j]] for j in range(len(tokens))}
    draws[tokens] = []
    return _assemble(draws, {pre: q_model(pre) for pre in draws if draws[pre]}, "iid")


@pytest.mark.parametrize("family", ["rank", "vocab"])
@pytest.mark.parametrize("eps", [Fraction(1, 4), Fraction(3, 4)])
def test_k1_reductions_on_controlled_drafts(eps: Fraction, family: str) -> None:
    q_model = draft(eps, family)
    for tokens in [(0, 1), (2, 2), (3, 5, 1)]:
        if any(q_model(tokens[:j])[tokens[j]] == 0 for j in range(len(tokens))):
            continue
        tree = chain(tokens, q_model)
        naive = expected_block_efficiency(tree, target, "naive")
        for method in ("naive_tree", "spectr", "specinfer", "khisti"):
            assert expected_block_efficiency(tree, target, method) == naive, method
        assert exact_block_efficiency(tree, target, "traversal") == expected_block_efficiency(tree, target, "bv")


@pytest.mark.parametrize("family", ["rank", "vocab"])
@pytest.mark.parametrize("eps", [Fraction(1, 5), Fraction(1, 2), Fraction(1)])
def test_bv_is_at_least_naive_at_every_root_over_the_drafted_chain(eps: Fraction, family: str) -> None:
    q_model = draft(eps, family)
    for length in (1, 2):
        totals = {"bv": Fraction(0), "naive": Fraction(0)}
        for tokens in itertools.product(range(V), repeat=length):
            weight = Fraction(1)
            for j in range(length):
                weight *= q_model(tokens[:j])[tokens[j]]
            if weight == 0:
                continue
            tree = chain(tokens, q_model)
            for method in totals:
                totals[method] += weight * expected_block_efficiency(tree, target, method)
        assert totals["bv"] >= totals["naive"]


def shared_draw(eps: float, seed: int, family: str) -> tuple[DelayedDraws, dict]:
    rng = np.random.default_rng(seed)

    def p_of(prefix):
        return np.asarray(target(prefix), dtype=np.float64)

    def q_of(prefix):
        if family == "rank":
            return rank_permuted_mixture(p_of(prefix), eps, 2)
        return permuted_mixture(p_of(prefix), eps, SIGMA)

    def sample(prefix, n):
        out = []
        for _ in range(n):
            out.append(int(rng.choice(V, p=q_of(prefix + tuple(out)))))
        return tuple(out)

    spine = sample((), 3)
    extra = tuple(tuple(sample(spine[:l1], 2) for _ in range(2)) for l1 in range(2))
    draws = DelayedDraws(spine, extra, 3, 1, 2)
    laws = {}
    for k in range(1, 4):
        for l1 in range(2):
            for prefix in action_draws(draws, k, l1):
                laws[prefix] = reduce_pair(p_of(prefix), q_of(prefix))
    return draws, laws, p_of, q_of


@pytest.mark.parametrize("family", ["rank", "vocab"])
@pytest.mark.parametrize("seed", range(3))
def test_reduced_evaluation_equals_spec_ref_on_the_full_vocabulary(seed: int, family: str) -> None:
    draws, laws, p_of, q_of = shared_draw(0.6, seed, family)
    for k in range(1, 4):
        for l1 in range(2):
            tree_draws = action_draws(draws, k, l1)
            full = {pre: list(node) for pre, node in tree_draws.items()}
            for pre, node in tree_draws.items():
                for t in node:
                    full.setdefault(pre + (t,), [])
            tree = _assemble(full, {pre: q_of(pre) for pre in full if full[pre]}, "iid")
            for method in ("nss", "naive_tree", "spectr", "specinfer", "khisti"):
                mass = ot_depth_mass(tree_draws, laws, method)
                assert mass.sum() == pytest.approx(expected_block_efficiency(tree, p_of, method), abs=1e-12)
            law = traversal_depth_law(*tree_of(tree_draws, laws))
            reference = exact_block_efficiency(tree, p_of, "traversal")
            assert float((law * np.arange(1, law.size + 1)).sum()) == pytest.approx(float(reference), abs=1e-12)


def test_reduce_pair_keeps_the_support_and_the_lowest_zero_tokens() -> None:
    p = np.array([0, 0.5, 0, 0, 0.5, 0, 0, 0, 0, 0.0])
    q = np.array([0, 0, 0, 0.5, 0, 0, 0, 0, 0.5, 0.0])
    law = reduce_pair(p, q, pad=3)
    assert law.kept.tolist() == [0, 1, 2, 3, 4, 5, 8]


def test_quick_grid_runs_and_its_rows_reduce_at_k1(tmp_path) -> None:
    from bench.study_regimes import INDEX, main

    assert main(["--quick", "--out", str(tmp_path)]) == 0
    for name in ("rows.json", "rows.npz", "study_regimes.md", "study_regimes.json"):
        assert os.path.exists(tmp_path / name), name
    rows = np.load(tmp_path / "rows.npz")
    for length in range(1, 9):
        for method in ("naive_tree", "spectr", "specinfer", "khisti"):
            np.testing.assert_allclose(rows[f"be_{method}"][:, INDEX[(1, 0, length)]], rows["be_naive"][:, length], atol=1e-12)
        np.testing.assert_allclose(rows["be_traversal"][:, INDEX[(1, 0, length)]], rows["be_bv"][:, length], atol=1e-12)
    summary = json.loads((tmp_path / "study_regimes.json").read_text())
    assert set(summary["tables"]["be"]) == {"naive", "bv", "nss", "naive_tree", "spectr", "specinfer", "khisti", "traversal"}
    text = (tmp_path / "study_regimes.md").read_text()
    assert "Table 2 layout" in text and "Table 7 layout" in text
