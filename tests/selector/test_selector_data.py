"""Dataset targets (spec_fast.nde.selector_data): E[tau+1] of every action's tree from one shared draw equals
spec_ref.efficiency.expected_block_efficiency on that very (K, L1, L2) delayed tree, drawn by
spec_ref.drafting.draft_delayed_tree replaying the same tokens (every OT method, every action)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from spec_fast.nde.selector_data import DelayedDraws, action_efficiencies, delayed_tree_paths
from spec_ref.drafting import draft_delayed_tree
from spec_ref.efficiency import expected_block_efficiency
from spec_ref.rng import RandomSource
from spec_ref.selector import action_space

V = 5


class _Scripted:
    """A RandomSource whose categorical draws replay a fixed token list (other calls are unused here)."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = list(tokens)

    def categorical(self, weights: Any) -> int:
        token = self.tokens.pop(0)
        assert weights[token] > 0
        return token

    def uniform(self) -> float:
        raise AssertionError("not used")

    def bernoulli(self, probability: Any) -> bool:
        raise AssertionError("not used")

    def integers(self, n: int) -> int:
        raise AssertionError("not used")

    def substream(self, index: int) -> RandomSource:
        raise AssertionError("not used")


def _table_model(seed: int, zeros: bool) -> Any:
    rng = np.random.default_rng(seed)
    cache: dict[tuple[int, ...], np.ndarray] = {}

    def model(prefix: tuple[int, ...]) -> np.ndarray:
        if prefix not in cache:
            x = rng.gamma(0.4, size=V)
            if zeros:
                x[rng.random(V) < 0.3] = 0.0
            x[len(prefix) % V] += 0.05
            cache[prefix] = x / x.sum()
        return cache[prefix]

    return model


def _shared_draw(draft: Any, rng: np.random.Generator, k_max: int, l1_max: int, l2_max: int) -> DelayedDraws:
    def walk(prefix: tuple[int, ...], length: int) -> tuple[int, ...]:
        out: tuple[int, ...] = ()
        for _ in range(length):
            q = draft(prefix + out)
            out += (int(rng.choice(V, p=q)),)
        return out

    spine = walk((), l1_max + l2_max)
    extra = tuple(tuple(walk(spine[:l1], l2_max) for _ in range(k_max - 1)) for l1 in range(l1_max + 1))
    return DelayedDraws(spine, extra, k_max, l1_max, l2_max)


@pytest.mark.parametrize("method", ["specinfer", "naive_tree", "spectr", "nss", "khisti"])
def test_every_action_matches_spec_ref_eq_3_on_its_own_tree(method: str) -> None:
    k_max, l1_max, l2_max = 3, 2, 2
    target, draft = _table_model(1, zeros=True), _table_model(2, zeros=True)
    draws = _shared_draw(draft, np.random.default_rng(7), k_max, l1_max, l2_max)
    got = action_efficiencies(draws, target, draft, method)
    actions = action_space(k_max, l1_max, l2_max)
    assert got.shape == (len(actions),)
    for i, (k, l1, l2) in enumerate(actions):
        trunk, branches = delayed_tree_paths(draws, k, l1, l2)
        replay = list(trunk) + [t for branch in branches for t in branch]  # draft_delayed_tree's draw order
        tree = draft_delayed_tree(draft, k, l1, l2, _Scripted(replay))
        want = expected_block_efficiency(tree, target, method)
        assert got[i] == pytest.approx(float(want), rel=1e-12, abs=1e-14), (k, l1, l2)
    # every value lies in [1, 1 + L1 + L2] (the root always, at most every node of one path)
    for value, (k, l1, l2) in zip(got, actions):
        assert 1.0 <= value <= 1 + l1 + l2 + 1e-12


@pytest.mark.parametrize("method", ["specinfer", "naive_tree", "spectr", "nss"])
def test_merging_the_tokens_of_draft_mass_zero_changes_nothing(method: str) -> None:
    """The vocabulary compression is exact for these methods: a draft with zeros, compressed or not."""
    target, draft = _table_model(5, zeros=True), _table_model(6, zeros=True)
    draws = _shared_draw(draft, np.random.default_rng(8), 3, 2, 2)
    full = action_efficiencies(draws, target, draft, method, compress=False)
    merged = action_efficiencies(draws, target, draft, method, compress=True)
    np.testing.assert_allclose(merged, full, rtol=1e-12, atol=1e-14)


def test_a_perfect_draft_accepts_every_token() -> None:
    """Negative control: with q == p every node is reached, so E = 1 + L1 + L2 for every action."""
    model = _table_model(3, zeros=False)
    draws = _shared_draw(model, np.random.default_rng(0), 2, 2, 2)
    got = action_efficiencies(draws, model, model, "specinfer")
    for value, (k, l1, l2) in zip(got, action_space(2, 2, 2)):
        assert value == pytest.approx(1 + l1 + l2, rel=1e-12)
    other = action_efficiencies(draws, _table_model(4, zeros=True), model, "specinfer")
    assert float(other.max()) < 1 + 2 + 2 - 1e-6  # a different target loses something


def test_bad_draws_and_methods_raise() -> None:
    with pytest.raises(ValueError, match="spine must hold 4 tokens"):
        DelayedDraws((1, 2), tuple(((0, 0),) for _ in range(3)), 2, 2, 2)
    draws = DelayedDraws((1, 2, 3, 4), tuple(((0, 0),) for _ in range(3)), 2, 2, 2)
    with pytest.raises(ValueError, match="OT methods"):
        action_efficiencies(draws, _table_model(0, False), _table_model(1, False), "traversal")
    with pytest.raises(ValueError, match="outside the draw's action space"):
        delayed_tree_paths(draws, 3, 0, 0)


def _all_draws(draft: Any, k_max: int, l1_max: int, l2_max: int) -> list[tuple[float, DelayedDraws]]:
    """Every shared draw with its probability (the spine, then the extra branches of L1 = 0..l1_max)."""
    def walks(prefix: tuple[int, ...], length: int) -> list[tuple[float, tuple[int, ...]]]:
        if length == 0:
            return [(1.0, ())]
        q = draft(prefix)
        return [(float(q[t]) * w, (t,) + rest) for t in range(V) if q[t] > 0
                for w, rest in walks(prefix + (t,), length - 1)]

    out: list[tuple[float, DelayedDraws]] = []
    for w_spine, spine in walks((), l1_max + l2_max):
        rows: list[list[tuple[float, tuple[tuple[int, ...], ...]]]] = []
        for l1 in range(l1_max + 1):
            row: list[tuple[float, tuple[tuple[int, ...], ...]]] = [(1.0, ())]
            for _ in range(k_max - 1):
                row = [(w * wb, done + (b,)) for w, done in row for wb, b in walks(spine[:l1], l2_max)]
            rows.append(row)
        combos: list[tuple[float, tuple[tuple[tuple[int, ...], ...], ...]]] = [(w_spine, ())]
        for row in rows:
            combos = [(w * wr, done + (r,)) for w, done in combos for wr, r in row]
        out += [(w, DelayedDraws(spine, extra, k_max, l1_max, l2_max)) for w, extra in combos]
    return out


@pytest.mark.parametrize("method", ["specinfer", "nss", "spectr", "naive_tree", "khisti"])
@pytest.mark.parametrize("bounds", [(2, 1, 1), (2, 0, 2)])
def test_rao_blackwell_targets_have_the_exact_expectation_and_less_variance(method: str, bounds: tuple[int, int, int]) -> None:
    """Over every shared draw (weighted by its probability) the Rao-Blackwellised targets average to the
    same E[tau + 1] as eq. 3 on the drawn trees (both unbiased for the expectation over drafts), with no
    more variance per action; (K, 0, 1) is exact in every draw. Negative control: a biased transform of
    the targets (rounded down) fails the same comparison."""
    target, draft = _table_model(11, zeros=True), _table_model(12, zeros=True)
    draws = _all_draws(draft, *bounds)
    weights = np.array([w for w, _ in draws])
    assert weights.sum() == pytest.approx(1.0, abs=1e-12)
    realised = np.stack([action_efficiencies(d, target, draft, method) for _, d in draws])
    blackwell = np.stack([action_efficiencies(d, target, draft, method, estimator="rao_blackwell") for _, d in draws])
    mean_r, mean_b = weights @ realised, weights @ blackwell
    np.testing.assert_allclose(mean_b, mean_r, rtol=1e-12, atol=1e-12)
    var_r = weights @ (realised - mean_r) ** 2
    var_b = weights @ (blackwell - mean_b) ** 2
    assert bool(np.all(var_b <= var_r + 1e-12))
    actions = action_space(*bounds)
    if method != "khisti":
        for i, (k, l1, l2) in enumerate(actions):
            if l1 == 0 and l2 == 1:  # the root's draws are the last level: exact in every draw
                assert float(np.ptp(blackwell[:, i])) < 1e-12
                assert var_r[i] > 1e-6  # while eq. 3 on one draw varies
    # negative control: a biased target is caught by the same comparison
    assert not np.allclose(weights @ np.floor(realised), mean_r, rtol=1e-6)


def test_unknown_estimator_raises() -> None:
    draws = DelayedDraws((1, 2, 3, 4), tuple(((0, 0),) for _ in range(3)), 2, 2, 2)
    with pytest.raises(ValueError, match="estimator must be one of"):
        action_efficiencies(draws, _table_model(0, False), _table_model(1, False), "specinfer", estimator="exact")
