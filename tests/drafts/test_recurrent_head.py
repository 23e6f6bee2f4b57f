"""The recurrent (``rnn``) draft head at run time: its level in one native call (spec_fast/lean/feature_mlp.py),
its weights as Q8_0 blocks, its greedy chain drafted on the host (alone and behind retrieval), the prompt it
takes without a pass, and the target's hidden states from the one-call causal pass.

Tiny random models, no download: the head is built untrained on ``tests.engine.models.tiny_llama``.
"""

from __future__ import annotations

import math
from typing import Any, cast

import pytest
import torch

from spec_fast._sampling import first_max_index
from spec_fast.decoding import SamplingParams
from spec_fast.drafts.batch import argmax_law
from spec_fast.drafts.head_drafter import path_depth
from spec_fast.drafts.heads import FeatureHead, HeadDrafter
from spec_fast.drafts.hybrid import HybridDrafter
from spec_fast.drafts.model import Drafter
from spec_fast.drafts.retrieval import RetrievalDrafter, SuffixIndex
from spec_fast.engine import SpeculativeDecoder
from spec_fast.lean import LeanLlama, native
from spec_fast.lean.block_layout import quantize_q8_0, unpack_blocks
from spec_fast.lean.feature_mlp import feature_mlp
from spec_fast.strategies import parse_strategy
from tests.engine.models import tiny_llama
from tests.engine.test_chain_verify_host import TensorRows, assert_same_draft

pytestmark = pytest.mark.usefixtures("native_kernels")

VOCAB = 64
HF_TARGET = tiny_llama(vocab_size=VOCAB, seed=3)
LEAN_TARGET = LeanLlama.from_hf(HF_TARGET)
VOCAB_SUBSET = torch.arange(0, VOCAB, 2)
PROMPTS = [[1, 5, 7, 9, 3, 2], [4, 2], [8, 8, 1, 3, 30, 2, 2, 9, 1, 6]]
INDEX = SuffixIndex([[1, 5, 7, 9, 3, 2, 2, 8, 5], [4, 2, 6, 6, 1, 4, 2], [8, 8, 1, 3, 5, 7]], VOCAB, 4)


def rnn_head(weights: str | None) -> FeatureHead:
    """An untrained rnn head on the tiny target: torch's products (``None``) or the native level."""
    torch.manual_seed(5)
    head = FeatureHead(HF_TARGET, "rnn", VOCAB_SUBSET).eval()
    for p in head.parameters():
        p.requires_grad_(False)
    if weights is not None:
        head.use_native(True, weights=weights)
    return head


def test_the_native_level_is_the_torch_heads_arithmetic_and_scores_only_the_rows_asked() -> None:
    """With float32 weights the one call gives torch's features up to the summation order; its scores are the
    subset head's of those features, bit for bit, for the rows asked only (repeats allowed), and its first
    maxima ``first_max_index``'s; ``features`` and ``level`` give the same bits."""
    torch.manual_seed(0)
    embeds, prev = torch.randn(5, 32), torch.randn(5, 32)
    reference = rnn_head(None).features(embeds[:, None], prev[:, None])[:, 0]
    head = rnn_head("float32")
    features, scores, first = head.level(embeds, prev, [4, 0, 4])
    torch.testing.assert_close(features, reference, rtol=1e-5, atol=1e-5)
    assert torch.equal(head.features(embeds[:, None], prev[:, None])[:, 0], features)
    assert scores is not None and first is not None and scores.shape == (3, VOCAB_SUBSET.numel())
    assert torch.equal(scores, head.head.scores(features[[4, 0, 4]]))
    assert torch.equal(first, first_max_index(scores))
    assert head.level(embeds, prev, None)[1:] == (None, None)


def test_q8_0_weights_stay_within_their_rounding_of_the_float32_head() -> None:
    torch.manual_seed(1)
    weight = torch.randn(70, 64)
    packed = quantize_q8_0(weight)
    restored = unpack_blocks("q8_0", packed, 70)
    step = weight.view(70, 2, 32).abs().amax(dim=-1, keepdim=True) / 127  # one step of each group
    # half a step, plus 127 steps times the float16 scale's relative rounding (at most 2^-11)
    assert bool(((restored - weight).view(70, 2, 32).abs() <= (0.5 + 127 * 2.0 ** -11) * step * 1.0001).all())
    exact = torch.randint(-127, 128, (64, 32)).float() * 0.125  # values on the grid of a float16 scale
    exact[:, 0] = 127 * 0.125  # each group's largest sets the scale to exactly 0.125
    assert torch.equal(unpack_blocks("q8_0", quantize_q8_0(exact), 64), exact)
    embeds, prev = torch.randn(6, 32), torch.randn(6, 32)
    wide = rnn_head("float32").level(embeds, prev, None)[0]
    narrow = rnn_head("q8_0").level(embeds, prev, None)[0]
    assert not torch.equal(narrow, wide)
    torch.testing.assert_close(narrow, wide, rtol=0.0, atol=0.05 * float(wide.abs().max()))


def test_the_native_level_rejects_what_it_cannot_read() -> None:
    head = rnn_head("q8_0")
    weights = head._native
    assert weights is not None and weights.kind == "q8_0"
    good = torch.zeros(2, 32)
    with pytest.raises(ValueError, match="head_rows"):
        feature_mlp(weights, good, good, [2])
    with pytest.raises(ValueError, match="embeds"):
        feature_mlp(weights, torch.zeros(2, 31), good, [0])
    with pytest.raises(ValueError, match="prev"):
        feature_mlp(weights, good, torch.zeros(3, 32), [0])
    with pytest.raises(ValueError, match="weights must be"):
        head.use_native(True, weights="q4_1")


def head_state(drafter: Drafter, state: Any) -> tuple[Any, ...]:
    model = state.model if isinstance(drafter, HybridDrafter) else state
    confidences = model.confidences
    retrieval: tuple[Any, ...] = ()
    if isinstance(drafter, HybridDrafter):
        retrieval = (state.retrieval.block_tokens, state.retrieval.match_lengths)
        # the host path scores the head only where retrieval's match is short: the law it supplies there
        confidences = [[c if m < drafter.min_match else None for c, m in zip(row, lengths, strict=True)] if row else []
                       for row, lengths in zip(confidences, state.retrieval.match_lengths, strict=True)]
    return (model.block_features.tolist(), model.cache.num_block, model.cache.passes, str(confidences), *retrieval)


def drafters(weights: str | None, path_acceptance: float | None = None) -> list[Drafter]:
    return [HeadDrafter(rnn_head(weights), path_acceptance=path_acceptance),
            HybridDrafter(RetrievalDrafter(INDEX, VOCAB, 4), HeadDrafter(rnn_head(weights), path_acceptance=path_acceptance), 2)]


@pytest.mark.parametrize("path_acceptance", [None, 0.02])
@pytest.mark.parametrize("weights", [None, "q8_0"])
def test_a_recurrent_chain_drafted_on_the_host_is_the_tensor_paths_draft(weights: str | None,
                                                                         path_acceptance: float | None) -> None:
    """The greedy chain of the rnn head (alone, and behind retrieval, which scores the model only where its
    match is short) drafted on the host against the same drafter's tensor path: equal drafts and equal
    drafter states (features, block, passes, the laws' top probabilities), for pending chains of different
    lengths, at the strategy's depth and cut by a path rule."""
    for drafter in drafters(weights, path_acceptance):
        assert drafter.greedy_next_rows is not None  # type: ignore[attr-defined]
        drafts, states = [], []
        for seen in (drafter, cast(Drafter, TensorRows(drafter))):
            decoder = SpeculativeDecoder(LEAN_TARGET, seen, parse_strategy("chain:4"))
            state = decoder.begin(PROMPTS, [9, 9, 9], [SamplingParams()] * 3, [0, 1, 2], set())
            state.heads[0].pending[1] = [5, 7] + state.heads[0].pending[1]
            drafts.append(decoder.proposer.draft(state, 4, argmax_law, decoder.device)[0])
            states.append(head_state(drafter, state.heads[0].state))
        host, tensors = drafts
        assert states[0] == states[1]
        assert_same_draft(host, tensors)
        if path_acceptance is None:
            assert host.max_depth == 4
        else:  # some rows cut, some not
            depths = host.tree.valid.sum(dim=1).tolist()
            assert min(depths) < 5 and max(depths) > 2, depths
        if isinstance(drafter, HeadDrafter):  # the head alone drafts subset ids only
            assert bool((host.tree.tokens[:, 1:] % 2 == 0).all())
        else:  # behind retrieval: some rows take a matched (odd) id, some the head's
            assert bool((host.tree.tokens[:, 1:] % 2 == 1).any()) and bool((host.tree.tokens[:, 1:] % 2 == 0).any())


@pytest.mark.parametrize("weights", [None, "float32", "q8_0"])
@pytest.mark.parametrize("strategy", ["chain:1", "chain:3"])
def test_greedy_decoding_with_the_recurrent_head_equals_plain_decoding(monkeypatch: pytest.MonkeyPatch,
                                                                       weights: str | None, strategy: str) -> None:
    """Whole decodings (the host chain, the prompt taken without a pass, the target's hidden states from the
    one-call causal pass) give plain decoding's tokens; a prompt fed through a prefill pass instead drafts
    the same chains (the same tokens and acceptance)."""
    plain = SpeculativeDecoder(LEAN_TARGET, None, parse_strategy("ar")).generate(PROMPTS, max_new_tokens=14)
    hidden_steps: list[int] = []
    step = LeanLlama.forward_step

    def counted(self: Any, *args: Any) -> Any:
        out = step(self, *args)
        hidden_steps.append(int(out.hidden_states is not None))
        return out

    monkeypatch.setattr(LeanLlama, "forward_step", counted)
    for drafter in drafters(weights):
        results = []
        for absorb in (True, False):
            if not absorb:
                drafter.absorb = None  # type: ignore[attr-defined]
            for prompts in ([PROMPTS[0]], PROMPTS):
                result = SpeculativeDecoder(LEAN_TARGET, drafter, parse_strategy(strategy)).generate(
                    prompts, max_new_tokens=14, record_trees=True)
                drafted = [tree.tokens.tolist() for tree in result.trees]  # every step's draft, the first included
                results.append((result.tokens, result.metrics.accepted_length_histogram, drafted))
        assert results[:2] == results[2:]
        assert results[1][0] == plain.tokens and results[0][0] == plain.tokens[:1]
    assert sum(hidden_steps) >= 10  # a single row's chains: the one-call pass, with the final states


def test_a_hybrids_host_level_gives_a_match_of_exactly_min_match_to_retrieval() -> None:
    """The root's context ends with a two-token datastore match ("9 3", followed by 2 there): with ``min_match=2``
    the host-drafted level takes retrieval's token, with 3 the head's, as the dense law's argmax does."""
    head = rnn_head("q8_0")
    features = torch.randn(1, 3, 32)
    for min_match, takes_retrieval in ((2, True), (3, False)):
        tokens = []
        for host in (True, False):
            hybrid = HybridDrafter(RetrievalDrafter(INDEX, VOCAB, 4), HeadDrafter(head), min_match)
            state = hybrid.begin(1, torch.device("cpu"))
            hybrid.observe_target(state, features)
            assert hybrid.absorb is not None
            hybrid.absorb(state, [[60, 9]])
            if host:
                assert hybrid.greedy_next_rows is not None
                tokens.append(hybrid.greedy_next_rows(state, [[3]], [[-1]])[0])
            else:
                tokens.append(int(hybrid.forward_last(state, torch.tensor([[3]]), torch.tensor([[-1]]))[0, 0].argmax()))
            assert state.retrieval.match_lengths == [[2]]
        assert tokens[0] == tokens[1] and (tokens[0] == 2) == takes_retrieval


def test_a_chain_goes_on_while_its_paths_estimated_acceptance_holds() -> None:
    """``path_depth``: the first level always, then each next one while the product of the estimates so far
    stays at least the threshold (NaN: certain). A hybrid counts a level retrieval supplies as certain and one
    the head supplies at the head's top probability."""
    assert path_depth([0.9, 0.5, 0.9], 0.4) == 3 and path_depth([0.9, 0.45, 0.9], 0.4) == 2
    assert path_depth([0.2, 0.9], 0.4) == 1 and path_depth([], 0.4) == 1
    assert path_depth([math.nan, 0.5, math.nan, 0.7], 0.4) == 3
    hybrid = HybridDrafter(RetrievalDrafter(INDEX, VOCAB, 4), HeadDrafter(rnn_head(None), path_acceptance=0.3), 2)
    state = hybrid.begin(2, torch.device("cpu"))
    state.retrieval.match_lengths = [[0, 5, 0, 2], [1, 1, 7, 0]]
    state.model.confidences = [[0.9, 0.1, 0.6, 0.01], [0.5, 0.9, math.nan, 0.4]]
    estimates = [[0.9, math.nan, 0.6, math.nan], [0.5, 0.9, math.nan, 0.4]]
    assert hybrid.chain_depths(state, [0, 1, 2, 3]) == [path_depth(e, 0.3) for e in estimates] == [4, 3]
    assert hybrid.chain_depths(state, [0, 3]) == [2, 1]
    assert HybridDrafter(RetrievalDrafter(INDEX, VOCAB, 4), HeadDrafter(rnn_head(None)), 2).chain_depths(
        state, [0, 1]) is None
    with pytest.raises(ValueError, match="path_acceptance"):
        HeadDrafter(FeatureHead(HF_TARGET, "eagle", VOCAB_SUBSET), path_acceptance=0.3)


def test_greedy_decoding_with_a_path_rule_equals_plain_decoding() -> None:
    """Chains cut by the path rule keep plain decoding's tokens; a threshold below every path's product cuts
    nothing, one above every top probability cuts every chain to one level, one between cuts some."""
    plain = SpeculativeDecoder(LEAN_TARGET, None, parse_strategy("ar")).generate(PROMPTS, max_new_tokens=14)
    depths = {}
    for path_acceptance in (None, 1e-9, 0.05, 0.999):
        drafter = HeadDrafter(rnn_head("q8_0"), path_acceptance=path_acceptance)
        result = SpeculativeDecoder(LEAN_TARGET, drafter, parse_strategy("chain:4")).generate(
            PROMPTS, max_new_tokens=14, record_trees=True)
        assert result.tokens == plain.tokens
        depths[path_acceptance] = [int(tree.depths.masked_fill(~tree.valid, 0).max()) for tree in result.trees]
    assert depths[1e-9] == depths[None] and max(depths[None]) == 4
    assert max(depths[0.999]) == 1 and depths[0.05] != depths[None]


def test_the_recorded_top_probability_is_the_dense_laws() -> None:
    """With a path rule, every entry the head scored records the top probability of the law ``forward`` returns
    for it (the dense logits' softmax: the subset's, as every other token has probability zero)."""
    drafter = HeadDrafter(rnn_head("q8_0"), path_acceptance=0.5)
    state = drafter.begin(2, torch.device("cpu"))
    drafter.observe_target(state, torch.randn(2, 4, 32))
    assert drafter.absorb is not None
    drafter.absorb(state, [[1, 2, 3], [4, 5, 6]])
    tokens = torch.tensor([[9, 3, 2], [0, 8, 6]])
    with torch.no_grad():
        logits = drafter.forward(state, tokens, torch.tensor([[-1, 0, 1], [-1, -1, 1]]))
    expected = torch.softmax(logits, dim=-1).amax(dim=-1)
    torch.testing.assert_close(torch.tensor(state.confidences), expected, rtol=1e-6, atol=1e-6)
    assert len(set(state.confidences[0] + state.confidences[1])) == 6


def test_plain_steps_before_the_first_draft_leave_the_recurrent_head_reading_the_newest_features() -> None:
    """A request whose first steps are plain (here forced; the batch policy or a controller can choose them)
    hands the head the target's features of those steps before its first pass: with the prompt taken without
    a pass they must extend the history as a step's do, so its first draft reads the feature right before the
    root, the draft the head makes after a prefill pass."""
    from spec_fast.engine.batch_depth import forcing
    from spec_fast.engine.batch_engine import BatchEngine

    drafted: list[list[list[int]]] = []
    for absorb in (True, False):
        drafter = HeadDrafter(rnn_head("q8_0"))
        if not absorb:
            drafter.absorb = None  # type: ignore[attr-defined]
        calls: list[list[int]] = []
        host_level = drafter.greedy_next_rows
        assert host_level is not None

        def recorded(*args: Any, **kwargs: Any) -> list[int]:
            calls.append(host_level(*args, **kwargs))
            return calls[-1]

        drafter.greedy_next_rows = recorded  # type: ignore[attr-defined]
        decoder = SpeculativeDecoder(LEAN_TARGET, drafter, parse_strategy("chain:3"))
        decoder.step_cost = lambda max_rows=8: forcing(0, 3)  # type: ignore[method-assign]  # plain steps first
        engine = BatchEngine(decoder, max_batch_size=2, depth_policy="cost")
        for prompt in PROMPTS[:2]:
            engine.add_request(prompt, SamplingParams(), 16)
        for step in range(6):
            if step == 3:
                assert engine.state is not None and not calls
                engine.state.step_cost = forcing(3, 3)
            engine.step()
        drafted.append(calls)
    assert drafted[0] == drafted[1] and len(drafted[0]) >= 6
