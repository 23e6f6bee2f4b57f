"""Calibrated routing (spec_ref.dual.calibrated_route, docs/algorithms.md section 8): the per-head calibration
counts on hand-built trees and committed blocks (a head whose tree was not verified, nodes beyond the
committed block, nodes below a node off the committed text), the empty calibration's rule, expected accepted
length versus the seed's mean, and a pair where the calibration learns to leave a confident but wrong head.
All exact or exact up to float64 rounding of Laplace ratios."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from spec_ref import ScoredDraftTree, draft_delayed_tree, route
from spec_ref.dual import (
    CALIBRATION_EDGES,
    RouteCalibration,
    calibrated_confidences,
    calibrated_route,
    calibration_bin,
    head_observations,
    node_bins,
    update_calibration,
)

F = Fraction
NBINS = len(CALIBRATION_EDGES) - 1


def tree(nodes: list[tuple[int, int, Any]]) -> ScoredDraftTree:
    """A deterministic scored tree from ``(parent, token, q)`` per non-root node, ancestors first."""
    tokens, parents, conf = [-1], [-1], [F(1)]
    draws: list[list[int]] = [[]]
    for parent, token, q in nodes:
        tokens.append(token)
        parents.append(parent)
        conf.append(conf[parent] * q)
        draws.append([])
        draws[parent].append(token)
    return ScoredDraftTree(tuple(tokens), tuple(parents), tuple(tuple(d) for d in draws), (None,) * len(tokens),
                           "deterministic", confidences=tuple(conf))


def counts(**bins: tuple[int, int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(offers, matches) with ``b<j>=(offers, matches)`` set and the other bins 0."""
    offers, matches = [0] * NBINS, [0] * NBINS
    for key, (o, m) in bins.items():
        offers[int(key[1:])], matches[int(key[1:])] = o, m
    return tuple(offers), tuple(matches)


def test_bins_cover_zero_to_one_with_q_one_in_the_top_bin() -> None:
    qs = (F(1, 100), F(1, 10), F(19, 100), F(1, 2), F(9, 10), F(1))
    assert [calibration_bin(q) for q in qs] == [0, 1, 1, 5, 9, 9]
    assert calibration_bin(0.1) == 1 and calibration_bin(0.09999999999999999) == 0
    # a node's bin reads its own q = c_i / c_parent, not its path confidence
    assert node_bins(tree([(0, 3, F(1, 2)), (1, 4, F(1)), (2, 5, F(3, 10))])) == (-1, 5, 9, 3)


def test_a_chain_counts_offers_and_matches_up_to_the_first_mismatch() -> None:
    chain = tree([(0, 3, F(1, 2)), (1, 4, F(1)), (2, 5, F(1))])  # bins 5, 9, 9
    # committed: 3 matches, then 7 (the correction) against 4; node 5 lies below a node off the text
    assert head_observations(chain, [3, 7]) == counts(b5=(1, 1), b9=(1, 0))
    # the block stops at depth 1: node 4 (depth 2) is unknown, not a miss
    assert head_observations(chain, [3]) == counts(b5=(1, 1))
    assert head_observations(chain, [3, 4, 5, 1]) == counts(b5=(1, 1), b9=(2, 2))
    assert head_observations(chain, [2, 4, 5]) == counts(b5=(1, 0))


def test_siblings_are_offered_together_and_at_most_one_matches() -> None:
    topk = tree([(0, 1, F(6, 10)), (0, 2, F(3, 10)), (1, 5, F(45, 100)), (2, 6, F(1))])
    assert head_observations(topk, [2, 6]) == counts(b6=(1, 0), b3=(1, 1), b9=(1, 1))
    assert head_observations(topk, [1, 6]) == counts(b6=(1, 1), b3=(1, 0), b4=(1, 0))
    assert head_observations(topk, [0]) == counts(b6=(1, 0), b3=(1, 0))


def test_both_heads_learn_from_the_committed_block_whichever_tree_was_verified() -> None:
    """Head 1 won and its tree was verified (block 3, 4 accepted, bonus 9); head 2's tree was never
    verified, yet its nodes are compared with the same committed tokens."""
    head1 = tree([(0, 3, F(1, 2)), (1, 4, F(1, 2))])
    head2 = tree([(0, 3, F(1)), (1, 8, F(1)), (2, 9, F(1)), (0, 5, F(1, 20))])
    assert calibrated_route(head1, head2, RouteCalibration()).head == 2  # more nodes near the root
    after = update_calibration(RouteCalibration(), head1, head2, [3, 4, 9])
    assert (after.offers[0], after.matches[0]) == counts(b5=(2, 2))
    # head 2: 3 matched; 8 missed (committed 4); 9 lies below 8, unknown; 5 is a sibling of 3: a miss
    assert (after.offers[1], after.matches[1]) == counts(b9=(2, 1), b0=(1, 0))
    again = update_calibration(after, head1, head2, [3, 4, 9])
    assert again.offers[1][9] == 4 and again.matches[1][9] == 2


def test_an_empty_calibration_scores_each_node_two_to_the_minus_depth() -> None:
    empty = RouteCalibration()
    assert empty.offers == ((0,) * NBINS, (0,) * NBINS) and empty.acceptance(2, 9) == 0.5
    chain = tree([(0, 3, F(1)), (1, 4, F(1))])
    wide = tree([(0, 3, F(1, 20)), (0, 4, F(1, 30))])
    assert calibrated_confidences(chain, empty, 1) == (1.0, 0.5, 0.25)
    result = calibrated_route(chain, wide, empty)
    assert result.expected_accepted == (0.75, 1.0) and result.head == 2
    # equal shapes tie, and ties go to head 1; a head without draft nodes scores 0
    assert calibrated_route(wide, tree([(0, 1, F(1)), (0, 2, F(1))]), empty).head == 1
    assert calibrated_route(tree([]), chain, empty).expected_accepted == (0.0, 0.75)
    assert calibrated_route(tree([]), tree([]), empty).head == 1


def test_the_score_is_the_expected_accepted_length_not_the_seeds_mean() -> None:
    """Head 1's chain has calibrated path probabilities 0.6, 0.36 (mean 0.48, expected accepted 0.96),
    head 2's single node 0.55: the mean would pick head 2, which accepts fewer tokens on average."""
    offers = tuple(3 if j == 9 else 0 for j in range(NBINS))  # head 1, bin 9: 2 of 3 -> 3/5
    matches = tuple(2 if j == 9 else 0 for j in range(NBINS))
    offers2 = tuple(18 if j == 5 else 0 for j in range(NBINS))  # head 2, bin 5: 10 of 18 -> 11/20
    matches2 = tuple(10 if j == 5 else 0 for j in range(NBINS))
    calibration = RouteCalibration(CALIBRATION_EDGES, (offers, offers2), (matches, matches2))
    chain = tree([(0, 3, F(1)), (1, 4, F(1))])
    single = tree([(0, 5, F(1, 2))])
    result = calibrated_route(chain, single, calibration)
    assert result.calibrated_confidences == ((1.0, 0.6, 0.6 * 0.6), (1.0, 0.55))
    assert result.expected_accepted == (0.6 + 0.6 * 0.6, 0.55) and result.head == 1
    mean = [sum(c[1:]) / (len(c) - 1) for c in result.calibrated_confidences]
    assert mean[0] < mean[1]  # the seed's statistic on the same calibrated confidences picks head 2


def test_the_calibration_leaves_a_confident_but_always_wrong_head() -> None:
    """Greedy decoding of a fixed text: head 1 always proposes a wrong token with probability 1, head 2
    always the right one with probability 0.3. The seed's route verifies head 1 at every step; the
    calibrated route does too at the first step (empty calibration: a tie), then only head 2."""
    text = [5, 2, 7, 1, 4, 6, 3, 0] * 3
    calibration = RouteCalibration()
    position, raw_heads, calibrated_heads = 0, [], []
    while position + 3 < len(text):
        wrong = tree([(0, (text[position] + 1) % 8, F(1)), (1, (text[position + 1] + 1) % 8, F(1))])
        right = tree([(0, text[position], F(3, 10)), (1, text[position + 1], F(3, 10))])
        raw_heads.append(route(wrong, right).head)
        choice = calibrated_route(wrong, right, calibration)
        calibrated_heads.append(choice.head)
        accepted = 0 if choice.head == 1 else 2  # greedy: the right chain is accepted whole
        committed = text[position: position + accepted + 1]
        calibration = update_calibration(calibration, wrong, right, committed)
        position += accepted + 1
    assert raw_heads == [1] * len(raw_heads)
    assert calibrated_heads[0] == 1 and calibrated_heads[1:] == [2] * (len(calibrated_heads) - 1)
    assert calibration.matches[0] == (0,) * NBINS and calibration.offers[0][9] == len(calibrated_heads)


def test_calibration_and_routing_reject_bad_inputs() -> None:
    chain = tree([(0, 3, F(1))])
    with pytest.raises(ValueError, match="edges must increase strictly from 0 to 1"):
        RouteCalibration((0.0, 0.5, 0.4, 1.0))
    with pytest.raises(ValueError, match="edges must increase strictly from 0 to 1"):
        RouteCalibration((0.1, 1.0))
    with pytest.raises(ValueError, match="offers must hold two rows of 2 integers"):
        RouteCalibration((0.0, 0.5, 1.0), ((0, 0, 0), (0, 0)), ((0, 0), (0, 0)))
    with pytest.raises(ValueError, match="matches must hold two rows of 2 integers"):
        RouteCalibration((0.0, 0.5, 1.0), ((1, 0), (0, 0)), ((-1, 0), (0, 0)))
    with pytest.raises(ValueError, match="exceeds offers"):
        RouteCalibration((0.0, 0.5, 1.0), ((1, 0), (0, 0)), ((2, 0), (0, 0)))
    with pytest.raises(ValueError, match=r"q must lie in \(0, 1\], got q=0"):
        calibration_bin(0)
    with pytest.raises(ValueError, match=r"committed must hold at least one token id >= 0, got committed=\[\]"):
        head_observations(chain, [])
    with pytest.raises(ValueError, match=r"committed must hold at least one token id >= 0, got committed=\[-1\]"):
        update_calibration(RouteCalibration(), chain, chain, [-1])
    with pytest.raises(ValueError, match="head must be 1 or 2, got head=3"):
        calibrated_confidences(chain, RouteCalibration(), 3)
    with pytest.raises(ValueError, match="calibration must be a RouteCalibration"):
        calibrated_route(chain, chain, None)  # type: ignore[arg-type]
    sampled = draft_delayed_tree(lambda prefix: [F(1, 2), F(1, 2)], 2, 0, 1, 2)
    with pytest.raises(ValueError, match="tree_a.process='iid': routing on sampled drafts is lossy"):
        calibrated_route(sampled, chain, RouteCalibration())
