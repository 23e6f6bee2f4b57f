"""Calibrated routing (spec_ref.dual_calibration, docs/algorithms.md section 8): the per-head calibration
counts on hand-built trees and committed blocks (a head whose tree was not verified, nodes beyond the
committed block, nodes below a node off the committed text), the empty calibration's rule, expected accepted
length versus the seed's mean, a pair where the calibration learns to leave a confident but wrong head, the
match-length classes of a retrieval head (which tell a long grounded match from a short chance one where
its probability-1 bin cannot), the prior table and the per-call level factor. All exact (dyadic values) or
exact up to float64 rounding of the estimates."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from spec_ref import ScoredDraftTree, draft_delayed_tree, route
from spec_ref.dual import (
    CALIBRATION_EDGES,
    MATCH_LENGTH_EDGES,
    num_classes,
    RouteCalibration,
    calibrated_confidences,
    calibrated_route,
    calibration_bin,
    head_observations,
    match_class,
    node_bins,
    node_classes,
    prior_rates,
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
    """Head 1's chain has calibrated path probabilities 0.625, 0.390625 (mean 0.51, expected accepted 1.02),
    head 2's single node 0.5625: the mean would pick head 2, which accepts fewer tokens on average. (Prior
    rates with no observations: the estimate is the table's rate, dyadic so every value is exact.)"""
    prior1 = tuple(0.625 if j == 9 else 0.5 for j in range(NBINS))
    prior2 = tuple(0.5625 if j == 5 else 0.5 for j in range(NBINS))
    calibration = RouteCalibration(prior=(prior1, prior2))
    chain = tree([(0, 3, F(1)), (1, 4, F(1))])
    single = tree([(0, 5, F(1, 2))])
    result = calibrated_route(chain, single, calibration)
    assert result.calibrated_confidences == ((1.0, 0.625, 0.390625), (1.0, 0.5625))
    assert result.expected_accepted == (1.015625, 0.5625) and result.head == 1
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
    with pytest.raises(ValueError, match="offers must hold two rows of 2 and 2 integers"):
        RouteCalibration((0.0, 0.5, 1.0), ((0, 0, 0), (0, 0)), ((0, 0), (0, 0)))
    with pytest.raises(ValueError, match="matches must hold two rows of 2 and 2 integers"):
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
    with pytest.raises(ValueError, match="features must be two of"):
        RouteCalibration(features=("probability", "length"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"prior must hold two rows of 10 and 16 rates in \(0, 1\]"):
        RouteCalibration(features=("probability", "match-length"), prior=((), (0.5,) * 10))
    with pytest.raises(ValueError, match=r"prior must hold two rows of 10 and 10 rates in \(0, 1\]"):
        RouteCalibration(prior=((0.0,) * 10, ()))
    with pytest.raises(ValueError, match="prior_weight must be a finite number > 0, got prior_weight=0"):
        RouteCalibration(prior_weight=0)
    with pytest.raises(ValueError, match="match_length must be an integer >= 0, got match_length=-1"):
        match_class(-1, 1)
    with pytest.raises(ValueError, match="matches=\\[3\\] exceeds offers=\\[2\\]"):
        prior_rates([2], [3])
    with pytest.raises(ValueError, match="match_lengths must give one match length per node of tree_b"):
        calibrated_route(chain, chain, RouteCalibration(features=("probability", "match-length")))
    with pytest.raises(ValueError, match="feature must be one of"):
        head_observations(chain, [3], feature="q")
    sampled = draft_delayed_tree(lambda prefix: [F(1, 2), F(1, 2)], 2, 0, 1, 2)
    with pytest.raises(ValueError, match="tree_a.process='iid': routing on sampled drafts is lossy"):
        calibrated_route(sampled, chain, RouteCalibration())


def test_match_classes_split_by_length_and_single_follower() -> None:
    lengths = [0, 1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 16]
    assert [match_class(m, F(1)) for m in lengths] == [1, 3, 5, 7, 9, 9, 11, 11, 13, 13, 15, 15]
    assert [match_class(m, F(1, 2)) for m in (0, 3, 12)] == [0, 6, 14]
    assert num_classes("match-length") == 2 * len(MATCH_LENGTH_EDGES) == 16
    # a node's class reads the match behind it (the law at its parent) and its own q = c_i / c_parent
    chain = tree([(0, 3, F(1)), (1, 4, F(2, 3))])
    assert node_classes(chain, "match-length", [-1, 2, 9]) == (-1, 5, 12)
    assert node_classes(chain, "probability") == node_bins(chain) == (-1, 9, 6)


def test_prior_rates_and_the_level_factor() -> None:
    """r0 = (m + 1) / (o + 2); f_h = (M + c) / (sum_k o_k r0_k + c); a = (m + w min(1, f r0)) / (o + w)."""
    assert prior_rates([2, 0, 6], [1, 0, 6]) == (0.5, 0.5, 0.875)
    rates = tuple(0.25 if j < 5 else 0.75 for j in range(NBINS))
    offers = tuple(4 if j in (2, 8) else 0 for j in range(NBINS))
    matches = tuple(3 if j == 8 else 0 for j in range(NBINS))  # bin 2: 0 of 4, bin 8: 3 of 4
    calibration = RouteCalibration(offers=(offers, offers), matches=(matches, matches), prior=(rates, ()))
    # head 1 expected 4 * 0.25 + 4 * 0.75 = 4 matches, saw 3: f = 5 / 6; head 2 (flat 1/2) expected 4: also 5 / 6
    assert calibration.level(1) == 5 / 6 and calibration.level(2) == 5 / 6
    assert calibration.acceptance(1, 2) == (0 + 4 * (5 / 6 * 0.25)) / 8
    assert calibration.acceptance(1, 8) == (3 + 4 * (5 / 6 * 0.75)) / 8
    assert calibration.acceptance(1, 0) == 5 / 6 * 0.25  # no offers: the re-levelled table
    hot = RouteCalibration(offers=(offers, offers), prior=(rates, ()),
                           matches=(tuple(4 if j == 2 else m for j, m in enumerate(matches)), matches))
    assert hot.level(1) == 1.5  # 7 matches where the table expects 4
    assert hot.acceptance(1, 4) == 0.375 and hot.acceptance(1, 9) == 1.0  # f r0 = 1.125: capped at 1


def test_the_prior_table_decides_the_first_step() -> None:
    """Without a table two chains of the same depth tie and head 1 drafts first; with tables in which the
    retrieval head's single-follower matches of length 8-11 are accepted 90% of the time and the model's
    q in [0.5, 0.6) half the time, the first step already goes to the retrieval head."""
    model = tree([(0, 3, F(11, 20)), (1, 4, F(11, 20))])
    retrieval = tree([(0, 3, F(1)), (1, 4, F(1))])
    lengths = (None, [-1, 9, 10])
    flat = RouteCalibration(features=("probability", "match-length"))
    assert calibrated_route(model, retrieval, flat, lengths).expected_accepted == (0.75, 0.75)
    assert calibrated_route(model, retrieval, flat, lengths).head == 1
    table = RouteCalibration(features=("probability", "match-length"),
                             prior=((0.5,) * NBINS, tuple(0.9 if k == 13 else 0.25 for k in range(16))))
    result = calibrated_route(model, retrieval, table, lengths)
    assert result.head == 2 and result.expected_accepted[1] == pytest.approx(0.9 + 0.81)


def test_match_lengths_tell_a_good_retrieval_step_from_a_poor_one() -> None:
    """A retrieval head proposes every token with q = 1; its proposals behind matches of 8+ tokens are right,
    behind 1-token matches wrong. A model head is right half the time at q = 0.5. Classed by its probability
    the retrieval head has one bin for both, so after a balanced history it scores the same at every step;
    classed by match length it wins exactly the steps with a long match."""
    text = [5, 2, 7, 1, 4, 6, 3, 0] * 4
    def retrieval_step(position: int, long: bool) -> tuple[ScoredDraftTree, list[int]]:
        right = text[position]
        return tree([(0, right if long else (right + 1) % 8, F(1))]), [-1, 9 if long else 1]
    model = tree([(0, 0, F(1, 2))])
    by_length = RouteCalibration(features=("probability", "match-length"))
    by_probability = RouteCalibration()
    for position in range(16):  # a history: long and short matches alternate; the model's right half the time
        drafted, lengths = retrieval_step(position, position % 2 == 0)
        model_tree = tree([(0, text[position] if position % 4 < 2 else 99, F(1, 2))])
        committed = [text[position]]
        by_length = update_calibration(by_length, model_tree, drafted, committed, (None, lengths))
        by_probability = update_calibration(by_probability, model_tree, drafted, committed)
    assert by_probability.offers[1][9] == 16 and by_probability.matches[1][9] == 8
    for long in (True, False):
        drafted, lengths = retrieval_step(16, long)
        assert calibrated_route(model, drafted, by_length, (None, lengths)).head == (2 if long else 1)
        # one bin for both kinds of step: the same score whatever the match, a tie with the model (to head 1)
        plain = calibrated_route(model, drafted, by_probability)
        assert plain.expected_accepted == (0.5, 0.5) and plain.head == 1


def test_update_calibration_keeps_features_prior_and_weights() -> None:
    chain = tree([(0, 3, F(1)), (1, 4, F(1))])
    start = RouteCalibration(features=("probability", "match-length"), prior=((), (0.25,) * 16),
                             prior_weight=2.0, level_weight=3.0)
    after = update_calibration(start, chain, chain, [3, 4, 9], (None, [-1, 2, 3]))
    assert (after.features, after.prior, after.prior_weight, after.level_weight) == (
        start.features, start.prior, 2.0, 3.0)
    assert after.offers[0][9] == 2 and after.matches[0][9] == 2
    assert after.offers[1] == tuple(1 if k in (5, 7) else 0 for k in range(16)) == after.matches[1]
