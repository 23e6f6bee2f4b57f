"""NDE selector math (seed 002 (docs/papers.md) eq. 4, 5, 8, 9, 11, 12) against hand-computed values (exact where possible)."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from spec_ref import selector

F = Fraction


def t_q(length: int) -> Fraction:
    return F(length)


def t_p(length: int) -> Fraction:
    return F(100 + length)


def test_action_space_is_the_seed_grid_in_lexicographic_order() -> None:
    actions = selector.action_space()
    assert len(actions) == 4 * 9 * 9
    assert actions[0] == (1, 0, 0) and actions[1] == (1, 0, 1) and actions[-1] == (4, 8, 8)
    assert selector.action_space(2, 1, 1) == (
        (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1), (2, 0, 0), (2, 0, 1), (2, 1, 0), (2, 1, 1)
    )


def test_latency_model_of_eq_11_by_hand() -> None:
    # l = 10, a = (2, 1, 3): trunk t_q(10); branches t_q(11), t_q(13), t_q(15); target t_p(10 + 1 + 6)
    assert selector.latency_estimate(10, (2, 1, 3), t_q, t_p) == 10 + 11 + 13 + 15 + 117
    # no drafting at all: just the target pass at the current length
    assert selector.latency_estimate(10, (3, 0, 0), t_q, t_p) == 110
    # a pure chain (K = 1, L1 = 0): t_q(l + j) for j < L2 and t_p(l + L2)
    assert selector.latency_estimate(5, (1, 0, 2), t_q, t_p) == 5 + 6 + 107


def test_latency_model_accepts_tables_indexed_by_context_length() -> None:
    draft_table = [0.5 * length for length in range(40)]
    target_table = [10.0 + length for length in range(40)]
    assert selector.latency_estimate(10, (2, 1, 3), draft_table, target_table) == pytest.approx(
        0.5 * (10 + 11 + 13 + 15) + 27.0
    )
    table = selector.latency_table(0, [(1, 0, 0), (2, 2, 2)], draft_table, target_table)
    assert table.tolist() == [10.0, 0.5 * (0 + 1 + 2 + 4) + 16.0]
    with pytest.raises(ValueError, match="no entry for context length 40"):
        selector.latency_estimate(38, (1, 0, 2), draft_table, target_table)


def test_policy_throughput_of_eq_4_is_a_ratio_of_policy_averages() -> None:
    pi = [F(1, 2), F(1, 4), F(1, 4)]
    eff = [F(1), F(2), F(3)]
    lat = [F(1), F(2), F(4)]
    assert selector.policy_throughput(pi, eff, lat) == F(7, 8)  # (1/2 + 1/2 + 3/4) / (1/2 + 1/2 + 1)
    # eq. 9 read as the policy average of per-action throughputs: 1/2 + 1/4 + 3/16
    assert selector.throughput_objective([pi], [eff], [lat]) == F(15, 16)


def test_a_one_hot_policy_has_the_throughput_of_its_action() -> None:
    eff = np.array([[1.0, 2.5, 3.0], [1.0, 1.5, 4.0]])
    lat = np.array([[1.0, 2.0, 4.0], [2.0, 1.0, 8.0]])
    one_hot = np.eye(3)[[1, 2]]
    assert selector.policy_throughput(one_hot, eff, lat).tolist() == [1.25, 0.5]
    assert selector.action_throughput(eff, lat, np.array([1, 2])).tolist() == [1.25, 0.5]
    assert selector.relative_log_loss(one_hot, eff, lat, np.array([1, 2])).tolist() == [0.0, 0.0]


def test_policy_probs_is_a_stable_softmax() -> None:
    probs = selector.policy_probs([[0.0, 0.0], [1000.0, 1000.0 + math.log(3.0)]])
    assert probs.tolist()[0] == [0.5, 0.5]
    assert probs[1] == pytest.approx([0.25, 0.75])


def test_selector_loss_of_eq_12_by_hand() -> None:
    logits = np.zeros((2, 3))  # uniform policy
    eff = np.array([[1.0, 2.0, 3.0], [2.0, 2.0, 2.0]])
    lat = np.array([[1.0, 2.0, 4.0], [1.0, 1.0, 1.0]])
    base = np.array([0, 1])
    # row 0: TPS_pi = 2 / (7/3) = 6/7, TPS_base = 1/1 -> r = 6/7; row 1: r = 2/2 = 1
    loss = selector.selector_loss(logits, eff, lat, base, penalty_weight=2.0, worst_fraction=0.5)
    assert loss.ratios == pytest.approx((6 / 7, 1.0))
    assert loss.log_term == pytest.approx(math.log(7 / 6) / 2)
    assert loss.worst_indices == (0,)
    assert loss.penalty == pytest.approx((1 / 7) ** 2)
    assert loss.total == pytest.approx(math.log(7 / 6) / 2 + 2 * (1 / 7) ** 2)
    loss_all = selector.selector_loss(logits, eff, lat, base, penalty_weight=1.0, worst_fraction=1.0)
    assert loss_all.penalty == pytest.approx((1 / 7) ** 2 / 2)  # mean over both rows


def test_worst_fraction_count_is_ceil_alpha_times_batch() -> None:
    batch = 30
    eff = np.ones((batch, 2)) + np.arange(batch)[:, None] * np.array([[0.0, 0.01]])
    lat = np.ones((batch, 2))
    loss = selector.selector_loss(np.zeros((batch, 2)), eff, lat, np.ones(batch, dtype=int), 0.0, 0.1)
    assert len(loss.worst_indices) == 3  # ceil(0.1 * 30) = 3, not 4
    assert loss.worst_indices == (29, 28, 27)  # largest regressions first
    loss = selector.selector_loss(np.zeros((batch, 2)), eff, lat, np.ones(batch, dtype=int), 0.0, 0.01)
    assert len(loss.worst_indices) == 1


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: selector.action_space(0), "max_branches must be an integer >= 1"),
        (lambda: selector.latency_estimate(-1, (1, 0, 0), t_q, t_p), "context_length must be an integer >= 0"),
        (lambda: selector.latency_estimate(3, (0, 1, 1), t_q, t_p), "K must be an integer >= 1"),
        (lambda: selector.latency_estimate(3, (1, 1), t_q, t_p), "action must be a triple"),
        (lambda: selector.latency_estimate(3, (1, 1, 1), lambda l: -1.0, t_p), "draft_time\\(3\\)=-1.0"),
        (lambda: selector.policy_throughput([0.5, 0.5], [1.0, 2.0], [1.0, 0.0]), "latency must be positive"),
        (lambda: selector.policy_throughput([0.5, 0.5], [1.0, 2.0, 3.0], [1.0, 1.0]), "block_efficiency.shape"),
        (lambda: selector.policy_probs([[np.inf, 0.0]]), "logits must be finite"),
        (lambda: selector.action_throughput(np.ones((2, 2)), np.ones((2, 2)), np.array([0, 2])), "actions must lie"),
        (lambda: selector.selector_loss(np.zeros((1, 2)), np.ones((1, 2)), np.ones((1, 2)), np.array([0]), -1.0, 0.5),
         "penalty_weight must be finite and >= 0"),
        (lambda: selector.selector_loss(np.zeros((1, 2)), np.ones((1, 2)), np.ones((1, 2)), np.array([0]), 1.0, 0.0),
         "worst_fraction must lie in \\(0, 1\\]"),
    ],
)
def test_selector_functions_reject_bad_input_naming_it(call: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()
