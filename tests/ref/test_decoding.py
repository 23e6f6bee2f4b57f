"""The decoding operator G (docs/algorithms.md section 2; proofs/T08_decoding_operator.md)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from spec_ref import decoding_operator, greedy_token


def test_temperature_only_is_softmax_of_scaled_logits() -> None:
    logits = np.array([1.0, 2.0, -1.0, 0.5])
    expected = np.exp(logits / 0.7) / np.exp(logits / 0.7).sum()
    np.testing.assert_allclose(decoding_operator(logits, 0.7), expected, rtol=1e-15)


def test_temperature_zero_is_one_hot_at_the_lowest_id_argmax_without_dividing() -> None:
    logits = np.array([0.0, 3.0, 3.0, -np.inf])
    with np.errstate(all="raise"):
        probs = decoding_operator(logits, 0.0, top_k=1, top_p=0.5)
    assert probs.tolist() == [0.0, 1.0, 0.0, 0.0]
    assert greedy_token(logits) == 1


def test_top_k_keeps_every_token_tied_with_the_kth_largest() -> None:
    probs = decoding_operator([1.0, 2.0, 2.0, 0.0, 2.0], 1.0, top_k=2)
    assert (probs > 0).tolist() == [False, True, True, False, True]


def test_top_p_keeps_the_shortest_prefix_reaching_top_p_with_ties_broken_by_token_id() -> None:
    # four equal tokens: mass before positions is 0, .25, .5, .75; top_p = 0.5 keeps the first two ids.
    probs = decoding_operator(np.zeros(4), 1.0, top_p=0.5)
    assert probs.tolist() == [0.5, 0.5, 0.0, 0.0]
    # top_p just above a boundary keeps one more token
    probs = decoding_operator(np.zeros(4), 1.0, top_p=0.5000001)
    assert (probs > 0).sum() == 3


def test_top_p_always_keeps_at_least_one_token() -> None:
    probs = decoding_operator([10.0, 0.0, 0.0], 1.0, top_p=1e-9)
    assert probs.tolist() == [1.0, 0.0, 0.0]


def test_order_is_temperature_then_top_k_then_top_p() -> None:
    logits = np.array([3.0, 2.0, 1.0, 0.0])
    z = logits / 2.0
    kept = z[:3]
    softmax = np.exp(kept) / np.exp(kept).sum()
    # top_p = 0.6 on the top-3 renormalised distribution keeps ids 0 and 1 (0.51 < 0.6 before id 1)
    assert softmax[0] < 0.6 <= softmax[0] + softmax[1]
    probs = decoding_operator(logits, 2.0, top_k=3, top_p=0.6)
    expected = np.exp(z[:2]) / np.exp(z[:2]).sum()
    np.testing.assert_allclose(probs[:2], expected, rtol=1e-15)
    assert probs[2:].tolist() == [0.0, 0.0]


@settings(max_examples=settings.default.max_examples)
@given(
    logits=st.lists(st.floats(-20, 20, allow_nan=False, allow_subnormal=False), min_size=2, max_size=12, unique=True),
    temperature=st.sampled_from([0.3, 0.7, 1.0, 2.0]),
    top_k=st.integers(1, 12),
    top_p=st.floats(0.05, 1.0),
)
# Distinct logits whose probabilities tie in float64 (exp(-3.7e-128) == 1.0): G orders top-p by
# (probability desc, id asc) and keeps id 0, HF's warper orders by logit and keeps id 1.
@example(logits=[0.0, 3.7e-128], temperature=1.0, top_k=2, top_p=0.3)
def test_kept_set_matches_hugging_face_logits_warpers_up_to_probability_ties(
    logits: list[float], temperature: float, top_k: int, top_p: float
) -> None:
    ours = decoding_operator(logits, temperature, top_k=top_k, top_p=top_p)
    scores = torch.tensor([logits], dtype=torch.float64)
    ids = torch.zeros((1, 1), dtype=torch.long)
    for warper in (TemperatureLogitsWarper(temperature), TopKLogitsWarper(top_k), TopPLogitsWarper(top_p)):
        scores = warper(ids, scores)
    theirs = torch.softmax(scores, dim=-1)[0].numpy()
    sorted_probs = np.sort(ours)[::-1]
    cumulative = np.cumsum(sorted_probs)
    if np.any(np.abs(cumulative - top_p) < 1e-9) or np.any(np.abs(1 - cumulative - (1 - top_p)) < 1e-9):
        return  # the two top-p conventions may differ exactly at the boundary (docs/algorithms.md section 2)
    # Distinct logits can still give equal float64 probabilities; a top-p cut through such a tie keeps the
    # lowest ids here (the documented rule) and the highest logits in HF. Both keep the same multiset of
    # probabilities, and every token kept by one rule only ties in probability with one kept by the other.
    np.testing.assert_allclose(np.sort(ours), np.sort(theirs), atol=1e-12)
    ours_only = np.flatnonzero((ours > 0) & (theirs == 0))
    theirs_only = np.flatnonzero((theirs > 0) & (ours == 0))
    assert ours_only.size == theirs_only.size
    after_top_k = decoding_operator(logits, temperature, top_k=top_k)
    swapped = np.concatenate((ours_only, theirs_only))
    assert np.unique(after_top_k[swapped]).size <= 1  # only tokens of one tied probability swap
    np.testing.assert_allclose(np.delete(ours, swapped), np.delete(theirs, swapped), atol=1e-12)


@pytest.mark.parametrize(
    ("logits", "kwargs", "message"),
    [
        ([0.0, float("nan")], {"temperature": 1.0}, r"logits\[1\]=nan"),
        ([0.0, float("inf")], {"temperature": 1.0}, r"logits\[1\]=inf"),
        ([float("-inf")] * 3, {"temperature": 1.0}, "all -inf"),
        ([0.0, 1.0], {"temperature": -0.5}, "temperature=-0.5"),
        ([0.0, 1.0], {"temperature": 1.0, "top_p": 0.0}, "top_p=0.0"),
        ([0.0, 1.0], {"temperature": 1.0, "top_p": 1.5}, "top_p=1.5"),
        ([0.0, 1.0], {"temperature": 1.0, "top_k": 0}, "top_k=0"),
        ([[0.0, 1.0]], {"temperature": 1.0}, r"shape \(1, 2\)"),
        ([], {"temperature": 1.0}, "non-empty"),
    ],
)
def test_bad_decoding_input_raises_value_error_naming_the_argument(logits: list[float], kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decoding_operator(logits, **kwargs)  # type: ignore[arg-type]


def test_minus_infinity_logits_get_exactly_zero_probability() -> None:
    probs = decoding_operator([0.0, float("-inf"), 1.0], 1.0)
    assert probs[1] == 0.0 and abs(probs.sum() - 1) < 1e-15
