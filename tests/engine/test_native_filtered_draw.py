"""The native draw from G with top-k and top-p (``spec_fast_filtered_draw`` in spec_fast/lean/kernels.c) behind
:func:`spec_fast.engine.step_verify.draw_plain`, the sampled token of a plain step on the CPU.

* its law: over a grid of 2**15 evenly spaced uniforms, the share of draws of every index is G's probability
  (``target_probs``: torch's sort, float64 top-p mass, float32 softmax) within the grid's resolution, and it
  never draws a token G gives no mass, for top-k alone (the heap and the quickselect), top-p alone (the
  logit floor and the chunked ordering), both, ties at the k-th logit and across the top-p boundary, -inf
  logits, in the native and the portable build;
* rows without either cut draw exactly what ``tempered_draw`` draws; rows are drawn independently of their
  neighbours, strides and parameters;
* against torch's G and inverse-CDF draw it picks the same token but where a uniform sits within float
  rounding of a boundary;
* degenerate rows stay in the vocabulary (all -inf, NaN, top_k 1, a tiny top_p);
* ``draw_plain`` takes it for filtered sampled CPU float32 rows where the library is loaded, torch's draw
  without it.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from spec_fast import _sampling
from spec_fast._sampling import _inverse_cdf
from spec_fast.decoding import SamplingParams
from spec_fast.engine.step_verify import draw_plain, target_probs
from spec_fast.lean import native, row_ops
from tests.engine.test_native_boundary import portable  # noqa: F401  (the fixture)
from tests.engine.test_native_tempered_draw import counted_hook

pytestmark = pytest.mark.usefixtures("native_kernels")

GRID = 1 << 15


def cuts(sampling: SamplingParams, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``(temperature, top_k, top_p)`` tensors of ``rows`` rows with ``sampling``'s parameters, top_p rounded to
    float32 as G's parameter tensor holds it."""
    return (torch.full((rows,), sampling.temperature), torch.full((rows,), sampling.top_k, dtype=torch.int64),
            torch.full((rows,), sampling.top_p, dtype=torch.float32).double())


def shares(logits: torch.Tensor, sampling: SamplingParams, grid: int = GRID) -> torch.Tensor:
    """``[V]``: the share of each index among the draws of one row over ``grid`` evenly spaced uniforms (the
    row read ``grid`` times through a view of row stride 0)."""
    uniforms = (torch.arange(grid, dtype=torch.float32) + 0.5) / grid
    drawn = row_ops.filtered_draw(logits.expand(grid, -1), *cuts(sampling, grid), uniforms)
    return torch.bincount(drawn, minlength=logits.shape[-1]).double() / grid


def row(vocab: int, seed: int, ties: bool = False, minus_inf: bool = False) -> torch.Tensor:
    logits = 3 * torch.randn(1, vocab, generator=torch.Generator().manual_seed(seed))
    if ties:
        logits[0, : vocab // 3] = logits[0, 0]
    if minus_inf:
        logits[0, [1, 5]] = float("-inf")
    return logits


CASES = [  # (vocab, T, top_k, top_p, ties, -inf)
    (49152, 0.7, 50, 1.0, False, False),  # top-k by the heap
    (49152, 1.3, 4000, 1.0, False, True),  # top-k by the quickselect (k > V / 16)
    (49152, 0.7, 0, 0.9, False, False),  # top-p: the logit floor, then chunks
    (49152, 2.5, 0, 0.99, False, False),  # top-p over thousands of tokens: several chunks
    (49152, 0.7, 40, 0.95, False, True),  # both
    (200, 0.5, 5, 0.5, True, False),  # ties at the k-th logit and across the top-p boundary
    (200, 1.0, 0, 0.3, True, True),
    (30, 0.7, 3, 1.0, True, False),
    (30, 1.0, 29, 0.8, False, True),
]


@pytest.mark.parametrize(("vocab", "temperature", "top_k", "top_p", "ties", "minus_inf"), CASES)
def test_the_draws_follow_g(vocab: int, temperature: float, top_k: int, top_p: float, ties: bool,
                            minus_inf: bool) -> None:
    logits = row(vocab, vocab + top_k, ties, minus_inf)
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    expected = target_probs(logits, [sampling])[0].double()
    # a draw over 49152 logits costs ~0.1 ms, and ~3 ms where top-p keeps most of a flat row
    grid = GRID if vocab <= 3000 else GRID // 8 if top_p < 0.99 else GRID // 32
    got = shares(logits, sampling, grid)
    # each index's uniforms form one interval, so its share is its mass to within one grid step (+ rounding)
    assert float((got - expected).abs().max()) <= 1.0 / grid + 1e-6
    assert bool((got[expected == 0] == 0).all())  # never a token G cuts or gives no weight


def test_the_portable_build_draws_the_same_law(portable: Any) -> None:  # noqa: F811
    logits = row(3000, 9, ties=True, minus_inf=True)
    for sampling in (SamplingParams(temperature=0.8, top_k=30), SamplingParams(temperature=0.8, top_p=0.7),
                     SamplingParams(temperature=0.8, top_k=400, top_p=0.9)):
        expected = target_probs(logits, [sampling])[0].double()
        with native.using(portable):
            got = shares(logits, sampling)
        assert float((got - expected).abs().max()) <= 1.0 / GRID + 1e-6 and bool((got[expected == 0] == 0).all())


def test_rows_without_cuts_draw_what_the_tempered_draw_draws() -> None:
    generator = torch.Generator().manual_seed(11)
    logits = 4 * torch.randn(64, 5000, generator=generator)
    uniforms = torch.rand(64, generator=generator)
    temperature = torch.rand(64, generator=generator) + 0.2
    off = (torch.tensor([0, 5000, 9000] * 21 + [0]), torch.ones(64, dtype=torch.float64))  # k 0 or >= V: off
    assert torch.equal(row_ops.filtered_draw(logits, temperature, *off, uniforms),
                       row_ops.tempered_draw(logits, temperature, uniforms))


def test_rows_are_drawn_independently_of_their_neighbours_strides_and_parameters() -> None:
    generator = torch.Generator().manual_seed(2)
    wide = 4 * torch.randn(5, 3000, generator=generator)
    logits = wide[:, 100:2100]  # rows of stride 3000
    temperature = torch.tensor([0.3, 0.7, 1.0, 1.5, 2.0])
    top_k = torch.tensor([0, 10, 0, 700, 1])
    top_p = torch.tensor([0.9, 1.0, 0.5, 0.95, 0.2], dtype=torch.float64)
    uniforms = torch.rand(5, generator=generator)
    together = row_ops.filtered_draw(logits, temperature, top_k, top_p, uniforms)
    alone = [int(row_ops.filtered_draw(logits[r:r + 1].contiguous(), temperature[r:r + 1], top_k[r:r + 1],
                                       top_p[r:r + 1], uniforms[r:r + 1])) for r in range(5)]
    assert together.tolist() == alone


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=0.7, top_p=0.9),
                                      SamplingParams(temperature=0.7, top_k=50),
                                      SamplingParams(temperature=1.1, top_k=200, top_p=0.95)])
def test_the_same_token_as_torchs_draw_but_within_rounding_of_a_boundary(sampling: SamplingParams) -> None:
    generator = torch.Generator().manual_seed(3)
    logits = 4 * torch.randn(1, 49152, generator=generator)
    probs = target_probs(logits, [sampling])
    cumulative = torch.cumsum(probs[0].double(), dim=0)
    uniforms = torch.rand(2000, generator=generator)
    native_tokens = row_ops.filtered_draw(logits.expand(2000, -1), *cuts(sampling, 2000), uniforms)
    reference = [int(_inverse_cdf(probs, torch.tensor([u]))) for u in uniforms[:300].tolist()]
    # the inverse CDF's index: the first whose float64 running mass exceeds u times the total
    reference += torch.searchsorted(cumulative, uniforms[300:].double() * cumulative[-1], right=True).tolist()
    for u, token, expected in zip(uniforms.tolist(), native_tokens.tolist(), reference, strict=True):
        if token != expected:  # only where u sits within float32 rounding of the boundary between the two
            assert abs(u * float(cumulative[-1]) - float(cumulative[min(token, expected)])) < 1e-5


def test_degenerate_rows_stay_in_the_vocabulary() -> None:
    width = 49152
    logits = torch.full((5, width), float("-inf"))
    logits[0, 7] = 0.0  # one token
    logits[1] = float("nan")  # NaN everywhere: the first maximum
    logits[2] = 0.0
    logits[2, 123] = logits[2, 40000] = 1.0  # top_k 1 keeps both maxima (top-k keeps ties), of equal weight
    logits[3] = torch.linspace(-3, 3, width)  # a tiny top_p: the maximum alone
    # row 4 all -inf: no positive weight, the first maximum
    temperature = torch.full((5,), 0.7)
    top_k = torch.tensor([5, 3, 1, 0, 2])
    top_p = torch.tensor([0.9, 0.9, 1.0, 1e-6, 0.5], dtype=torch.float64)
    for u, tie in ((0.0, 123), (0.25, 123), (0.5, 40000), (1.0 - 2.0 ** -24, 40000)):
        drawn = row_ops.filtered_draw(logits, temperature, top_k, top_p, torch.full((5,), u)).tolist()
        assert drawn == [7, 0, tie, width - 1, 0]


def test_the_draw_refuses_what_it_cannot_read() -> None:
    good = (torch.zeros(2, 4), torch.ones(2), torch.zeros(2, dtype=torch.int64), torch.ones(2, dtype=torch.float64),
            torch.zeros(2))
    with pytest.raises(ValueError, match="^logits must be torch.float32"):
        row_ops.filtered_draw(good[0].double(), *good[1:])
    with pytest.raises(ValueError, match=r"^top_k must be torch.int64"):
        row_ops.filtered_draw(good[0], good[1], good[2].int(), *good[3:])
    with pytest.raises(ValueError, match=r"^top_p must have shape \[2\]"):
        row_ops.filtered_draw(*good[:3], torch.ones(3, dtype=torch.float64), good[4])
    for bad in (0.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"^top_p must lie in \(0, 1\], got top_p\[1\]="):
            row_ops.filtered_draw(*good[:3], torch.tensor([0.5, bad], dtype=torch.float64), good[4])


def test_draw_plain_takes_it_for_filtered_cpu_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = counted_hook(monkeypatch, "native_filtered_draw")
    logits = 3 * torch.randn(3, 500, generator=torch.Generator().manual_seed(4))
    uniforms = torch.tensor([0.1, 0.5, 0.9])
    mixed = [SamplingParams(temperature=0.7, top_k=20), SamplingParams(temperature=1.2, top_p=0.9),
             SamplingParams(temperature=0.5)]
    expected = row_ops.filtered_draw(logits, torch.tensor([0.7, 1.2, 0.5]), torch.tensor([20, 0, 0]),
                                     torch.tensor([1.0, 0.9, 1.0], dtype=torch.float32).double(), uniforms)
    assert torch.equal(draw_plain(logits, mixed, uniforms), expected) and len(calls) == 1
    with native.disabled():
        monkeypatch.setattr(_sampling, "native_filtered_draw", lambda *args: None)  # not loaded: torch's draw
        monkeypatch.setattr(_sampling, "native_tempered_draw", lambda *args: None)
        assert torch.equal(draw_plain(logits, mixed, uniforms), _inverse_cdf(target_probs(logits, mixed), uniforms))
