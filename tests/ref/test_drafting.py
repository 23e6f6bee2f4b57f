"""Drafting: delayed / i.i.d. trees (seed 002 (docs/papers.md) Def. 5.2) and budgeted top-k trees (seed 000 section 3).

Exact: the delayed tree's draw structure on every tree in its support, and its exact law under
``exact_law`` (each tree's probability is the product of q over its draws); the top-k tree's budget
selection against a brute-force full expansion (Hypothesis), its tie rule, and bad input.
"""

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
    ReplaySource,
    ScoredDraftTree,
    draft_delayed_tree,
    draft_iid_tree,
    draft_topk_tree,
    exact_law,
)
from spec_ref.drafting import ranked_tokens, tree_signature

F = Fraction


def context_table(seed: int, vocab: int, zeros: bool = True) -> Any:
    """A context-dependent exact draft model: every prefix gets its own integer-weight distribution."""

    def model(prefix: tuple[int, ...]) -> list[Fraction]:
        gen = np.random.default_rng([seed, len(prefix), *prefix])
        weights = [int(w) for w in gen.integers(0 if zeros else 1, 4, size=vocab)]
        if sum(weights) == 0:
            weights[int(gen.integers(vocab))] = 1
        return [F(w, sum(weights)) for w in weights]

    return model


def q_small(prefix: tuple[int, ...]) -> list[Fraction]:
    """V = 3, depends on the whole prefix (so a row mix-up changes the law)."""
    tables = [[F(1, 2), F(1, 3), F(1, 6)], [F(1, 5), F(3, 5), F(1, 5)], [F(1, 4), F(1, 4), F(1, 2)]]
    return tables[(len(prefix) + sum(prefix)) % 3]


def tree_probability(tree: DraftTree) -> Fraction:
    prob = F(1)
    for u in range(tree.num_nodes):
        q = tree.draft_probs[u]
        for x in tree.draws[u]:
            assert q is not None
            prob *= q[x]
    return prob


DELAYED_CASES = [(1, 2, 1), (2, 1, 2), (3, 0, 2), (2, 2, 0), (2, 0, 3), (1, 0, 3)]


@pytest.mark.parametrize("K,L1,L2", DELAYED_CASES)
def test_delayed_tree_law_is_the_product_of_q_over_its_draws(K: int, L1: int, L2: int) -> None:
    trees: dict[Any, DraftTree] = {}

    def run(rng: Any) -> Any:
        tree = draft_delayed_tree(q_small, K, L1, L2, rng)
        trees[tree_signature(tree)] = tree
        return tree_signature(tree)

    law = exact_law(run)
    assert sum(law.values()) == 1
    for signature, prob in law.items():
        assert prob == tree_probability(trees[signature])
    # one tree per draw sequence: the number of trees is V ** (L1 + K * L2)
    assert len(law) == 3 ** (L1 + K * L2)


@pytest.mark.parametrize("K,L1,L2", DELAYED_CASES)
def test_delayed_tree_draw_structure_has_trunk_one_branch_k_and_paths_below(K: int, L1: int, L2: int) -> None:
    def run(rng: Any) -> Any:
        return tree_signature(draft_delayed_tree(q_small, K, L1, L2, rng))

    for tokens, parents, draws in exact_law(run):
        tree = DraftTree(tokens, parents, draws, tuple(None if not d else q_small(()) for d in draws), "iid")
        for u in range(tree.num_nodes):
            depth = tree.depths[u]
            if depth < L1:
                assert len(draws[u]) == 1  # trunk: one draw
            elif depth == L1:
                assert len(draws[u]) == (K if L2 > 0 else 0)  # the branch node
            elif depth < L1 + L2:
                # below the branch node: one draw per branch through u = u's multiplicity at its parent
                assert len(draws[u]) == draws[parents[u]].count(tokens[u])
            else:
                assert draws[u] == ()
        assert tree.max_depth == L1 + (L2 if L2 > 0 else 0)


def test_delayed_tree_with_no_trunk_equals_the_merged_iid_paths() -> None:
    def run(rng: Any) -> Any:
        paths = [tuple(_walk(rng, 2)) for _ in range(3)]
        return tree_signature(DraftTree.from_paths(paths, q_small))

    def _walk(rng: Any, length: int) -> list[int]:
        prefix: list[int] = []
        for _ in range(length):
            prefix.append(rng.categorical(np.asarray(q_small(tuple(prefix)), dtype=object)))
        return prefix

    expected = exact_law(run)
    assert exact_law(lambda rng: tree_signature(draft_iid_tree(q_small, 3, 2, rng))) == expected
    assert exact_law(lambda rng: tree_signature(draft_delayed_tree(q_small, 3, 0, 2, rng))) == expected


def test_delayed_tree_consumes_exactly_l1_plus_k_times_l2_uniforms() -> None:
    source = ReplaySource(np.linspace(0.01, 0.99, 20))
    draft_delayed_tree(q_small, 3, 2, 4, source)
    assert source.consumed == 2 + 3 * 4


def test_delayed_tree_replays_hand_chosen_uniforms_token_by_token() -> None:
    # V = 3; q(()) = [1/2, 1/3, 1/6]: u = 0.6 -> token 1; q((1,)) = [1/4, 1/4, 1/2]: u = 0.1 -> 0, u = 0.9 -> 2
    tree = draft_delayed_tree(q_small, 2, 1, 1, ReplaySource([0.6, 0.1, 0.9]))
    assert tree.draws[0] == (1,)
    assert tree.draws[1] == (0, 2)
    assert tree.path_tokens(tree.child(1, 2) or -1) == (1, 2)


def test_delayed_tree_runs_on_the_float_generator_path() -> None:
    def q_float(prefix: tuple[int, ...]) -> list[float]:
        return [float(x) for x in q_small(prefix)]

    tree = draft_delayed_tree(q_float, 4, 2, 3, 7)
    assert tree.process == "iid" and tree.max_depth == 5
    assert len(tree.draws[tree.path_nodes(tree.leaves()[0])[2]]) == 4


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(K=0, L1=1, L2=1), "K must be an integer >= 1"),
        (dict(K=1.5, L1=1, L2=1), "K must be an integer"),
        (dict(K=2, L1=-1, L2=1), "L1 must be an integer >= 0"),
        (dict(K=2, L1=1, L2=-2), "L2 must be an integer >= 0"),
        (dict(K=True, L1=1, L2=1), "K must be an integer"),
    ],
)
def test_delayed_tree_rejects_bad_shape_parameters(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        draft_delayed_tree(q_small, rng=0, **kwargs)


def test_delayed_tree_rejects_a_model_that_is_not_a_distribution() -> None:
    with pytest.raises(ValueError, match=r"draft_model\(\(\)\) must sum to 1"):
        draft_delayed_tree(lambda prefix: [0.5, 0.2], 1, 1, 1, 0)
    with pytest.raises(ValueError, match="draft_model must be a function"):
        draft_delayed_tree([0.5, 0.5], 1, 1, 1, 0)  # type: ignore[arg-type]


def test_delayed_tree_rejects_a_model_whose_vocabulary_changes_with_the_context() -> None:
    with pytest.raises(ValueError, match="must be \\(3,\\)"):
        draft_delayed_tree(lambda prefix: [1.0, 0.0] if prefix else [0.0, 0.5, 0.5], 1, 2, 0, 0)


# ----- top-k trees -------------------------------------------------------------------------------------
def q_topk(prefix: tuple[int, ...]) -> list[Fraction]:
    table = {
        (): [F(1, 2), F(1, 4), F(1, 4), F(0)],
        (0,): [F(0), F(1, 2), F(1, 2), F(0)],
    }
    return table.get(prefix, [F(1, 8), F(1, 8), F(1, 4), F(1, 2)])


def test_topk_tree_keeps_the_best_nodes_with_the_stated_tie_rule() -> None:
    # Full expansion (depth 2, top-2): (0,) 1/2; (1,) 1/4 beats (2,) 1/4 on the lower token id;
    # (0,1) and (0,2) 1/4. Budget 3: (0,), then (1,) [1/4, token 1, created before (0,1)], then (0,1)
    # [1/4, token 1] before (0,2) [token 2].
    tree = draft_topk_tree(q_topk, depth=2, top_k=2, budget=3)
    kept = {tree.path_tokens(u) for u in range(1, tree.num_nodes)}
    assert kept == {(0,), (1,), (0, 1)}
    assert tree.process == "deterministic" and all(q is None for q in tree.draft_probs)
    assert tree.draws[0] == (0, 1)
    assert tree.confidences == (1, F(1, 2), F(1, 4), F(1, 4))  # DFS order: root, (0,), (0,1), (1,)
    assert tree.tokens == (-1, 0, 1, 1)


def test_topk_tree_with_a_large_budget_is_the_full_top_k_expansion() -> None:
    tree = draft_topk_tree(q_topk, depth=2, top_k=2, budget=100)
    assert tree.num_nodes == 1 + 2 + 4
    assert tree.draws[tree.child(0, 1) or -1] == (3, 2)  # rank order: 1/2 before 1/4


def full_expansion(model: Any, depth: int, top_k: int) -> dict[tuple[int, ...], Fraction]:
    out: dict[tuple[int, ...], Fraction] = {}
    frontier: list[tuple[tuple[int, ...], Fraction]] = [((), F(1))]
    while frontier:
        prefix, conf = frontier.pop()
        if len(prefix) >= depth:
            continue
        q = np.asarray(model(prefix), dtype=object)
        for t in ranked_tokens(q)[:top_k]:
            out[prefix + (t,)] = conf * q[t]
            frontier.append((prefix + (t,), conf * q[t]))
    return out


@given(
    seed=st.integers(0, 2**32 - 1),
    vocab=st.integers(1, 4),
    depth=st.integers(1, 3),
    top_k=st.integers(1, 3),
    budget=st.integers(1, 10),
)
def test_topk_tree_budget_keeps_a_best_set_closed_under_ancestors(
    seed: int, vocab: int, depth: int, top_k: int, budget: int
) -> None:
    model = context_table(seed, vocab)
    tree = draft_topk_tree(model, depth, top_k, budget)
    full = full_expansion(model, depth, top_k)
    kept = {tree.path_tokens(u): tree.confidences[u] for u in range(1, tree.num_nodes)}
    assert len(kept) == min(budget, len(full))
    assert set(kept) <= set(full)
    for prefix, conf in kept.items():
        assert conf == full[prefix]  # exp(cumulative log-score) = product of q along the path
        assert prefix[:-1] == () or prefix[:-1] in kept  # closed under ancestors
    worst_kept = min(kept.values(), default=F(1))
    assert all(conf <= worst_kept for prefix, conf in full.items() if prefix not in kept)
    for u in range(tree.num_nodes):  # draws in rank order
        prefix = tree.path_tokens(u)
        if tree.draws[u]:
            ranks = ranked_tokens(np.asarray(model(prefix), dtype=object))
            assert list(tree.draws[u]) == [t for t in ranks if t in tree.draws[u]]


def test_topk_tree_is_a_scored_draft_tree_with_float_log_scores() -> None:
    tree = draft_topk_tree(lambda prefix: [0.7, 0.2, 0.1], depth=3, top_k=2, budget=5)
    assert isinstance(tree, ScoredDraftTree)
    assert tree.log_scores[0] == 0.0
    assert tree.log_scores[1] == pytest.approx(np.log(0.7))
    assert tree.log_scores[2] == pytest.approx(2 * np.log(0.7))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(depth=0, top_k=2, budget=3), "depth must be an integer >= 1"),
        (dict(depth=2, top_k=0, budget=3), "top_k must be an integer >= 1"),
        (dict(depth=2, top_k=2, budget=0), "budget must be an integer >= 1"),
        (dict(depth=2, top_k=2, budget=2.0), "budget must be an integer"),
    ],
)
def test_topk_tree_rejects_bad_depth_top_k_and_budget(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        draft_topk_tree(q_topk, **kwargs)


def test_scored_tree_rejects_confidences_that_grow_along_a_path() -> None:
    with pytest.raises(ValueError, match=r"confidences\[2\]"):
        ScoredDraftTree((-1, 0, 1), (-1, 0, 1), ((0,), (1,), ()), (None,) * 3, "deterministic",
                        confidences=(1, F(1, 2), F(3, 4)))
    with pytest.raises(ValueError, match="len\\(confidences\\)=2"):
        ScoredDraftTree((-1, 0, 1), (-1, 0, 1), ((0,), (1,), ()), (None,) * 3, "deterministic",
                        confidences=(1, F(1, 2)))


def test_every_small_delayed_shape_is_drafted_for_each_k_l1_l2() -> None:
    for K, L1, L2 in itertools.product(range(1, 4), range(0, 3), range(0, 3)):
        tree = draft_delayed_tree(q_small, K, L1, L2, np.random.default_rng(K * 9 + L1 * 3 + L2))
        assert tree.max_depth == L1 + L2
        branch = tree.path_nodes(max(range(tree.num_nodes), key=lambda u: tree.depths[u]))[L1]
        assert len(tree.draws[branch]) == (K if L2 else 0)
