"""The native draw from a tempered softmax (``spec_fast_tempered_draw`` in spec_fast/lean/kernels.c) behind
:func:`spec_fast.engine.step_verify.draw_plain`, the sampled token of a plain step on the CPU.

* its law: over a grid of 2**16 evenly spaced uniforms, the share of draws of every index is
  ``softmax((logits - max) / T)`` within the grid's resolution (an index's uniforms form one interval), for
  temperatures from 0.05 to 3 and rows with -inf logits, in the native and the portable build;
* it never draws a token of zero weight (a -inf logit), whatever the uniform; a row with no positive weight
  gives its first maximum; rows of other strides and temperatures are drawn independently;
* against torch's G and inverse-CDF draw it picks the same token but where a uniform sits within float
  rounding of a boundary;
* ``draw_plain`` takes it only for unfiltered sampled CPU float32 rows where the library is loaded, and is
  torch's draw otherwise (top-k, top-p, without the library), so plain steps and the general step's plain
  rows draw alike (tests/engine/test_plain_step.py runs both).
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

pytestmark = pytest.mark.usefixtures("native_kernels")

GRID = 1 << 16


def shares(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``[V]``: the share of each index among the draws of one row over ``GRID`` evenly spaced uniforms."""
    uniforms = (torch.arange(GRID, dtype=torch.float32) + 0.5) / GRID
    rows = logits.expand(GRID, -1).contiguous()
    drawn = row_ops.tempered_draw(rows, torch.full((GRID,), temperature), uniforms)
    return torch.bincount(drawn, minlength=logits.shape[-1]).double() / GRID


@pytest.mark.parametrize("temperature", [0.05, 0.7, 1.0, 3.0])
def test_the_draws_follow_the_tempered_softmax(temperature: float) -> None:
    generator = torch.Generator().manual_seed(int(100 * temperature))
    logits = 3 * torch.randn(1, 24, generator=generator)
    logits[0, 5] = logits[0, 17] = float("-inf")
    expected = torch.softmax((logits[0].double() - logits.max().double()) / temperature, dim=0)
    got = shares(logits, temperature)
    # each index's uniforms form one interval, so its share is its mass to within one grid step (+ rounding)
    assert float((got - expected).abs().max()) <= 1.0 / GRID + 1e-6
    assert float(got[5]) == float(got[17]) == 0.0


def test_the_portable_build_draws_the_same_law(portable: Any) -> None:  # noqa: F811
    logits = 2 * torch.randn(1, 40, generator=torch.Generator().manual_seed(5))
    logits[0, 3] = float("-inf")
    expected = torch.softmax((logits[0].double() - logits.max().double()) / 0.8, dim=0)
    with native.using(portable):
        got = shares(logits, 0.8)
    assert float((got - expected).abs().max()) <= 1.0 / GRID + 1e-6 and float(got[3]) == 0.0


def test_no_token_of_zero_weight_and_degenerate_rows_stay_in_the_vocabulary() -> None:
    width = 49152
    logits = torch.full((4, width), float("-inf"))
    logits[0, 7] = 0.0  # one token
    logits[1, [3, 40000]] = 2.0  # two tokens of equal weight
    logits[2] = float("-inf")  # no positive weight: the first maximum
    logits[3, 9] = float("nan")  # NaN weighs 0, the rest -inf: the first maximum (the NaN)
    edge = torch.tensor([0.0, 1.0 - 2.0 ** -24, 0.5, 0.25])
    for u in (edge, edge.roll(1), edge.roll(2), edge.roll(3)):
        drawn = row_ops.tempered_draw(logits, torch.full((4,), 0.7), u).tolist()
        assert drawn[0] == 7 and drawn[1] in (3, 40000) and drawn[2] == 0 and drawn[3] == 9
    tiny = torch.tensor([torch.finfo(torch.float32).tiny])  # T -> 0: the maximum alone has weight
    row = torch.randn(1, 1000, generator=torch.Generator().manual_seed(1))
    assert row_ops.tempered_draw(row, tiny, torch.tensor([0.999])).tolist() == [int(row.argmax())]


def test_rows_are_drawn_independently_of_their_neighbours_and_strides() -> None:
    generator = torch.Generator().manual_seed(2)
    wide = 4 * torch.randn(5, 3000, generator=generator)
    logits = wide[:, 100:2100]  # rows of stride 3000
    temperature = torch.tensor([0.3, 0.7, 1.0, 1.5, 2.0])
    uniforms = torch.rand(5, generator=generator)
    together = row_ops.tempered_draw(logits, temperature, uniforms)
    alone = [int(row_ops.tempered_draw(logits[r:r + 1].contiguous(), temperature[r:r + 1], uniforms[r:r + 1]))
             for r in range(5)]
    assert together.tolist() == alone


def test_the_same_token_as_torchs_draw_but_within_rounding_of_a_boundary() -> None:
    generator = torch.Generator().manual_seed(3)
    logits = 4 * torch.randn(1, 49152, generator=generator)
    sampling = SamplingParams(temperature=0.7)
    probs = target_probs(logits, [sampling])
    cumulative = torch.cumsum(probs[0].double(), dim=0)
    uniforms = torch.rand(3000, generator=generator)
    native_tokens = row_ops.tempered_draw(logits.expand(3000, -1).contiguous(), torch.full((3000,), 0.7), uniforms)
    for u, token in zip(uniforms.tolist(), native_tokens.tolist(), strict=True):
        reference = int(_inverse_cdf(probs, torch.tensor([u])))
        if token != reference:  # only where u sits within float32 rounding of the boundary between the two
            boundary = float(cumulative[min(token, reference)])
            assert abs(u * float(cumulative[-1]) - boundary) < 1e-5


def test_draw_plain_takes_the_sweep_only_for_unfiltered_cpu_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    sweep = _sampling.native_tempered_draw
    assert sweep is not None

    def counted(*args: Any) -> Any:
        calls.append(1)
        return sweep(*args)

    monkeypatch.setattr(_sampling, "native_tempered_draw", counted)
    logits = 3 * torch.randn(3, 500, generator=torch.Generator().manual_seed(4))
    uniforms = torch.tensor([0.1, 0.5, 0.9])
    plain = [SamplingParams(temperature=0.7), SamplingParams(temperature=1.2), SamplingParams(temperature=0.01)]
    expected = row_ops.tempered_draw(logits, torch.tensor([0.7, 1.2, 0.01]), uniforms)
    assert torch.equal(draw_plain(logits, plain, uniforms), expected) and len(calls) == 1
    for filtered in ([SamplingParams(temperature=0.7, top_k=20)] * 3, [SamplingParams(temperature=0.7, top_p=0.9)] * 3):
        torch_draw = _inverse_cdf(target_probs(logits, filtered), uniforms)
        assert torch.equal(draw_plain(logits, filtered, uniforms), torch_draw)
    assert len(calls) == 1  # top-k and top-p rows take torch's G and draw
    assert torch.equal(draw_plain(logits, [SamplingParams(temperature=0.7, top_k=500)] * 3, uniforms),
                       row_ops.tempered_draw(logits, torch.full((3,), 0.7), uniforms))  # top-k = V cuts nothing
    with native.disabled():
        monkeypatch.setattr(_sampling, "native_tempered_draw", lambda *args: None)  # not loaded: torch's draw
        assert torch.equal(draw_plain(logits, plain, uniforms),
                           _inverse_cdf(target_probs(logits, plain), uniforms))


def test_the_sweep_refuses_what_it_cannot_read() -> None:
    good = (torch.zeros(2, 4), torch.ones(2), torch.zeros(2))
    with pytest.raises(ValueError, match="^logits must be torch.float32"):
        row_ops.tempered_draw(good[0].double(), good[1], good[2])
    with pytest.raises(ValueError, match=r"^logits must be \[R, V\] with V >= 1 and rows of unit stride"):
        row_ops.tempered_draw(torch.zeros(4, 2).t(), good[1], good[2])
    with pytest.raises(ValueError, match=r"^temperature must have shape \[2\]"):
        row_ops.tempered_draw(good[0], torch.ones(3), good[2])
    with pytest.raises(ValueError, match="^uniforms must be torch.float32"):
        row_ops.tempered_draw(good[0], good[1], good[2].double())
