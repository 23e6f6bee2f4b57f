"""Sampled chains on the host: the naive verification's accept tests (``verify_naive_chain_on_host`` in
spec_fast/engine/step_verify.py) and a retrieval chain drafted over its matched ids (``sparse_next_rows``,
spec_fast/drafts/chain.py), against the general paths they stand in for.

The verification must return exactly what :func:`spec_fast.verify.verify_tree` returns with ``"naive"`` on the
same chains, probabilities and uniforms (the exactness of docs/testing.md: same uniforms, same tokens). The
drafted chain must be the dense path's draft: the same tokens from the same uniforms, its law the dense law
up to float32 rounding (G over the matched ids alone sums fewer terms), and the tokens drawn from the very
law handed to the verifier. Distributional losslessness of these paths is the statistical suite's
(tests/engine/statistical_setup.py runs ``chain:2`` and ``chain:3`` with retrieval drafts, sampled).
"""

from __future__ import annotations

from typing import Any, cast

import pytest
import torch

import spec_fast.engine.step_verify as step_verify_module
import spec_fast.rng as rng_module
from spec_fast import _sampling
from spec_fast.decoding import SamplingParams
from spec_fast.drafts.batch import DraftBatch, cap_rows
from spec_fast.drafts.model import Drafter
from spec_fast.drafts.retrieval import RetrievalDrafter, SuffixIndex
from spec_fast.engine import SpeculativeDecoder
from spec_fast.engine.step_verify import verify_naive_chain_on_host
from spec_fast.flat_tree import FlatTree
from spec_fast.strategies import parse_strategy
from spec_fast.verify import verify_tree
from tests.engine.test_chain_verify_host import PROMPTS, drafter_state, summary
from tests.engine.test_plain_step import BLOCK_HEAD_TARGET, LEAN_TARGET, VOCAB

OUTPUT_FIELDS = ("accepted_slots", "accepted_depth", "next_token", "emitted", "accepted_node")


def random_chain(generator: torch.Generator, batch: int, depth: int, vocab: int, from_target: bool
                 ) -> tuple[DraftBatch, torch.Tensor]:
    """A chain draft of ``depth`` levels per row (tokens drawn from q, or from p so that most are accepted),
    rows cut to random depths, and its target probabilities ``[B, D + 1, V]``."""
    target = torch.softmax(3 * torch.randn(batch, depth + 1, vocab, generator=generator), dim=-1)
    law = torch.softmax(3 * torch.randn(batch, depth, vocab, generator=generator), dim=-1)
    source = target[:, :depth] if from_target else law
    drafted = torch.multinomial(source.reshape(-1, vocab), 1, generator=generator).reshape(batch, depth)
    if batch > 1:
        law[0, 0] = 0.0
        law[0, 0, drafted[0, 0]] = 1.0  # a point mass (retrieval's matched id alone)
    pad = torch.full((batch, 1), -1, dtype=torch.long)
    steps = torch.arange(depth + 1).unsqueeze(0).expand(batch, depth + 1)
    tree = FlatTree(tokens=torch.cat([pad, drafted], dim=1), parents=steps - 1, depths=steps.clone(),
                    draws=torch.cat([drafted, pad], dim=1).unsqueeze(-1),
                    valid=torch.ones(batch, depth + 1, dtype=torch.bool), process="iid")
    draft = DraftBatch(tree, torch.cat([law, torch.zeros(batch, 1, vocab)], dim=1), torch.ones(batch, depth + 1),
                       torch.zeros(batch, depth + 1, dtype=torch.long), torch.zeros(batch, depth + 1, dtype=torch.long),
                       1, depth, chain=True)
    caps = torch.randint(1, depth + 1, (batch,), generator=generator).tolist()
    return cap_rows(draft, caps), target


@pytest.mark.parametrize("vocab", [5, 48, 9000])
@pytest.mark.parametrize("from_target", [False, True], ids=["drafts-from-q", "drafts-from-p"])
def test_the_host_naive_chain_verification_is_verify_tree_naive(vocab: int, from_target: bool) -> None:
    generator = torch.Generator().manual_seed(vocab + from_target)
    stops: set[tuple[int, bool]] = set()
    for _ in range(60):
        batch = int(torch.randint(1, 5, (1,), generator=generator))
        depth = int(torch.randint(1, 5, (1,), generator=generator))
        draft, target = random_chain(generator, batch, depth, vocab, from_target)
        assert draft.draft_probs is not None
        uniforms = torch.randint(0, 1 << 24, (batch, depth + 1, 2), generator=generator).float() / (1 << 24)
        host = verify_naive_chain_on_host(draft, target, draft.draft_probs, uniforms)
        for compact in (True, False):
            general = verify_tree("naive", draft.tree, target, draft.draft_probs, uniforms,
                                  max_depth=draft.max_depth, validate=False, compact=compact)
            for name in OUTPUT_FIELDS:
                assert torch.equal(getattr(host, name), getattr(general, name)), name
        leaf = (draft.tree.draws[:, :, 0].gather(1, host.accepted_node.unsqueeze(1)) < 0).squeeze(1)
        stops.update(zip(host.accepted_depth.tolist(), leaf.tolist(), strict=True))
    # rows stopped by a rejection and at leaves (after every level was accepted), at several depths where
    # the drafts come from p (from an unrelated q over 9000 ids, a row rarely gets past its first level)
    assert {leaf for _, leaf in stops} == {False, True}
    assert len({depth for depth, _ in stops}) >= (3 if from_target else 2)


def test_the_host_verification_reads_one_uniform_column_when_there_is_one() -> None:
    """``M = 1`` (no residual uniform): the rejected row's draw reads u0, as the driver's does."""
    generator = torch.Generator().manual_seed(3)
    draft, target = random_chain(generator, 4, 3, 48, False)
    assert draft.draft_probs is not None
    uniforms = torch.rand(4, 4, 1, generator=generator)
    host = verify_naive_chain_on_host(draft, target, draft.draft_probs, uniforms)
    general = verify_tree("naive", draft.tree, target, draft.draft_probs, torch.cat([uniforms, uniforms], dim=2),
                          max_depth=draft.max_depth, validate=False)
    for name in OUTPUT_FIELDS:
        assert torch.equal(getattr(host, name), getattr(general, name)), name


class DenseLaws:
    """A retrieval drafter seen without ``sparse_next_rows``: a sampled chain is then drafted from its dense
    ``[B, 1, V]`` logits, level by level on tensors."""

    def __init__(self, drafter: RetrievalDrafter) -> None:
        self.inner = drafter

    def __getattr__(self, name: str) -> Any:
        if name == "sparse_next_rows":
            raise AttributeError(name)
        return getattr(self.inner, name)


SAMPLINGS = [SamplingParams(temperature=0.7, seed=1), SamplingParams(), SamplingParams(temperature=1.3, top_k=3,
                                                                                          seed=2)]


def test_a_sampled_retrieval_chain_drafted_over_its_ids_is_the_dense_paths_draft() -> None:
    """Rows of three laws (T = 0.7, greedy, T = 1.3 with top-k 3), pending chains of different lengths, three
    depth rules: the same tokens, tree and drafter state as the dense path, the same law up to rounding, and
    every drafted token's probability under the law the verifier reads is its confidence factor."""
    index = SuffixIndex([[1, 5, 7, 9, 3, 2, 8, 5, 7, 9], [4, 2, 6, 6, 1, 4, 2, 6], [8, 8, 1, 3, 5, 7, 8, 8, 2]],
                        VOCAB, 4)
    depths = []
    for rule in ({}, {"deep_match": 2}, {"path_acceptance": 0.4}):
        for seed in range(4):
            drafter = RetrievalDrafter(index, VOCAB, 4, **rule)
            drafts, states = [], []
            for seen in (drafter, cast(Drafter, DenseLaws(drafter))):
                decoder = SpeculativeDecoder(LEAN_TARGET, seen, parse_strategy("chain:4"))
                samplings = [SamplingParams(s.temperature, s.top_k, s.top_p, seed + s.seed) for s in SAMPLINGS]
                state = decoder.begin(PROMPTS, [9, 9, 9], samplings, [0, 1, 2], set())
                state.heads[0].pending[1] = [5, 7] + state.heads[0].pending[1]
                state.depth_caps = [4, 3, 4]
                drafts.append(decoder.proposer.draft(state, 4, decoder._draft_law(samplings), decoder.device)[0])
                states.append(drafter_state(state))
            host, dense = drafts
            assert states[0] == states[1]
            for name in ("tokens", "parents", "depths", "draws", "valid"):
                assert torch.equal(getattr(host.tree, name), getattr(dense.tree, name)), name
            for name in ("entries", "tokens_in"):
                assert torch.equal(getattr(host, name), getattr(dense, name)), name
            assert host.draft_probs is not None and dense.draft_probs is not None
            torch.testing.assert_close(host.draft_probs, dense.draft_probs, rtol=1e-6, atol=1e-7)
            torch.testing.assert_close(host.confidences, dense.confidences, rtol=1e-6, atol=1e-7)
            assert (host.pending_width, host.max_depth, host.chain) == (dense.pending_width, dense.max_depth, True)
            tokens = host.tree.tokens[:, 1:]
            drawn = host.draft_probs[:, :-1].gather(2, tokens.clamp(min=0).unsqueeze(2)).squeeze(2)
            levels = host.tree.valid[:, 1:]
            assert bool((drawn[levels] > 0).all())  # every token has mass under the law the verifier reads
            assert torch.equal(host.confidences[:, 1:][levels], torch.cumprod(drawn, dim=1)[levels])
            depths.append(host.max_depth)
    assert max(depths) >= 3


@pytest.mark.parametrize("target", [LEAN_TARGET, BLOCK_HEAD_TARGET], ids=["float32-head", "q8_0-head"])
@pytest.mark.parametrize("strategy", ["chain:1", "chain:3"])
def test_sampled_decoding_with_the_host_paths_equals_the_general_paths(monkeypatch: pytest.MonkeyPatch, target: Any,
                                                                       strategy: str) -> None:
    """Seeded sampled decodings through the host-side draft and verification against the dense draft and
    ``verify_tree``: the same tokens, state and metrics (the laws agree to rounding, and no draw of these runs
    sits on a boundary that rounding moves). The native library's verification of unfiltered chains, which
    computes p itself, is off here (tests/engine/test_native_tempered_draw.py checks it)."""
    monkeypatch.setattr(_sampling, "native_naive_chain", None)
    index = SuffixIndex([PROMPTS[0] + [2, 8, 5, 7], [4, 2, 6, 6, 1], [8, 8, 1, 3, 5, 7]], VOCAB, 4)
    drafter = RetrievalDrafter(index, VOCAB, 4, path_acceptance=0.4)
    hosted = step_verify_module.verify_naive_chain_on_host
    calls: list[int] = []

    def counted(*args: Any) -> Any:
        calls.append(1)
        return hosted(*args)

    def general(draft: DraftBatch, target_probs: torch.Tensor, draft_probs: torch.Tensor, uniforms: torch.Tensor
                ) -> Any:
        return verify_tree("naive", draft.tree, target_probs, draft_probs, uniforms, max_depth=draft.max_depth,
                           validate=False)

    results = []
    for seen, verify in ((drafter, counted), (cast(Drafter, DenseLaws(drafter)), general)):
        monkeypatch.setattr(step_verify_module, "verify_naive_chain_on_host", verify)
        decoder = SpeculativeDecoder(target, seen, parse_strategy(strategy))
        for seed in range(3):
            results.append(summary(decoder.generate(PROMPTS, max_new_tokens=16, eos_token_id=3,
                                                    sampling=SamplingParams(temperature=0.8, seed=seed))))
    assert results[:3] == results[3:]
    assert len(calls) >= 10
    assert max(r["metrics"]["block_efficiency"] for r in results) > 1.0


@pytest.mark.parametrize("rows", [1, 3, 7])
@pytest.mark.parametrize("inner", [(1,), (2, 2), (4, 3)])
def test_few_counters_hashed_on_the_host_are_the_vectorised_hashs(monkeypatch: pytest.MonkeyPatch, rows: int,
                                                                  inner: tuple[int, ...]) -> None:
    """``counter_uniforms`` with per-row keys hashes at most ``HOST_COUNTERS`` CPU counters in Python integers:
    the same bits as the tensor hash, for keys and offsets across the int64 range (wrapping included) and
    one key shared by every row."""
    generator = torch.Generator().manual_seed(rows * 10 + len(inner))
    shape = (rows, *inner)
    for trial in range(20):
        keys = torch.randint(-(2**63), 2**63 - 1, (rows if trial % 2 else 1,), generator=generator)
        offsets = torch.randint(-(2**63), 2**63 - 1, (rows,), generator=generator)
        if trial % 5 == 0:
            offsets[:] = 2**63 - 1  # the counter wraps past the largest int64
        host = rng_module.counter_uniforms(keys, offsets, shape)
        with monkeypatch.context() as patch:
            patch.setattr(rng_module, "HOST_COUNTERS", 0)
            vectorised = rng_module.counter_uniforms(keys, offsets, shape)
        assert host.dtype == torch.float32 and host.shape == shape
        assert torch.equal(host, vectorised)
