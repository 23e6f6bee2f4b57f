"""spec_fast.decoding_operator against spec_ref.decoding_operator: same kept sets, same tie-breaks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import spec_ref
from spec_fast import decoding_operator


def _reference(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    return spec_ref.decoding_operator(
        logits.to(torch.float64).numpy(), temperature, top_k if top_k > 0 else None, top_p if top_p < 1 else None
    )


def _near_top_p_boundary(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> bool:
    """Whether the reference's kept set changes when top_p moves by 1e-6 (a mass within rounding of it)."""
    if top_p >= 1 or temperature == 0:
        return False
    lo = _reference(logits, temperature, top_k, max(top_p - 1e-6, 1e-9)) > 0
    hi = _reference(logits, temperature, top_k, min(top_p + 1e-6, 1.0)) > 0
    return bool((lo != hi).any())


@st.composite
def decoding_cases(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    batch = draw(st.integers(1, 5))
    vocab = draw(st.integers(1, 12))
    # logits from a small grid so ties (at top-k thresholds and in the greedy argmax) are common
    values = st.sampled_from([-3.0, -1.0, -0.5, 0.0, 0.25, 1.0, 2.0, 2.5, float("-inf")])
    rows = []
    for _ in range(batch):
        row = draw(st.lists(values, min_size=vocab, max_size=vocab))
        if all(v == float("-inf") for v in row):
            row[0] = 0.0
        rows.append(row)
    temperature = draw(st.lists(st.sampled_from([0.0, 0.3, 0.7, 1.0, 2.0]), min_size=batch, max_size=batch))
    top_k = draw(st.lists(st.integers(0, vocab + 1), min_size=batch, max_size=batch))
    top_p = draw(st.lists(st.sampled_from([1.0, 0.999, 0.9, 0.5, 0.3, 0.05]), min_size=batch, max_size=batch))
    return (torch.tensor(rows, dtype=torch.float32), torch.tensor(temperature), torch.tensor(top_k), torch.tensor(top_p))


@settings(max_examples=150)
@given(case=decoding_cases())
def test_kept_sets_and_probabilities_match_the_reference_operator(case: tuple[torch.Tensor, ...]) -> None:
    logits, temperature, top_k, top_p = case
    probs = decoding_operator(logits, temperature, top_k, top_p)
    assert probs.dtype == torch.float32 and probs.shape == logits.shape
    for b in range(logits.shape[0]):
        t, k, p = float(temperature[b]), int(top_k[b]), float(top_p[b])
        expected = _reference(logits[b], t, k, p)
        if _near_top_p_boundary(logits[b], t, k, p):
            continue  # a top-p mass within rounding of top_p: float32/float64 may keep different sets
        assert ((probs[b] > 0).numpy() == (expected > 0)).all(), (b, probs[b], expected)
        np.testing.assert_allclose(probs[b].numpy(), expected, rtol=2e-6, atol=1e-7)


def test_greedy_rows_are_one_hot_at_the_first_maximum_whatever_top_k_and_top_p() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, -1.0], [0.0, 0.0, 0.0, 0.0]])
    probs = decoding_operator(logits, torch.zeros(2), torch.tensor([1, 0]), torch.tensor([0.1, 1.0]))
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]


def test_top_k_keeps_every_token_tied_at_the_threshold() -> None:
    logits = torch.tensor([[2.0, 1.0, 1.0, 0.0]])
    probs = decoding_operator(logits, torch.ones(1), torch.tensor([2]), torch.ones(1))
    assert (probs[0] > 0).tolist() == [True, True, True, False]


def test_top_p_keeps_the_shortest_prefix_reaching_the_mass() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    kept = decoding_operator(logits, torch.ones(1), torch.zeros(1, dtype=torch.long), torch.tensor([0.75])) > 0
    assert kept[0].tolist() == [True, True, False]


def test_a_realistic_vocabulary_matches_the_reference_on_random_logits() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 49152, generator=gen) * 4
    temperature = torch.tensor([0.7, 1.0, 1.3, 0.0])
    top_k = torch.tensor([50, 0, 1000, 0])
    top_p = torch.tensor([0.9, 0.95, 1.0, 1.0])
    probs = decoding_operator(logits, temperature, top_k, top_p)
    for b in range(4):
        expected = _reference(logits[b], float(temperature[b]), int(top_k[b]), float(top_p[b]))
        assert ((probs[b] > 0).numpy() == (expected > 0)).all()
        np.testing.assert_allclose(probs[b].numpy(), expected, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize(
    ("shape", "param_shape", "message"), [((2, 3, 4), (2,), "logits"), ((2, 4), (3,), "temperature.shape")]
)
def test_bad_shapes_raise_value_error_naming_the_argument(shape: tuple[int, ...], param_shape: tuple[int, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decoding_operator(torch.zeros(shape), torch.ones(param_shape), torch.zeros(param_shape, dtype=torch.long), torch.ones(param_shape))


@pytest.mark.parametrize("vocab", [2, 7, 64, 49152])
def test_without_filters_the_unsorted_path_gives_the_sorted_paths_bits(vocab: int) -> None:
    # filtered=False skips the sort when no row uses top-k or top-p: the same probabilities bit for bit,
    # greedy rows, a tiny temperature and -inf logits included
    gen = torch.Generator().manual_seed(vocab)
    for trial in range(10):
        logits = torch.randn(4, vocab, generator=gen) * (1 + 5 * trial)
        logits[0, : vocab // 2] = -float("inf")
        temperature = torch.tensor([0.7, 0.0, 1e-30, 1.3], dtype=torch.float64)
        off_k, off_p = torch.tensor([0, 0, vocab, 0]), torch.ones(4)
        sorted_path = decoding_operator(logits, temperature, off_k, off_p, validate=False)
        assert torch.equal(decoding_operator(logits, temperature, off_k, off_p, validate=False, filtered=False),
                           sorted_path)
    # negative control: with a filter in force the unsorted path (which ignores filters) differs
    top_p = torch.full((4,), 0.5)
    assert not torch.equal(decoding_operator(logits, temperature, off_k, top_p, validate=False, filtered=False),
                           decoding_operator(logits, temperature, off_k, top_p, validate=False))


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1e-30, 2.5])
def test_one_requests_sampling_probs_are_the_operators_bits(temperature: float) -> None:
    # sampling_probs takes a shorter path for a request known not greedy and unfiltered: the same bits
    from spec_fast.decoding import SamplingParams, sampling_probs

    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 2, 4096, generator=gen) * 4
    logits[0, 0, :100] = -float("inf")
    flat = logits.reshape(6, 4096)
    expected = decoding_operator(flat, torch.full((6,), temperature, dtype=torch.float64),
                                 torch.zeros(6, dtype=torch.long), torch.ones(6), validate=False)
    assert torch.equal(sampling_probs(logits, SamplingParams(temperature=temperature)), expected.reshape(logits.shape))
