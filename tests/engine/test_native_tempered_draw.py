"""The native draw from a tempered softmax (``spec_fast_tempered_draw`` in spec_fast/lean/kernels.c) behind
:func:`spec_fast.engine.step_verify.draw_plain`, the sampled token of a plain step on the CPU.

* its law: over a grid of 2**16 evenly spaced uniforms, the share of draws of every index is
  ``softmax((logits - max) / T)`` within the grid's resolution (an index's uniforms form one interval), for
  temperatures from 0.05 to 3 and rows with -inf logits, in the native and the portable build;
* it never draws a token of zero weight (a -inf logit), whatever the uniform; a row with no positive weight
  gives its first maximum; rows of other strides and temperatures are drawn independently;
* against torch's G and inverse-CDF draw it picks the same token but where a uniform sits within float
  rounding of a boundary;
* ``draw_plain`` takes it only for unfiltered sampled CPU float32 rows where the library is loaded (top-k and
  top-p rows take the filtered draw, tests/engine/test_native_filtered_draw.py) and is torch's draw without
  the library, so plain steps and the general step's plain rows draw alike (tests/engine/test_plain_step.py
  runs both).
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


def counted_hook(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Wraps the native hook ``spec_fast._sampling.<name>`` so that each call appends to the list returned."""
    calls: list[int] = []
    hook = getattr(_sampling, name)
    assert hook is not None

    def counted(*args: Any) -> Any:
        calls.append(1)
        return hook(*args)

    monkeypatch.setattr(_sampling, name, counted)
    return calls


def test_draw_plain_takes_the_sweep_only_for_unfiltered_cpu_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = counted_hook(monkeypatch, "native_tempered_draw")
    logits = 3 * torch.randn(3, 500, generator=torch.Generator().manual_seed(4))
    uniforms = torch.tensor([0.1, 0.5, 0.9])
    plain = [SamplingParams(temperature=0.7), SamplingParams(temperature=1.2), SamplingParams(temperature=0.01)]
    expected = row_ops.tempered_draw(logits, torch.tensor([0.7, 1.2, 0.01]), uniforms)
    assert torch.equal(draw_plain(logits, plain, uniforms), expected) and len(calls) == 1
    for filtered, k, p in (([SamplingParams(temperature=0.7, top_k=20)] * 3, 20, 1.0),
                           ([SamplingParams(temperature=0.7, top_p=0.9)] * 3, 0, 0.9)):
        native_filtered = row_ops.filtered_draw(logits, torch.full((3,), 0.7), torch.full((3,), k),
                                                torch.full((3,), p, dtype=torch.float32).double(), uniforms)
        assert torch.equal(draw_plain(logits, filtered, uniforms), native_filtered)
    assert len(calls) == 1  # top-k and top-p rows take the filtered draw (tests/engine/test_native_filtered_draw.py)
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
    with pytest.raises(ValueError, match="^logits must have V >= 1 values of unit stride in its last dimension"):
        row_ops.tempered_draw(torch.zeros(4, 2).t(), good[1], good[2])
    with pytest.raises(ValueError, match=r"^temperature must have shape \[2\]"):
        row_ops.tempered_draw(good[0], torch.ones(3), good[2])
    with pytest.raises(ValueError, match="^uniforms must be torch.float32"):
        row_ops.tempered_draw(good[0], good[1], good[2].double())


# ------------------------------------------------------------------ naive verification of sampled chains
def test_tempered_probs_are_the_tempered_softmax() -> None:
    generator = torch.Generator().manual_seed(6)
    logits = 3 * torch.randn(3, 700, generator=generator)
    logits[1, 10] = float("-inf")
    temperature = torch.tensor([0.5, 0.9, 2.0])
    probs = row_ops.tempered_probs(logits, temperature)
    expected = torch.softmax((logits.double() - logits.max(dim=1, keepdim=True).values.double())
                             / temperature.double().unsqueeze(1), dim=1)
    torch.testing.assert_close(probs.double(), expected, rtol=2e-6, atol=1e-9)
    assert float(probs[1, 10]) == 0.0
    assert row_ops.tempered_probs(torch.full((1, 4), float("-inf")), torch.ones(1)).tolist() == [[0.0] * 4]


def test_the_native_chain_verification_is_verify_tree_naive_on_its_p() -> None:
    """Stops and next tokens of ``naive_chain`` against ``verify_tree("naive")`` handed the p it computes
    (:func:`row_ops.tempered_probs`), on chains cut to random depths, drafts from q or from p."""
    from spec_fast.verify import verify_tree
    from tests.engine.test_sampled_chain_host import random_chain

    generator = torch.Generator().manual_seed(7)
    depths = set()
    for trial in range(150):
        vocab = (5, 48, 9000)[trial % 3]
        batch, depth = int(torch.randint(1, 4, (1,), generator=generator)), int(torch.randint(1, 4, (1,),
                                                                                               generator=generator))
        draft, _ = random_chain(generator, batch, depth, vocab, trial % 2 == 0)
        assert draft.draft_probs is not None
        logits = 3 * torch.randn(batch, depth + 1, vocab, generator=generator)
        temperature = 0.3 + torch.rand(batch, generator=generator)
        probs = torch.stack([row_ops.tempered_probs(logits[:, s].contiguous(), temperature)
                             for s in range(depth + 1)], dim=1)
        if trial % 2 == 0:  # drafted tokens likely under p: most levels accepted
            drafted = torch.multinomial(probs[:, :depth].reshape(-1, vocab), 1, generator=generator).view(batch, depth)
            valid_draws = draft.tree.draws[:, :, 0] >= 0
            child = torch.where(valid_draws[:, :depth], drafted, draft.tree.draws[:, :depth, 0])
            draft.tree.draws[:, :depth, 0] = child
            draft.tree.tokens[:, 1:] = torch.where(draft.tree.valid[:, 1:], child, draft.tree.tokens[:, 1:])
        uniforms = torch.randint(0, 1 << 24, (batch, depth + 1, 2), generator=generator).float() / (1 << 24)
        stop, token = row_ops.naive_chain(logits, temperature, draft.tree.draws[:, :, 0].contiguous(),
                                          draft.draft_probs.contiguous(), uniforms[:, :, 0].contiguous(),
                                          uniforms[:, :, 1].contiguous())
        general = verify_tree("naive", draft.tree, probs, draft.draft_probs, uniforms, max_depth=draft.max_depth,
                              validate=False)
        assert torch.equal(stop, general.accepted_depth) and torch.equal(token, general.next_token)
        depths.update(stop.tolist())
    assert depths == {0, 1, 2, 3}


@pytest.mark.parametrize("temperature", [0.6, 1.4])
def test_the_native_chain_emits_tokens_with_the_targets_law(temperature: float) -> None:
    """Losslessness of one level: the draft token x drawn from q, u0 and u1 over a 128 x 128 grid, the first
    emitted token (x where accepted, else the residual's draw) has law p (the target's tempered softmax), to
    within the grids' resolution; a q far from p and one close to it."""
    generator = torch.Generator().manual_seed(int(10 * temperature))
    vocab, grid = 6, 128
    logits = 2 * torch.randn(1, 2, vocab, generator=generator)
    p = row_ops.tempered_probs(logits[:, 0].contiguous(), torch.tensor([temperature]))[0].double()
    for q in (torch.softmax(torch.randn(vocab, generator=generator), dim=0), 0.8 * p.float() + 0.2 / vocab):
        law = torch.zeros(vocab, dtype=torch.float64)
        steps = (torch.arange(grid, dtype=torch.float32) + 0.5) / grid
        u0 = steps.repeat_interleave(grid).unsqueeze(1).expand(-1, 2).contiguous()
        u1 = steps.repeat(grid).unsqueeze(1).expand(-1, 2).contiguous()
        rows = grid * grid
        for x in range(vocab):
            child = torch.tensor([[x, -1]]).expand(rows, 2).contiguous()
            draft_probs = torch.stack([q.float(), torch.zeros(vocab)]).unsqueeze(0).expand(rows, 2, vocab).contiguous()
            stop, token = row_ops.naive_chain(logits.expand(rows, 2, vocab).contiguous(),
                                              torch.full((rows,), temperature), child, draft_probs, u0, u1)
            first = torch.where(stop > 0, torch.full_like(token, x), token)
            law += float(q[x]) * torch.bincount(first, minlength=vocab).double() / rows
        assert float((law - p).abs().max()) <= 3.0 / grid


def test_verify_sampled_takes_the_native_chain_for_unfiltered_cpu_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    from spec_fast.engine import step_verify
    from tests.engine.test_sampled_chain_host import random_chain

    calls: list[int] = []
    native_chain = _sampling.native_naive_chain
    assert native_chain is not None
    monkeypatch.setattr(_sampling, "native_naive_chain", lambda *args: calls.append(1) or native_chain(*args))
    generator = torch.Generator().manual_seed(8)
    draft, _ = random_chain(generator, 2, 3, 300, False)
    assert draft.draft_probs is not None
    logits = 3 * torch.randn(2, 4, 300, generator=generator)
    streams = step_verify.VerifyStreams(torch.tensor([3, 4]), torch.tensor([0, 0]))
    unfiltered = [SamplingParams(temperature=0.7), SamplingParams(temperature=1.1)]
    out, _ = step_verify.verify_sampled("naive", 1, draft, logits, draft.draft_probs, unfiltered, streams)
    assert len(calls) == 1
    uniforms = streams.uniforms((2, 4, 2))
    stop, token = row_ops.naive_chain(logits, torch.tensor([0.7, 1.1]), draft.tree.draws[:, :, 0].contiguous(),
                                      draft.draft_probs, uniforms[:, :, 0].contiguous(), uniforms[:, :, 1].contiguous())
    assert torch.equal(out.accepted_depth, stop) and torch.equal(out.next_token, token)
    top_k = [SamplingParams(temperature=0.7, top_k=50)] * 2  # filtered: torch's G, verified on the host
    out, _ = step_verify.verify_sampled("naive", 1, draft, logits, draft.draft_probs, top_k, streams)
    host = step_verify.verify_naive_chain_on_host(draft, step_verify.target_probs(logits, top_k), draft.draft_probs,
                                                  uniforms)
    assert len(calls) == 1 and torch.equal(out.next_token, host.next_token)
