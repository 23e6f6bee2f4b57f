"""DynaTree drafting rules (seed 003 (docs/papers.md) section 3.3, Algorithm 1) on hand-made draft tables, exactly:
branching by confidence, depth gating (D_0, D_max, rho_stop, rho_deep), pruning, node budget, and the
history adjustment schedule written down in spec_ref/dynatree.py."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from spec_ref import DynaTreeHistory, DynaTreeParams, adjusted_params, draft_dynatree, update_history

F = Fraction
CONFIDENT = [F(19, 20), F(1, 20), F(0), F(0)]  # max 0.95 >= tau_h: B_min = 1 branch
MEDIUM = [F(1, 2), F(3, 10), F(1, 5), F(0)]  # tau_l <= 0.5 < tau_h: B_mid = 2 branches
UNCERTAIN = [F(3, 10), F(3, 10), F(1, 5), F(1, 5)]  # max 0.3 < tau_l: B_max = 3 branches
TABLE = {(): CONFIDENT, (0,): MEDIUM, (0, 0): UNCERTAIN, (0, 1): CONFIDENT}


def model(prefix: tuple[int, ...]) -> list[Fraction]:
    return TABLE.get(prefix, UNCERTAIN)


BASE = DynaTreeParams(
    branch_min=1, branch_mid=2, branch_max=3, tau_low=F(2, 5), tau_high=F(9, 10), base_depth=2, max_depth=4,
    rho_stop=F(1, 100), rho_deep=F(1, 2), prune_threshold=F(1, 1000), node_budget=100,
    high_acceptance=F(4, 5), low_acceptance=F(3, 10), threshold_step=F(1, 20), depth_step=1,
)


def shape(tree: Any) -> dict[tuple[int, ...], tuple[int, ...]]:
    return {tree.path_tokens(u): tree.draws[u] for u in range(tree.num_nodes)}


def draft(params: DynaTreeParams = BASE, history: DynaTreeHistory | None = None) -> Any:
    tree, _ = draft_dynatree(model, params, history or DynaTreeHistory(window=2))
    return tree


def test_branching_count_follows_the_confidence_thresholds() -> None:
    tree = draft()
    assert shape(tree) == {
        (): (0,),  # u0 = the draft's top-1 token
        (0,): (0, 1),  # MEDIUM: 2 children
        (0, 0): (0, 1, 2),  # UNCERTAIN: 3 children; ties 0.3/0.3 and 0.2/0.2 to the lower id
        (0, 1): (0,),  # CONFIDENT: 1 child
        (0, 0, 0): (), (0, 0, 1): (), (0, 0, 2): (),  # seed depth 2 >= D_0 and p < rho_deep: not expanded
        (0, 1, 0): (),
    }
    assert tree.process == "deterministic"
    assert tree.tokens == (-1, 0, 0, 1, 0, 1, 2, 0)  # breadth-first numbering
    assert tree.confidences[1:4] == (F(19, 20), F(19, 40), F(57, 200))


def test_confidence_exactly_at_a_threshold_takes_the_upper_branch_count() -> None:
    at_high = replace(BASE, tau_high=F(1, 2), tau_low=F(2, 5))  # MEDIUM's max 1/2 >= tau_h -> B_min
    assert shape(draft(at_high))[(0,)] == (0,)
    at_low = replace(BASE, tau_low=F(3, 10), tau_high=F(9, 10))  # UNCERTAIN's max 3/10 >= tau_l -> B_mid
    assert shape(draft(at_low))[(0, 0)] == (0, 1)


def test_deep_expansion_past_d0_needs_rho_deep() -> None:
    tree = draft(replace(BASE, rho_deep=F(1, 4)))
    # p(0,1,0) = 57/200 * 19/20 = 1083/4000 >= 1/4: expanded beyond D_0; p(0,0,0) = 57/400 < 1/4: not
    assert shape(tree)[(0, 1, 0)] == (0, 1, 2)
    assert shape(tree)[(0, 0, 0)] == ()
    assert tree.max_depth == 4


def test_max_depth_is_a_hard_limit() -> None:
    tree = draft(replace(BASE, rho_deep=F(1, 50), rho_stop=F(1, 100), max_depth=3))
    assert tree.max_depth == 3 + 1  # seed depth D_max = 3 is DraftTree depth 4 (u0 sits at depth 1)
    assert all(tree.draws[u] == () for u in range(tree.num_nodes) if tree.depths[u] == 4)
    assert any(tree.draws[u] for u in range(tree.num_nodes) if tree.depths[u] == 3)


def test_early_stopping_below_rho_stop_even_before_d0() -> None:
    tree = draft(replace(BASE, rho_stop=F(3, 10), base_depth=3))
    # p(0,1) = 57/200 < 3/10: stopped although its seed depth 1 < D_0 = 3
    assert shape(tree)[(0, 1)] == ()
    assert shape(tree)[(0, 0)] == (0, 1, 2)  # p(0,0) = 19/40 >= 3/10
    assert shape(tree)[(0, 0, 0)] == ()  # p = 57/400 < 3/10


def test_children_below_the_pruning_threshold_are_not_added() -> None:
    tree = draft(replace(BASE, prune_threshold=F(1, 5)))
    assert shape(tree) == {(): (0,), (0,): (0, 1), (0, 0): (), (0, 1): (0,), (0, 1, 0): ()}


def test_u0_is_kept_but_not_expanded_when_below_the_pruning_threshold() -> None:
    tree = draft(replace(BASE, prune_threshold=F(99, 100)))
    assert shape(tree) == {(): (0,), (0,): ()}


@pytest.mark.parametrize(
    "budget,expected",
    [
        (1, {(): (0,), (0,): ()}),
        (3, {(): (0,), (0,): (0, 1), (0, 0): (), (0, 1): ()}),
        (4, {(): (0,), (0,): (0, 1), (0, 0): (0,), (0, 1): (), (0, 0, 0): ()}),
    ],
)
def test_node_budget_stops_the_breadth_first_expansion(budget: int, expected: dict[Any, Any]) -> None:
    tree = draft(replace(BASE, node_budget=budget))
    assert shape(tree) == expected
    assert tree.num_nodes - 1 == budget


def test_history_adjusts_depth_and_thresholds_after_a_full_window_of_high_acceptance() -> None:
    history = DynaTreeHistory(window=2)
    tree, history = draft_dynatree(model, BASE, history)
    assert history.pending_depth == tree.max_depth == 3
    history = update_history(history, 3)
    assert history.acceptance == (F(1),) and history.mean_acceptance is None  # warm-up: base params
    assert adjusted_params(BASE, history) == BASE
    tree, history = draft_dynatree(model, BASE, history)
    assert shape(tree) == shape(draft())
    history = update_history(history, 3)
    assert history.mean_acceptance == 1
    aggressive = adjusted_params(BASE, history)
    assert (aggressive.base_depth, aggressive.tau_low, aggressive.tau_high) == (3, F(7, 20), F(17, 20))
    deeper, _ = draft_dynatree(model, BASE, history)
    assert deeper.max_depth == 4  # D_0 = 3 now lets seed-depth-2 nodes expand
    assert shape(deeper)[(0, 1, 0)] == (0, 1, 2)


def test_history_turns_conservative_after_low_acceptance_and_neutral_in_between() -> None:
    low = DynaTreeHistory(window=2, acceptance=(F(0), F(1, 3)))  # mean 1/6 <= 3/10
    conservative = adjusted_params(BASE, low)
    assert (conservative.base_depth, conservative.tau_low, conservative.tau_high) == (1, F(9, 20), F(19, 20))
    tree, _ = draft_dynatree(model, BASE, low)
    assert shape(tree) == {(): (0,), (0,): (0, 1), (0, 0): (), (0, 1): ()}  # D_0 = 1: (0, 0) needs rho_deep
    middle = DynaTreeHistory(window=2, acceptance=(F(1, 2), F(1, 2)))
    assert adjusted_params(BASE, middle) == BASE


def test_adjusted_depth_stays_between_one_and_max_depth_minus_one() -> None:
    full = DynaTreeHistory(window=1, acceptance=(F(1),))
    assert adjusted_params(replace(BASE, base_depth=3, max_depth=4), full).base_depth == 3
    empty = DynaTreeHistory(window=1, acceptance=(F(0),))
    assert adjusted_params(replace(BASE, base_depth=1), empty).base_depth == 1


def test_update_history_keeps_the_last_w_statistics() -> None:
    history = DynaTreeHistory(window=2)
    for accepted, depth in [(1, 4), (2, 4), (0, 2)]:
        history = update_history(replace(history, pending_depth=depth), accepted)
    assert history.acceptance == (F(1, 2), F(0))
    assert history.pending_depth is None


def test_update_history_and_draft_enforce_the_draft_verify_alternation() -> None:
    with pytest.raises(ValueError, match="pending_depth=None"):
        update_history(DynaTreeHistory(window=2), 1)
    with pytest.raises(ValueError, match="accepted_length=5 exceeds the drafted depth pending_depth=3"):
        update_history(DynaTreeHistory(window=2, pending_depth=3), 5)
    with pytest.raises(ValueError, match="accepted_length must be an integer >= 0"):
        update_history(DynaTreeHistory(window=2, pending_depth=3), -1)
    with pytest.raises(ValueError, match="the previous tree was not verified yet"):
        draft_dynatree(model, BASE, DynaTreeHistory(window=2, pending_depth=3))


@pytest.mark.parametrize(
    "changes,match",
    [
        (dict(branch_min=0), "branch_min must be an integer >= 1"),
        (dict(branch_min=3, branch_mid=2), "branch_min <= branch_mid <= branch_max"),
        (dict(tau_low=F(9, 10), tau_high=F(2, 5)), "0 < tau_low < tau_high < 1"),
        (dict(tau_high=1), "0 < tau_low < tau_high < 1"),
        (dict(base_depth=4, max_depth=4), "base_depth < max_depth"),
        (dict(base_depth=0), "base_depth must be an integer >= 1"),
        (dict(rho_stop=F(1, 2), rho_deep=F(1, 4)), "0 < rho_stop < rho_deep < 1"),
        (dict(prune_threshold=0), "prune_threshold must lie in \\(0, 1\\)"),
        (dict(prune_threshold=float("nan")), "prune_threshold must be finite"),
        (dict(node_budget=0), "node_budget must be an integer >= 1"),
        (dict(low_acceptance=F(9, 10)), "low_acceptance < high_acceptance"),
        (dict(threshold_step=F(1, 2)), "threshold_step=Fraction\\(1, 2\\)"),
        (dict(depth_step=-1), "depth_step must be an integer >= 0"),
        (dict(tau_low="0.4"), "tau_low must be a real number"),
    ],
)
def test_malformed_dynatree_params_raise_naming_the_parameter(changes: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        replace(BASE, **changes)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(window=0), "window must be an integer >= 1"),
        (dict(window=1, acceptance=(F(1), F(1))), "more than window=1"),
        (dict(window=2, acceptance=(F(3, 2),)), "acceptance\\[0\\]=Fraction\\(3, 2\\) must lie in \\[0, 1\\]"),
        (dict(window=2, pending_depth=0), "pending_depth must be an integer >= 1"),
    ],
)
def test_malformed_history_raises(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DynaTreeHistory(**kwargs)


@given(st.integers(0, 2**32 - 1), st.integers(1, 12), st.integers(1, 3), st.integers(2, 4))
def test_every_dynatree_respects_budget_gating_branch_bounds_and_pruning(
    seed: int, budget: int, d0: int, dmax: int
) -> None:
    def table(prefix: tuple[int, ...]) -> list[Fraction]:
        weights = [int(w) for w in np.random.default_rng([seed, len(prefix), *prefix]).integers(0, 5, size=4)]
        weights[0] += 1
        return [F(w, sum(weights)) for w in weights]

    params = replace(BASE, node_budget=budget, base_depth=min(d0, dmax - 1), max_depth=dmax,
                     rho_deep=F(1, 5), prune_threshold=F(1, 50))
    tree, _ = draft_dynatree(table, params, DynaTreeHistory())
    assert 1 <= tree.num_nodes - 1 <= budget and tree.draws[0] == (tree.tokens[1],)
    for u in range(1, tree.num_nodes):
        p_u, d_u = tree.confidences[u], tree.depths[u] - 1
        if u > 1:
            assert p_u >= params.prune_threshold
        if tree.draws[u]:
            assert d_u < dmax and p_u >= params.rho_stop and (d_u < params.base_depth or p_u >= params.rho_deep)
            q = table(tree.path_tokens(u))
            bound = 1 if max(q) >= params.tau_high else 3 if max(q) < params.tau_low else 2
            assert len(tree.draws[u]) <= bound
            ranked = sorted(range(4), key=lambda t: (-q[t], t))
            assert list(tree.draws[u]) == ranked[: len(tree.draws[u])]
            for t in tree.draws[u]:
                assert tree.confidences[tree.child(u, t) or -1] == p_u * q[t]
