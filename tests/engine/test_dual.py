"""Dual drafting (seed 000 (docs/papers.md) routing, seed 001 merged tree): greedy losslessness in the engine, and the
engine's recorded steps cross-checked against :mod:`spec_ref.dual` (merged tree, mask, positions, path
matrix; route choice; greedy commit). Tiny random models; SmolLM2 behind ``model``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from spec_fast import DualDrafter
from spec_fast.drafts.model import EarlyExitDrafter, ModelDrafter
from spec_fast.drafts.batch import DraftBatch, pending_forward
from spec_fast.drafts.topk import draft_topk_tree
from spec_fast.drafts.dual import merge_trees, route, tree_layout, union_tree
from spec_fast.engine import SpeculativeDecoder
from spec_fast.engine.prefill import prefill_drafter
from spec_fast.drafts.retrieval import RetrievalDrafter, SuffixIndex
from spec_fast.strategies import parse_strategy
from spec_fast.verify import verify_greedy
from spec_ref import dual as ref_dual
from spec_ref.drafting import ScoredDraftTree
from spec_ref.drafting import draft_topk_tree as ref_draft_topk_tree
from tests.engine.models import tiny_llama

TARGET = tiny_llama(vocab_size=32, seed=21)
DRAFT_MODEL = tiny_llama(vocab_size=32, layers=1, seed=4)
RETRIEVAL = RetrievalDrafter(SuffixIndex([[1, 5, 7, 9, 3, 2, 2, 8], [4, 2, 6, 6, 1], [8, 8, 1, 3, 5, 7]], 32, 4), 32, 4)
PROMPTS = [[1, 5, 7, 9, 3], [4, 2], [8, 8, 8, 8, 8, 8, 8, 1], [30]]
NEW_TOKENS = 14


def _ar(prompts: list[list[int]], new: int) -> list[list[int]]:
    return SpeculativeDecoder(TARGET, None, parse_strategy("ar")).generate(prompts, max_new_tokens=new).tokens


AR = _ar(PROMPTS, NEW_TOKENS)
HEADS = {
    "early-exit,model": lambda: (EarlyExitDrafter(TARGET, 1), ModelDrafter(DRAFT_MODEL)),
    "model,retrieval": lambda: (ModelDrafter(DRAFT_MODEL), RETRIEVAL),
    "same,same": lambda: (EarlyExitDrafter(TARGET, 2), EarlyExitDrafter(TARGET, 2)),
}


@pytest.mark.parametrize("mode", ["merge", "route"])
@pytest.mark.parametrize("heads,strategy", [("early-exit,model", "chain:3"), ("model,retrieval", "topk:3,2,5"),
                                            ("same,same", "topk:2,2,4")])
def test_greedy_dual_output_equals_ar(mode: str, strategy: str, heads: str) -> None:
    first, second = HEADS[heads]()
    decoder = SpeculativeDecoder(TARGET, DualDrafter(first, second, mode), parse_strategy(strategy))
    result = decoder.generate(PROMPTS, max_new_tokens=NEW_TOKENS)
    assert result.tokens == AR
    metrics = result.metrics
    assert sum(metrics.head_accepted_tokens) == sum(
        t * n for t, n in enumerate(metrics.accepted_length_histogram))
    if mode == "route":  # every drafted (row, step) verified one head's tree; a row's last step may be plain
        steps = sum(metrics.accepted_length_histogram)
        assert steps - len(PROMPTS) <= sum(metrics.head_selected) <= steps
    if heads == "same,same" and mode == "merge":  # identical subtrees: the tie goes to head 1
        # (routing compares float32 means that two identical heads compute over differently shaped
        # pending blocks, so their ties are only ties up to rounding)
        assert metrics.head_selected[1] == 0 and metrics.head_accepted_tokens[1] == 0


def test_dual_with_adaptive_and_eos_stays_exact() -> None:
    eos = AR[0][6]
    decoder = SpeculativeDecoder(TARGET, DualDrafter(ModelDrafter(DRAFT_MODEL), RETRIEVAL, "merge"),
                                 parse_strategy("chain:2+adaptive"))
    result = decoder.generate(PROMPTS, max_new_tokens=NEW_TOKENS, eos_token_id=eos)
    for got, want in zip(result.tokens, AR):
        assert got == (want[: want.index(eos) + 1] if eos in want else want)


def test_dual_drafter_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="mode must be one of"):
        DualDrafter(RETRIEVAL, RETRIEVAL, "vote")
    with pytest.raises(ValueError, match="vocabularies differ"):
        DualDrafter(RETRIEVAL, ModelDrafter(tiny_llama(vocab_size=16)))
    with pytest.raises(ValueError, match="deterministic 'chain' or 'topk'"):
        SpeculativeDecoder(TARGET, DualDrafter(RETRIEVAL, RETRIEVAL), parse_strategy("iid:2x2"))


# ---- cross-checks against spec_ref.dual on recorded steps ----------------------------------------------
def _heads_drafts(first: Any, second: Any, prompts: list[list[int]], depth: int, k: int, budget: int
                  ) -> tuple[DraftBatch, DraftBatch]:
    """The first step's two trees, drafted from the prompts as the engine does (prefill, then draft)."""
    drafts = []
    for drafter in (first, second):
        state = drafter.begin(len(prompts), torch.device("cpu"))
        prefill_drafter(drafter, state, prompts, torch.device("cpu"))
        with torch.no_grad():
            drafts.append(draft_topk_tree(drafter, state, [[p[-1]] for p in prompts], [p[-1] for p in prompts],
                                          depth, k, budget, torch.device("cpu")))
    return drafts[0], drafts[1]


def _row_tree(draft: DraftBatch, b: int) -> ScoredDraftTree:
    """Row b of an engine draft as a spec_ref ScoredDraftTree, in the engine's own slot order."""
    tree = draft.tree
    valid = [i for i in range(tree.num_slots) if bool(tree.valid[b, i])]
    slot = {s: i for i, s in enumerate(valid)}
    tokens = tuple(int(tree.tokens[b, s]) for s in valid)
    parents = tuple(-1 if s == 0 else slot[int(tree.parents[b, s])] for s in valid)
    draws = tuple(tuple(int(t) for t in tree.draws[b, s] if t >= 0) for s in valid)
    confidences = tuple(1.0 if s == 0 else float(draft.confidences[b, s]) for s in valid)
    return ScoredDraftTree(tokens, parents, draws, (None,) * len(valid), "deterministic", confidences=confidences)


def _compact(values: torch.Tensor, keep: list[int], dims: int = 1) -> np.ndarray:
    index = torch.tensor(keep)
    out = values.index_select(0, index)
    if dims == 2:
        out = out.index_select(1, index)
    return out.numpy()


PAIRS = {"early-exit,model": HEADS["early-exit,model"], "same,same": HEADS["same,same"],
         "model,retrieval": HEADS["model,retrieval"]}


@pytest.mark.parametrize("pair", sorted(PAIRS))
@pytest.mark.parametrize("depth,k,budget", [(3, 2, 5), (3, 1, 3), (2, 3, 6)])
def test_merged_tree_mask_positions_and_paths_equal_spec_ref(pair: str, depth: int, k: int, budget: int) -> None:
    first, second = PAIRS[pair]()
    a, b = _heads_drafts(first, second, PROMPTS, depth, k, budget)
    merged = merge_trees(a, b)
    mask, positions, paths = tree_layout(merged.batch.tree)
    for row in range(len(PROMPTS)):
        want = ref_dual.merge_trees(_row_tree(a, row), _row_tree(b, row))
        keep = [i for i in range(merged.batch.tree.num_slots) if bool(merged.batch.tree.valid[row, i])]
        slot = {s: i for i, s in enumerate(keep)}
        assert tuple(int(t) for t in _compact(merged.batch.tree.tokens[row], keep)) == want.tokens
        got_parents = tuple(-1 if s == 0 else slot[int(merged.batch.tree.parents[row, s])] for s in keep)
        assert got_parents == want.parents
        assert tuple(int(h) for h in _compact(merged.heads[row], keep)) == want.heads
        assert (_compact(mask[row], keep, 2) == want.layout.attention_mask).all()
        assert (_compact(positions[row], keep) == want.layout.positions).all()
        got_paths = [[slot[int(s)] for s in p if s >= 0] for p in paths[row].tolist() if p[0] >= 0]
        assert got_paths == [[int(s) for s in p if s >= 0] for p in want.layout.path_matrix]


def _target_logits(prompts: list[list[int]], tree: Any) -> torch.Tensor:
    """``[B, N, V]`` target logits at every slot, each from a plain full forward of prompt + path."""
    out = torch.zeros(tree.batch_size, tree.num_slots, TARGET.config.vocab_size)
    for b, prompt in enumerate(prompts):
        for s in range(tree.num_slots):
            if not bool(tree.valid[b, s]):
                continue
            path, node = [], s
            while node > 0:
                path.append(int(tree.tokens[b, node]))
                node = int(tree.parents[b, node])
            with torch.no_grad():
                out[b, s] = TARGET(torch.tensor([prompt + path[::-1]])).logits[0, -1]
    return out


@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_greedy_commit_on_the_merged_tree_equals_verify_merged_greedy(pair: str) -> None:
    first, second = PAIRS[pair]()
    a, b = _heads_drafts(first, second, PROMPTS, 3, 2, 5)
    merged = merge_trees(a, b)
    logits = _target_logits(PROMPTS, merged.batch.tree)
    out = verify_greedy(merged.batch.tree, logits)
    for row, prompt in enumerate(PROMPTS):
        want = ref_dual.verify_merged_greedy(
            ref_dual.merge_trees(_row_tree(a, row), _row_tree(b, row)),
            lambda prefix, prompt=prompt: torch.softmax(
                TARGET(torch.tensor([prompt + list(prefix)])).logits[0, -1].double(), -1).detach().numpy())
        emitted = [int(t) for t in out.emitted[row] if t >= 0]
        assert tuple(emitted) == want.tokens
        node = int(out.accepted_node[row])
        assert int(merged.heads[row, node]) == want.head


def _float64_topk(drafter: Any, prompt: list[int], depth: int, k: int, budget: int) -> ScoredDraftTree:
    def model(prefix: tuple[int, ...]) -> np.ndarray:
        state = drafter.begin(1, torch.device("cpu"))
        with torch.no_grad():
            logits, _ = pending_forward(drafter, state, [prompt + list(prefix)], torch.device("cpu"))
        return torch.softmax(logits[0, 0].double(), -1).numpy()

    return ref_draft_topk_tree(model, depth, k, budget)


@pytest.mark.parametrize("pair", ["early-exit,model", "model,retrieval"])
@pytest.mark.parametrize("depth,k,budget", [(3, 2, 5), (2, 1, 2)])
def test_route_choice_equals_spec_ref_route(pair: str, depth: int, k: int, budget: int) -> None:
    first, second = PAIRS[pair]()
    a, b = _heads_drafts(first, second, PROMPTS, depth, k, budget)
    routed = route(a, b)
    assert routed.choice is not None and routed.mean_confidences is not None
    for row, prompt in enumerate(PROMPTS):
        tree_a = _float64_topk(first, prompt, depth, k, budget)
        tree_b = _float64_topk(second, prompt, depth, k, budget)
        want = ref_dual.route(tree_a, tree_b)
        assert int(routed.choice[row]) == want.head
        np.testing.assert_allclose(routed.mean_confidences[row].numpy(), np.array(want.mean_confidences, float),
                                   rtol=1e-5)


def test_union_tree_merges_duplicate_tokens_and_keeps_both_heads_entries() -> None:
    drafter = EarlyExitDrafter(TARGET, 2)
    a, b = _heads_drafts(drafter, EarlyExitDrafter(TARGET, 2), PROMPTS, 3, 2, 5)
    union = union_tree(a, b)
    tree = union.batch.tree
    n1 = a.tree.num_slots - 1
    # identical heads: every head-2 node duplicates a head-1 node, so the union is head 1's tree
    assert not bool(tree.valid[:, n1 + 1:].any())
    assert torch.equal(tree.tokens[:, : n1 + 1], a.tree.tokens)
    assert torch.equal(union.head_entries[1][:, 1: n1 + 1] >= 0, a.entries[:, 1:] >= 0)


@pytest.mark.model
@pytest.mark.parametrize("mode", ["merge", "route"])
def test_smollm2_greedy_dual_output_equals_ar(smollm2: Any, mode: str) -> None:
    from spec_fast.models import chat_prompt_ids

    model, tokenizer = smollm2
    prompts = [chat_prompt_ids(tokenizer, "Name three colours of the rainbow."),
               chat_prompt_ids(tokenizer, "Write one sentence about the sea.")]
    want = SpeculativeDecoder(model, None, parse_strategy("ar")).generate(prompts, max_new_tokens=16).tokens
    dual = DualDrafter(EarlyExitDrafter(model, 8), EarlyExitDrafter(model, 12), mode)
    got = SpeculativeDecoder(model, dual, parse_strategy("topk:3,2,6")).generate(prompts, max_new_tokens=16)
    assert got.tokens == want


@pytest.mark.parametrize("argv", [["generate", "hi", "--draft", "rnn,retrieval"],
                                  ["generate", "hi", "--draft", "retrieval", "--dual", "merge"],
                                  ["generate", "hi", "--draft", "rnn,eagle,retrieval", "--dual", "route"]])
def test_cli_dual_needs_two_drafts_and_a_mode(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from spec_fast.cli import main

    assert main(argv) == 2
    assert "--dual needs exactly two drafts" in capsys.readouterr().err


@pytest.mark.parametrize("mode,temperature", [("merge", 0.0), ("route", 0.0), ("merge", 0.9), ("route", 0.9)])
def test_both_heads_caches_follow_the_committed_text_whichever_head_won(mode: str, temperature: float) -> None:
    """After generation each model head's cache equals a fresh prefill of the committed text it has seen
    (all but its pending tokens), and its pending tokens end at the last committed token (seed 000 7)."""
    from spec_fast.decoding import SamplingParams
    from tests.engine.test_tree_attention_and_cache import _assert_cache_equal, _fresh_cache

    first, second = ModelDrafter(DRAFT_MODEL), EarlyExitDrafter(TARGET, 1)
    decoder = SpeculativeDecoder(TARGET, DualDrafter(first, second, mode), parse_strategy("topk:3,2,5"))
    result = decoder.generate(PROMPTS, max_new_tokens=9, sampling=SamplingParams(temperature=temperature, seed=2))
    assert result.state is not None
    for b, committed in enumerate(result.state.committed):
        _assert_cache_equal(result.state.target_cache.key_values(b), _fresh_cache(TARGET, committed[:-1]))
        for head, drafter in zip(result.state.heads, (first, second)):
            pending = head.pending[b]
            assert pending and pending == committed[len(committed) - len(pending):]
            seen = committed[: len(committed) - len(pending)]
            if seen:
                _assert_cache_equal(head.state.key_values(b), _fresh_cache(drafter.model, seen))
