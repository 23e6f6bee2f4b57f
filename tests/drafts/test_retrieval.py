"""Retrieval drafting (spec_fast.drafts.retrieval): the suffix index and the own-text matcher against brute force,
the drafter's laws on a tree, the datastore file, exact greedy output through the engine, bad input."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from spec_fast._sampling import first_max_index
from spec_fast.engine import SpeculativeDecoder
from spec_fast.drafts.heads import HeadDrafter
from spec_fast.drafts.hybrid import HybridDrafter
from spec_fast.drafts.retrieval import (
    PRIOR_ACCEPTANCE,
    PRIOR_WEIGHT,
    RetrievalDrafter,
    SuffixIndex,
    context_match,
    load_datastore,
    match_class,
    save_datastore,
)
from spec_fast.strategies import parse_strategy
from tests.drafts.test_heads_protocol import NEW_TOKENS, PROMPTS, STRATEGIES, _head
from tests.drafts.test_heads_protocol import reference, target  # noqa: F401  (module fixtures, reused)
from tests.engine.models import hf_greedy, tiny_llama

VOCAB = 5
tokens = st.integers(0, VOCAB - 1)
sequences = st.lists(st.lists(tokens, max_size=12), min_size=1, max_size=5)


def _dense(ids: np.ndarray, counts: np.ndarray) -> np.ndarray:
    dense = np.zeros(VOCAB)
    dense[ids] = counts
    return dense


def _log(law: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(law).astype(np.float32)


def _brute_index(seqs: list[list[int]], context: list[int], max_match: int) -> tuple[int, np.ndarray]:
    for m in range(min(max_match, len(context)), 0, -1):
        suffix = context[len(context) - m :]
        counts = np.zeros(VOCAB)
        for s in seqs:
            for i in range(m, len(s)):
                if s[i - m : i] == suffix:
                    counts[s[i]] += 1
        if counts.any():
            return m, counts
    unigram = np.zeros(VOCAB)
    for s in seqs:
        for t in s[1:]:
            unigram[t] += 1
    return 0, unigram


def _brute_context(context: list[int], max_match: int) -> tuple[int, np.ndarray]:
    n = len(context)
    for m in range(min(max_match, n - 1), 0, -1):
        suffix = context[n - m :]
        ends = [j for j in range(m - 1, n - 1) if context[j - m + 1 : j + 1] == suffix]
        if ends:
            counts = np.zeros(VOCAB)
            for j in ends:
                counts[context[j + 1]] += 1
            counts[context[ends[-1] + 1]] += 0.5
            return m, counts
    return 0, np.zeros(VOCAB)


@given(sequences, st.lists(tokens, max_size=8), st.integers(1, 6))
def test_suffix_index_finds_the_longest_match_and_its_follower_counts(
    seqs: list[list[int]], context: list[int], max_match: int
) -> None:
    m, ids, counts = SuffixIndex(seqs, VOCAB, max_match).match(context)
    want_m, want = _brute_index(seqs, context, max_match)
    assert m == want_m
    np.testing.assert_array_equal(_dense(ids, counts), want)
    assert list(ids) == sorted(set(ids.tolist())) and (counts > 0).all()


def test_suffix_index_match_ends_at_a_token_its_int32_keys_cannot_hold() -> None:
    index = SuffixIndex([[1, 2, 3, 1, 2, 4]], VOCAB, 4)
    m, ids, counts = index.match([2**40, 1, 2])
    want = index.match([1, 2])
    assert m == want[0] == 2
    np.testing.assert_array_equal(_dense(ids, counts), _dense(want[1], want[2]))
    assert index.match([1, -2**40])[0] == 0  # no match: the unigram law


@given(st.lists(tokens, max_size=20), st.integers(1, 6))
def test_context_match_finds_the_longest_earlier_occurrence(context: list[int], max_match: int) -> None:
    m, ids, counts = context_match(context, max_match)
    want_m, want = _brute_context(context, max_match)
    assert m == want_m
    np.testing.assert_array_equal(_dense(ids, counts), want)


def test_drafter_laws_on_a_tree_follow_each_entry_path_and_commit_keeps_the_path() -> None:
    seqs = [[0, 1, 2, 3], [0, 1, 2, 4], [1, 2, 4, 0]]
    drafter = RetrievalDrafter(SuffixIndex(seqs, VOCAB, 4), VOCAB, 4)
    state = drafter.begin(1, torch.device("cpu"))
    drafter.forward(state, torch.tensor([[3, 0]]), torch.tensor([[-1, 0]]))
    drafter.commit(state, torch.tensor([[0, 1]]), torch.tensor([2]))
    assert state.committed == [[3, 0]]
    # block: 1 below the context, then two children of it (2 and 3)
    logits = drafter.forward(state, torch.tensor([[1, 2, 3]]), torch.tensor([[-1, 0, 0]]))
    assert logits.shape == (1, 3, VOCAB)
    for q, path in enumerate([[1], [1, 2], [1, 3]]):
        _, law = drafter.law([3, 0] + path)
        want = _log(law)
        np.testing.assert_array_equal(logits[0, q].numpy(), want)
    # [3, 0, 1, 2] ends with "0 1 2" (datastore), followed by 3 once and 4 once
    np.testing.assert_array_equal(torch.softmax(logits[0, 1], -1).numpy(), [0, 0, 0, 0.5, 0.5])
    # [3, 0, 1, 3]: no datastore 3 has a follower, the row's own 3 (first token) is followed by 0
    np.testing.assert_array_equal(torch.softmax(logits[0, 2], -1).numpy(), [1, 0, 0, 0, 0])
    assert state.match_lengths == [[2, 3, 1]] and drafter.num_block(state) == 3
    drafter.commit(state, torch.tensor([[0, 1]]), torch.tensor([2]))
    assert state.committed == [[3, 0, 1, 2]] and drafter.num_block(state) == 0 and drafter.passes(state) == 2


def test_datastore_round_trip(tmp_path: Any) -> None:
    path = str(tmp_path / "ds.npz")
    seqs = [[5, 60000, 7], [], [1]]
    save_datastore(path, seqs, {"command": "x y"})
    got, meta = load_datastore(path)
    assert got == seqs and meta == {"command": "x y"}
    with pytest.raises(ValueError, match="65536"):
        save_datastore(path, [[70000]])


@pytest.mark.parametrize("kwargs,match", [
    ({"sequences": [[0, 9]], "vocab_size": 5}, "outside"),
    ({"sequences": [[0, -1]], "vocab_size": 5}, "outside"),
    ({"sequences": [[[0, 1]]], "vocab_size": 5}, "flat"),
    ({"sequences": [[0, 1]], "vocab_size": 5, "max_match": 0}, "max_match"),
    ({"sequences": [[0, 1]], "vocab_size": 0}, "vocab_size"),
])
def test_suffix_index_rejects_bad_input(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SuffixIndex(**kwargs)


def test_hybrid_rejects_bad_input() -> None:
    head = HeadDrafter(_head(tiny_llama(), "rnn"))
    with pytest.raises(ValueError, match="vocab_size"):
        HybridDrafter(RetrievalDrafter(None, 63), head)
    with pytest.raises(ValueError, match="min_match"):
        HybridDrafter(RetrievalDrafter(None, 64), head, min_match=0)


# ---------------------------------------------------------------- through the engine (tiny random Llama)
@pytest.fixture(scope="module")
def index(target: Any) -> SuffixIndex:
    # the target's own greedy continuations of other prompts: long matches, so drafts get accepted
    seqs = [p + hf_greedy(target, p, 30) for p in ([3], [9, 9], [1, 5], [60, 2], [2, 4])]
    return SuffixIndex(seqs, 64, 8)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("kind", ["retrieval", "prompt-lookup", "hybrid", "retrieval-deep", "retrieval-learned"])
def test_greedy_output_is_exactly_autoregressive(
    target: Any, reference: list[list[int]], index: SuffixIndex, strategy: str, kind: str
) -> None:
    retrieval = RetrievalDrafter(None if kind == "prompt-lookup" else index, 64, 8,
                                 deep_match=3 if kind == "retrieval-deep" else None,
                                 path_acceptance=0.4 if kind == "retrieval-learned" else None)
    drafter: Any = HybridDrafter(retrieval, HeadDrafter(_head(target, "rnn")), 2) if kind == "hybrid" else retrieval
    decoder = SpeculativeDecoder(target, drafter, parse_strategy(strategy))
    result = decoder.generate(PROMPTS, max_new_tokens=NEW_TOKENS)
    assert result.tokens == reference
    if kind == "retrieval" and not strategy.endswith("adaptive"):
        assert sum(result.metrics.accepted_length_histogram[1:]) > 0  # drafts were accepted


def test_hybrid_takes_the_retrieval_law_only_for_long_matches(target: Any, index: SuffixIndex) -> None:
    retrieval = RetrievalDrafter(index, 64, 8)
    model = HeadDrafter(_head(target, "rnn"))
    hybrid = HybridDrafter(retrieval, model, min_match=3)
    state = hybrid.begin(1, torch.device("cpu"))
    alone = model.begin(1, torch.device("cpu"))
    prompt = torch.tensor([[3] + hf_greedy(target, [3], 6)])
    parents = torch.arange(-1, prompt.shape[1] - 1).unsqueeze(0)
    with torch.no_grad():
        got = hybrid.forward(state, prompt, parents)
        want_model = model.forward(alone, prompt, parents)
    lengths = state.retrieval.match_lengths[0]
    assert min(lengths) < 3 <= max(lengths)
    for q, m in enumerate(lengths):
        if m >= 3:
            _, law = retrieval.law(prompt[0, : q + 1].tolist())
            np.testing.assert_array_equal(got[0, q].numpy(), _log(law))
        else:
            assert torch.equal(got[0, q], want_model[0, q])
    assert hybrid.num_block(state) == prompt.shape[1] and hybrid.passes(state) == 1
    assert math.isinf(float(got[0, lengths.index(max(lengths))].min()))


def test_an_own_text_match_as_long_as_the_datastore_match_wins() -> None:
    """Ties go to the row's own text (module docstring): both hold "3 1" as the longest match of the context
    below; the row's own text continues it with 4, the datastore with 2. A longer datastore match wins (the
    control)."""
    drafter = RetrievalDrafter(SuffixIndex([[3, 1, 2]], VOCAB, 4), VOCAB, 4)
    m, ids, _ = drafter.sparse_law([0, 3, 1, 4, 3, 1])
    assert (m, ids.tolist()) == (2, [4])
    longer = RetrievalDrafter(SuffixIndex([[4, 3, 1, 2]], VOCAB, 4), VOCAB, 4)
    m, ids, _ = longer.sparse_law([0, 3, 1, 4, 3, 1])
    assert (m, ids.tolist()) == (3, [2])


def test_a_chain_goes_deeper_only_behind_long_matches() -> None:
    """Row b's chain: level 1, then level k + 1 while the law it is drawn from (entry law_entries[k]) has a match
    of at least deep_match tokens; without deep_match, every level."""
    state = RetrievalDrafter(None, VOCAB).begin(3, torch.device("cpu"))
    state.match_lengths = [[5, 2, 4, 3], [1, 4, 3, 2], [0, 3, 3, 3]]
    deep = RetrievalDrafter(None, VOCAB, deep_match=3)
    assert deep.chain_depths(state, [0, 1, 2, 3]) == [1, 3, 4]
    assert deep.chain_depths(state, [0, 1]) == [1, 2, 2]  # as far as the laws drawn so far reach
    assert deep.chain_depths(state, [3, 2]) == [2, 2, 2]  # entries, not positions, name the laws
    assert RetrievalDrafter(None, VOCAB).chain_depths(state, [0, 1, 2, 3]) is None
    with pytest.raises(ValueError, match="deep_match"):
        RetrievalDrafter(None, VOCAB, deep_match=0)
    with pytest.raises(ValueError, match="path_acceptance"):
        RetrievalDrafter(None, VOCAB, path_acceptance=1.0)
    with pytest.raises(ValueError, match="not both"):
        RetrievalDrafter(None, VOCAB, deep_match=3, path_acceptance=0.5)


def test_a_learned_chain_goes_as_deep_as_its_rows_drafts_have_been_accepted() -> None:
    """path_acceptance: level k + 1 while the product of the estimated acceptance of levels 1 .. k + 1 (by the
    class of each law's match) stays at or above the bound; the estimates start at the priors and follow each
    row's own accepted / reached counts (the first rejected level is reached, later ones are not)."""
    drafter = RetrievalDrafter(None, VOCAB, path_acceptance=0.5)
    state = drafter.begin(2, torch.device("cpu"))
    state.match_lengths = [[12, 12, 12, 12, 4], [12, 2, 12, 12, 12]]
    assert [match_class(m) for m in (0, 1, 2, 3, 5, 6, 9, 10)] == [0, 1, 1, 2, 2, 3, 3, 4]
    # priors: class 4 0.85, class 2 0.45, class 1 0.25: 0.85^4 = 0.52 >= 0.5, times 0.45 < 0.5
    assert drafter.chain_depths(state, [0, 1, 2, 3, 4]) == [4, 1]
    assert state.chain_matches == [[12, 12, 12, 12], [12]]
    drafter.observe_chain(state, accepted=[1, 0], depths=[3, 0])  # row 0 cut to 3 levels; row 1 drafted none
    assert state.chain_matches == [[], []]
    estimate = drafter.acceptance_estimates(state, 0)
    assert estimate[4] == pytest.approx((1 + PRIOR_WEIGHT * 0.85) / (2 + PRIOR_WEIGHT))  # 1 of 2 reached
    assert drafter.acceptance_estimates(state, 1) == pytest.approx(list(PRIOR_ACCEPTANCE))
    for _ in range(10):  # row 0 keeps rejecting its first level: its chains shrink to one level
        drafter.chain_depths(state, [0, 1, 2, 3, 4])
        drafter.observe_chain(state, accepted=[0, 0], depths=[4, 4])
    assert drafter.chain_depths(state, [0, 1, 2, 3, 4]) == [1, 1]
    kept = drafter.take_rows(state, [1])
    assert kept.acceptance == [state.acceptance[1]] and len(kept.chain_matches) == 1


def test_a_deep_match_chain_ends_where_the_match_ends_and_keeps_the_drafters_text(
    target: Any, reference: list[list[int]], index: SuffixIndex
) -> None:
    drafter = RetrievalDrafter(index, 64, 8, deep_match=3)
    result = SpeculativeDecoder(target, drafter, parse_strategy("chain:6")).generate(
        PROMPTS, max_new_tokens=NEW_TOKENS, record_trees=True)
    assert result.tokens == reference
    depths = [int(d) for tree in result.trees for d in tree.depths.masked_fill(~tree.valid, 0).max(dim=1).values]
    assert 1 in depths and max(depths) > 1  # rows stop after one level behind short matches, go on behind long
    assert min(tree.num_slots for tree in result.trees) < 7  # a step where every row stopped: a narrower pass
    head = result.state.heads[0]
    for b, prompt in enumerate(PROMPTS):
        # the drafter's committed text and the tokens it has yet to see are the row's text, whichever entries
        # the chains forwarded
        assert head.state.committed[b] + list(head.pending[b]) == prompt + result.tokens[b]
    # one row: every pass is exactly as wide as the row's chain (the chain ends where the row stops)
    alone = SpeculativeDecoder(target, RetrievalDrafter(index, 64, 8, deep_match=3), parse_strategy("chain:6"))
    one = alone.generate(PROMPTS[:1], max_new_tokens=NEW_TOKENS, record_trees=True)
    assert one.tokens == reference[:1]
    widths = [(tree.num_slots, int(tree.depths.masked_fill(~tree.valid, 0).max())) for tree in one.trees]
    assert all(slots == depth + 1 for slots, depth in widths)
    assert 1 in {depth for _, depth in widths} and max(depth for _, depth in widths) > 1


@given(sequences, st.lists(st.lists(tokens, min_size=1, max_size=10), min_size=1, max_size=3),
       st.lists(st.lists(tokens, min_size=1, max_size=3), min_size=1, max_size=3), st.booleans())
def test_greedy_next_rows_is_the_argmax_of_the_last_entrys_logits(seqs: list[list[int]], committed: list[list[int]],
                                                                  blocks: list[list[int]], with_index: bool) -> None:
    """``greedy_next_rows`` (a greedy chain's level without the dense logits) against ``first_max_index`` of
    ``forward_last``'s logits, on two states alike: the same tokens, block and match lengths (ties, own-text
    matches, the unigram law and the uniform law without a datastore included)."""
    drafter = RetrievalDrafter(SuffixIndex(seqs, VOCAB, 4) if with_index else None, VOCAB, 4)
    rows = len(committed)
    width = max(len(b) for b in blocks)
    block = [(blocks[r % len(blocks)] * width)[:width] for r in range(rows)]
    tokens_in = torch.tensor(block)
    parents = torch.arange(-1, width - 1).expand(rows, width).contiguous()
    states = []
    for _ in range(2):
        state = drafter.begin(rows, torch.device("cpu"))
        state.committed = [list(c) for c in committed]
        states.append(state)
    fast = drafter.greedy_next_rows(states[0], tokens_in.tolist(), parents.tolist())
    dense = drafter.forward_last(states[1], tokens_in, parents)
    assert fast == first_max_index(dense[:, 0]).tolist()
    for name in ("block_tokens", "block_parents", "match_lengths", "passes"):
        assert getattr(states[0], name) == getattr(states[1], name), name


@pytest.mark.parametrize("strategy", ["chain:4", "chain:2"])
def test_a_greedy_retrieval_chain_drafts_the_same_with_and_without_its_argmax_shortcut(
        monkeypatch: pytest.MonkeyPatch, strategy: str) -> None:
    target = tiny_llama(vocab_size=32, seed=3)
    index = SuffixIndex([[1, 5, 7, 9, 3, 2, 2, 8, 1, 5], [4, 2, 6, 6, 1, 5, 7]], 32, 4)
    drafter = RetrievalDrafter(index, 32, 4, path_acceptance=0.2)
    runs = []
    for shortcut in (True, False):
        if not shortcut:
            # without it the chain builder takes the dense laws and their argmax, level by level on tensors
            monkeypatch.setattr(RetrievalDrafter, "greedy_next_rows", None)
        decoder = SpeculativeDecoder(target, drafter, parse_strategy(strategy))
        result = decoder.generate([[1, 5, 7, 9], [4, 2, 6]], max_new_tokens=24, record_trees=True)
        runs.append((result.tokens, [t.tokens.tolist() for t in result.trees], result.metrics.accepted_length_histogram,
                     result.metrics.depth_reached))
    assert runs[0] == runs[1]
    assert sum(runs[0][3]) > 0  # chains were drafted


def test_the_first_level_gate_drafts_only_behind_matches_whose_estimate_reaches_it() -> None:
    """first_acceptance: a row drafts where the estimate for the class of the match its context ends with
    reaches it (the priors at first: class 2 at 0.45 drafts, class 1 at 0.25 does not), per row; a class whose
    drafts are rejected falls below the gate, and steps the row does not draft fade its counts back to the
    prior, so the class is tried again."""
    drafter = RetrievalDrafter(None, VOCAB, 8, path_acceptance=0.5, first_acceptance=0.4)
    state = drafter.begin(2, torch.device("cpu"))
    state.committed = [[0, 1, 2, 3, 4, 0, 1, 2], [0, 1, 2, 3, 4]]
    pending = [[3], [2]]  # row 0 ends with "0 1 2 3" (a match of 4: class 2), row 1 with "4 2" (1: class 1)
    assert [drafter.match_length(state, b, pending[b]) for b in (0, 1)] == [4, 1]
    assert [drafter.drafts_first_level(state, b, pending[b]) for b in (0, 1)] == [True, False]
    assert not drafter.drafts_first_level(state, 1, [3])  # row 1's own text: "4 3", a match of 1
    ungated = RetrievalDrafter(None, VOCAB, 8, path_acceptance=0.5)
    assert all(ungated.drafts_first_level(state, b, pending[b]) for b in (0, 1))
    for _ in range(3):  # row 0's first levels behind class-2 matches are rejected
        state.chain_matches = [[4], []]
        drafter.observe_chain(state, accepted=[0, 0], depths=[1, 0])
    assert drafter.acceptance_estimates(state, 0)[2] < 0.4
    assert not drafter.drafts_first_level(state, 0, pending[0])
    assert drafter.drafts_first_level(state, 1, [0, 1, 2])  # row 1's class 2 keeps its prior
    gated_steps = 0
    while not drafter.drafts_first_level(state, 0, pending[0]):
        drafter.observe_chain(state, accepted=[0, 0], depths=[0, 0])  # plain steps: the counts fade
        gated_steps += 1
        assert gated_steps < 50
    assert gated_steps > 1
    # without the gate a row's counts keep their weight over steps it did not draft
    kept = ungated.begin(1, torch.device("cpu"))
    kept.chain_matches = [[4]]
    ungated.observe_chain(kept, accepted=[0], depths=[1])
    before = [list(pair) for pair in kept.acceptance[0]]
    ungated.observe_chain(kept, accepted=[0], depths=[0])
    assert kept.acceptance[0] == before
    with pytest.raises(ValueError, match="first_acceptance"):
        RetrievalDrafter(None, VOCAB, path_acceptance=0.5, first_acceptance=0.0)
    with pytest.raises(ValueError, match="give path_acceptance too"):
        RetrievalDrafter(None, VOCAB, first_acceptance=0.4)


def test_a_gated_chain_takes_plain_steps_per_row_and_stays_exactly_autoregressive(
        target: Any, reference: list[list[int]], index: SuffixIndex, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows whose match forecasts a rejected draft take plain steps (the plain step's shortcut when no row
    drafts); each row's drafted depths follow from its own text, so a row decodes the same trees alone as in
    the batch; greedy output stays the target's own."""
    import spec_fast.engine.decoder as decoder_module

    shortcuts = []
    real_plain_step = decoder_module.plain_step

    def counting(*args: Any) -> Any:
        taken = real_plain_step(*args)
        shortcuts.append(taken is not None)
        return taken

    monkeypatch.setattr(decoder_module, "plain_step", counting)
    strategy = parse_strategy("chain:4")

    def row_depths(prompts: list[list[int]], record: bool, gate: float | None = 0.4
                   ) -> tuple[list[list[int]], list[list[int]]]:
        drafter = RetrievalDrafter(index, 64, 8, path_acceptance=0.2, first_acceptance=gate)
        result = SpeculativeDecoder(target, drafter, strategy).generate(prompts, max_new_tokens=NEW_TOKENS,
                                                                        record_trees=record)
        depths = [[int(tree.depths[b].masked_fill(~tree.valid[b], 0).max()) for tree in result.trees or []]
                  for b in range(len(prompts))]
        return result.tokens, depths

    tokens, _ = row_depths(PROMPTS, False)
    assert tokens == reference
    assert any(shortcuts) and not all(shortcuts)  # plain steps without a tree, and drafted steps
    batch_tokens, batch_depths = row_depths(PROMPTS, True)
    assert batch_tokens == reference
    flat = [d for row in batch_depths for d in row]
    assert 0 in flat and max(flat) > 1
    mixed_rows = 0
    for b, prompt in enumerate(PROMPTS):
        _, alone = row_depths([prompt], True)
        assert batch_depths[b][: len(alone[0])] == alone[0]
        mixed_rows += 0 in alone[0][1:] and max(alone[0]) > 0  # the row itself took gated and drafted steps
        assert 0 in alone[0][:-1]
        _, ungated = row_depths([prompt], True, gate=None)
        assert 0 not in ungated[0][:-1]  # without the gate only the last token's step drafts nothing
    assert mixed_rows > 0
