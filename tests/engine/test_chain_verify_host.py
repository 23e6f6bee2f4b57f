"""Greedy chains verified on the host (``verify_greedy_chain_on_host`` in spec_fast/engine/commit.py) against
the general greedy walk and the commit's read-back of its tensors.

The decoder verifies every greedy step of a chain strategy on the host, from the argmax the lean forward
computes with its logits (``first_max``) or from the logits; the commit then reads nothing back. Here the
host verification is compared with :func:`spec_fast.verify.verify_greedy` on chains cut to different depths,
and whole decodings are compared with decodings that take the general path (the verification's tensors read
back by the commit), on a float32 head and a head of blocks (whose pass gives the argmax itself).
"""

from __future__ import annotations

from typing import Any, cast

import pytest
import torch

import spec_fast.engine.step_verify as step_verify_module
from spec_fast._sampling import first_max_index
from spec_fast.decoding import SamplingParams
from spec_fast.drafts.batch import argmax_law
from spec_fast.drafts.model import Drafter, ModelDrafter
from spec_fast.drafts.retrieval import RetrievalDrafter, SuffixIndex
from spec_fast.engine import SpeculativeDecoder
from spec_fast.engine.commit import HostVerified, read_back, verify_greedy_chain_on_host
from spec_fast.strategies import parse_strategy
from spec_fast.verify import verify_greedy
from spec_fast.verify.tree import Verified
from tests.engine.models import tiny_llama
from tests.engine.test_plain_step import BLOCK_HEAD_TARGET, LEAN_TARGET, TIME_FIELDS, VOCAB

PROMPTS = [[1, 5, 7, 9, 3, 2], [4, 2, 6, 1, 1, 3], [8, 8, 1, 3, 30, 2]]


@pytest.mark.parametrize("caps", [[4, 4, 4], [4, 2, 1], [1, 3, 0]])
@pytest.mark.parametrize("accept", [0, 1, 2, 4])
def test_the_host_verification_is_the_greedy_walk_and_its_read_back(caps: list[int], accept: int) -> None:
    target = tiny_llama(seed=4)
    decoder = SpeculativeDecoder(target, ModelDrafter(tiny_llama(seed=5)), parse_strategy("chain:4"))
    state = decoder.begin(PROMPTS, [9, 9, 9], [SamplingParams()] * 3, [0, 1, 2], set())
    state.depth_caps = caps
    draft = decoder.proposer.draft(state, max(caps), argmax_law, decoder.device)[0]
    tree = draft.tree
    torch.manual_seed(accept)
    logits = torch.randn(3, tree.num_slots, 64)
    # the first `accept` levels of every row are the argmax above them (where the row has them)
    forced = min(accept, tree.num_slots - 1)
    logits[:, :forced].scatter_(2, tree.tokens[:, 1:forced + 1].clamp(min=0).unsqueeze(2), 10.0)
    logits[1, -1, 7] = logits[1, -1].max()  # a tie (at the deepest slot): the lowest id is the argmax
    host = verify_greedy_chain_on_host(draft, first_max_index(logits), heads=2)
    walk = verify_greedy(tree, logits, max_depth=draft.max_depth)
    for name in ("accepted_slots", "accepted_depth", "next_token"):
        assert torch.equal(getattr(host, name), getattr(walk, name)), name
    general = Verified(walk.accepted_slots, walk.accepted_depth, walk.next_token)
    assert host.rows == read_back(general, draft, None, (draft.entries, draft.entries))
    assert read_back(host, draft, None, ()) is host.rows  # the commit reads nothing back
    reached = [min(c, forced) for c in caps] if accept else [0, 0, 0]
    assert all(depth >= r for depth, r in zip(host.accepted_depth.tolist(), reached, strict=True))


def general_path(verified: Verified) -> Verified:
    """What the commit would get without the host verification: the same results as device tensors."""
    return Verified(verified.accepted_slots, verified.accepted_depth, verified.next_token)


def summary(result: Any) -> dict[str, Any]:
    st = result.state
    return {"tokens": result.tokens, "roots": st.roots, "committed": st.committed, "steps": st.steps,
            "lengths": st.target_cache.lengths.tolist(), "accepted": st.step_accepted, "drafted": st.step_drafted,
            "pending": [head.pending for head in st.heads],
            "metrics": {k: v for k, v in result.metrics.as_dict().items() if k not in TIME_FIELDS}}


@pytest.mark.parametrize("target", [LEAN_TARGET, BLOCK_HEAD_TARGET], ids=["float32-head", "q8_0-head"])
@pytest.mark.parametrize("strategy", ["chain:1", "chain:4"])
def test_decoding_with_host_verified_chains_equals_the_general_path(monkeypatch: pytest.MonkeyPatch, target: Any,
                                                                   strategy: str) -> None:
    index = SuffixIndex([PROMPTS[0] + [2, 8, 5, 7], [4, 2, 6, 6, 1], [8, 8, 1, 3, 5, 7]], VOCAB, 4)
    decoder = SpeculativeDecoder(target, RetrievalDrafter(index, VOCAB, 4), parse_strategy(strategy))
    calls: list[int] = []
    hosted = step_verify_module.verify_greedy_chain_on_host

    def counted(*args: Any) -> HostVerified:
        calls.append(1)
        return hosted(*args)

    results = []
    for wrap in (counted, lambda *args: general_path(hosted(*args))):
        monkeypatch.setattr(step_verify_module, "verify_greedy_chain_on_host", wrap)
        for prompts in ([PROMPTS[0]], PROMPTS):
            results.append(summary(decoder.generate(prompts, max_new_tokens=16, eos_token_id=3)))
    assert results[:2] == results[2:]
    assert len(calls) >= 8
    plain = SpeculativeDecoder(target, None, parse_strategy("ar")).generate(PROMPTS, max_new_tokens=16, eos_token_id=3)
    assert results[1]["tokens"] == plain.tokens


def drafter_state(state: Any) -> tuple[Any, ...]:
    """What a decoding state's retrieval drafter keeps after drafting: its block, match lengths, chain matches,
    passes, and the pending width."""
    retrieval = state.heads[0].state
    return (retrieval.block_tokens, retrieval.block_parents, retrieval.match_lengths, retrieval.chain_matches,
            retrieval.passes, state.heads[0].pending_width)


class TensorRows:
    """A drafter seen without its host-side entry points (``greedy_next_rows``, ``commit_rows``): the builders
    and the commit then take their tensor paths."""

    def __init__(self, drafter: Drafter) -> None:
        self.inner = drafter

    def __getattr__(self, name: str) -> Any:
        if name in ("greedy_next_rows", "commit_rows"):
            raise AttributeError(name)
        return getattr(self.inner, name)


def assert_same_draft(host: Any, tensors: Any) -> None:
    """Two drafts (:class:`~spec_fast.drafts.batch.DraftBatch`) with equal trees, confidences, entries and inputs."""
    for name in ("tokens", "parents", "depths", "draws", "valid"):
        assert torch.equal(getattr(host.tree, name), getattr(tensors.tree, name)), name
    for name in ("confidences", "entries", "tokens_in"):
        assert torch.equal(getattr(host, name), getattr(tensors, name)), name


def test_a_retrieval_chain_drafted_on_the_host_is_the_tensor_paths_draft() -> None:
    """The greedy chain of a drafter with ``greedy_next_rows`` (spec_fast/drafts/chain.py) against the
    same drafter's chain built level by level from tensors: every field of the drafts and the drafter's
    state after them are equal, for rows with pending chains of different lengths and chains cut early."""
    index = SuffixIndex([[1, 5, 7, 9, 3, 2, 8, 5, 7, 9], [4, 2, 6, 6, 1, 4, 2, 6], [8, 8, 1, 3, 5, 7]], VOCAB, 4)
    for rule in ({}, {"deep_match": 2}, {"path_acceptance": 0.4}):
        drafter = RetrievalDrafter(index, VOCAB, 4, **rule)
        drafts, states = [], []
        for seen in (drafter, cast(Drafter, TensorRows(drafter))):
            decoder = SpeculativeDecoder(LEAN_TARGET, seen, parse_strategy("chain:5"))
            state = decoder.begin(PROMPTS, [9, 9, 9], [SamplingParams()] * 3, [0, 1, 2], set())
            state.heads[0].pending[1] = [5, 7] + state.heads[0].pending[1]  # a longer pending chain
            state.depth_caps = [5, 3, 5]
            drafts.append(decoder.proposer.draft(state, 5, argmax_law, decoder.device)[0])
            states.append(drafter_state(state))
        host, tensors = drafts
        assert states[0] == states[1]
        assert_same_draft(host, tensors)
        assert host.draft_probs is None and tensors.draft_probs is None
        assert (host.pending_width, host.max_depth, host.chain) == (tensors.pending_width, tensors.max_depth, True)
        assert host.max_depth >= 1


@pytest.mark.parametrize("strategy", ["chain:1", "chain:4"])
def test_decoding_with_the_host_side_drafter_equals_its_tensor_paths(strategy: str) -> None:
    index = SuffixIndex([PROMPTS[0] + [2, 8, 5, 7], [4, 2, 6, 6, 1], [8, 8, 1, 3, 5, 7]], VOCAB, 4)
    drafter = RetrievalDrafter(index, VOCAB, 4, path_acceptance=0.4)
    results = [summary(SpeculativeDecoder(BLOCK_HEAD_TARGET, seen, parse_strategy(strategy)).generate(
        PROMPTS, max_new_tokens=16, eos_token_id=3)) for seen in (drafter, cast(Drafter, TensorRows(drafter)))]
    assert results[0] == results[1]
    assert results[0]["metrics"]["block_efficiency"] > 1.0
