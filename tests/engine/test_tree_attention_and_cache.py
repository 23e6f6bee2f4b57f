"""Tree attention and KV-cache maintenance.

* Tree-attention logits of every node equal the logits of a plain forward on that node's path. Tolerance:
  ``atol = 1e-4`` on float32 logits of magnitude ~10 (only summation order differs; measured max ~5e-6).
* After generation, the target cache of every row equals the cache of a fresh prefill of the committed
  text (all but the root token), and the draft cache equals a fresh prefill of the committed text minus
  the pending tokens; same tolerance on keys and values.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DynamicCache

from spec_fast._hf_compat import cache_keyword
from spec_fast.drafts.model import EarlyExitDrafter
from spec_fast.engine import SamplingParams, SpeculativeDecoder
from spec_fast.kv_cache import TreeKVCache
from spec_fast.lean import native
from spec_fast.lean.model import LeanLlama
from spec_fast.strategies import parse_strategy
from tests.engine.models import tiny_gpt2, tiny_llama

ATOL = 1e-4
MODELS = {"llama": tiny_llama(), "gpt2": tiny_gpt2()}
LEAN = LeanLlama.from_hf(MODELS["llama"])
LEAN_FLOAT16 = LeanLlama.from_hf(MODELS["llama"])
LEAN_FLOAT16.set_kv_cache_dtype(torch.float16)


@st.composite
def trees(draw: Any) -> tuple[list[int], list[int], list[int]]:
    """(context tokens, node tokens, node parents) with parents[i] < i, -1 for nodes below the context."""
    context = draw(st.lists(st.integers(0, 63), min_size=1, max_size=6))
    n = draw(st.integers(1, 8))
    parents = [-1] + [draw(st.integers(-1, i - 1)) for i in range(1, n)]
    tokens = draw(st.lists(st.integers(0, 63), min_size=n, max_size=n))
    return context, tokens, parents


def _path(tokens: list[int], parents: list[int], i: int) -> list[int]:
    out = []
    while i >= 0:
        out.append(tokens[i])
        i = parents[i]
    return out[::-1]


@pytest.mark.parametrize("name", sorted(MODELS))
@settings(max_examples=15)
@given(case=trees())
def test_tree_attention_logits_of_every_node_equal_a_plain_forward_on_its_path(name: str, case: Any) -> None:
    model = MODELS[name]
    context, tokens, parents = case
    with torch.no_grad():
        cache = TreeKVCache(model, 1, torch.device("cpu"))
        cache.forward(torch.tensor([context]), torch.tensor([[-1] + list(range(len(context) - 1))]))
        cache.commit(torch.arange(len(context)).unsqueeze(0), torch.tensor([len(context)]))
        logits = cache.forward(torch.tensor([tokens]), torch.tensor([parents])).logits[0]
        for i in range(len(tokens)):
            plain = model(torch.tensor([context + _path(tokens, parents, i)])).logits[0, -1]
            torch.testing.assert_close(logits[i], plain, atol=ATOL, rtol=0)


def _fresh_cache(model: Any, tokens: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(torch.tensor([tokens]), use_cache=True, **{cache_keyword(model.forward): cache})
    return [(layer.keys[0], layer.values[0]) for layer in cache.layers]


def _assert_cache_equal(got: list[tuple[torch.Tensor, torch.Tensor]], want: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    assert len(got) == len(want)
    for (gk, gv), (wk, wv) in zip(got, want):
        torch.testing.assert_close(gk, wk, atol=ATOL, rtol=0)
        torch.testing.assert_close(gv, wv, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize(
    "strategy,temperature", [("chain:3", 0.0), ("iid:3x3", 0.0), ("topk:3,2,6", 0.0), ("iid:2x3", 0.9), ("chain:4", 1.0),
     ("dynatree:2,4,10", 0.0), ("chain:2+adaptive", 0.0), ("iid:2x2+adaptive", 1.0)]
)
@pytest.mark.parametrize("new_tokens", [1, 5, 17])
def test_caches_after_generation_equal_a_fresh_prefill_of_the_accepted_text(
    name: str, strategy: str, temperature: float, new_tokens: int
) -> None:
    model = MODELS[name]
    prompts = [[1, 5, 7, 9, 3], [4, 2], [11]]
    drafter = EarlyExitDrafter(model, 2)
    decoder = SpeculativeDecoder(model, drafter, parse_strategy(strategy))
    result = decoder.generate(prompts, max_new_tokens=new_tokens, sampling=SamplingParams(temperature=temperature, seed=5))
    state = result.state
    assert state is not None
    (head,) = state.heads
    for b in range(len(prompts)):
        committed = state.committed[b]
        assert len(committed) >= len(prompts[b]) + new_tokens
        _assert_cache_equal(state.target_cache.key_values(b), _fresh_cache(model, committed[:-1]))
        in_draft = committed[: len(committed) - len(head.pending[b])]
        assert head.pending[b][-1] == committed[-1]
        if in_draft:
            _assert_cache_equal(head.state.key_values(b), _fresh_cache(drafter.model, in_draft))


@st.composite
def ragged_commits(draw: Any) -> tuple[list[list[int]], int, list[list[int]]]:
    """(prompts of different lengths, block width, per row the block entries it keeps, in order)."""
    prompts = draw(st.lists(st.lists(st.integers(0, 63), min_size=1, max_size=12), min_size=2, max_size=4))
    width = draw(st.integers(1, 5))
    keeps = [sorted(draw(st.sets(st.integers(0, width - 1), max_size=width))) for _ in prompts]
    return prompts, width, keeps


def _force(path: str, patch: pytest.MonkeyPatch) -> None:
    """Make every commit take one path: ``gather`` (the tail gather) or ``move`` (only the kept entries)."""
    if path == "gather":
        patch.setattr(TreeKVCache, "_move_kept", lambda self, keep, counts, most, new_size: self._gather_tail(
            keep, counts, int(self.lengths.min()), new_size))
    elif path == "move":
        patch.setattr(TreeKVCache, "_gather_tail", lambda self, keep, counts, start, new_size: self._move_kept(
            keep, counts, int(counts.max()), new_size))


@pytest.mark.parametrize("path", ["chosen", "gather", "move"])
@pytest.mark.parametrize("name", ["llama", "gpt2", "lean", "lean-float16"])
@settings(max_examples=15, deadline=None)
@given(case=ragged_commits())
def test_a_ragged_commit_keeps_each_rows_context_and_moves_exactly_its_kept_entries(
        name: str, path: str, case: tuple[list[list[int]], int, list[list[int]]]) -> None:
    """Both commit paths (the tail gather, and the move of only the kept entries that ragged rows take
    when it copies less) leave row b's context alone and put block entry keep[b][i] at slot lengths[b] + i.
    The lean model's cache moves them in one native call where the kernels are built (else in torch)."""
    with pytest.MonkeyPatch.context() as patch:
        _force(path, patch)
        _check_ragged_commit({"lean": LEAN, "lean-float16": LEAN_FLOAT16}.get(name) or MODELS[name], *case)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_lean_cache_moves_kept_entries_natively_and_refuses_slots_outside_its_buffers(dtype: torch.dtype) -> None:
    if not native.available():
        pytest.skip(f"native kernels unavailable: {native.unavailable_reason()}")
    cache = LEAN.make_tree_cache(3)
    keys = [torch.randn(3, 2, 16, 8).to(dtype) for _ in cache.layers]
    values = [torch.randn(3, 2, 16, 8).to(dtype) for _ in cache.layers]
    for layer, k, v in zip(cache.layers, keys, values):
        layer.keys, layer.values = k.clone(), v.clone()
    # row 0 keeps entries 9, 11 at 4, 5; row 1 none; row 2 moves 10 -> 10 and 12 -> 11 (targets overlap sources)
    source = torch.tensor([[9, 11], [0, 0], [10, 12]])
    target = torch.tensor([[4, 5], [0, 0], [10, 11]])
    counts = torch.tensor([2, 0, 2])
    calls = []
    with pytest.MonkeyPatch.context() as patch:
        real = native.move_entries
        patch.setattr(native, "move_entries", lambda *a: calls.append(1) or real(*a))
        assert cache.move_entries(source, target, counts, 13)
    assert calls == [1]  # one call for every layer
    for layer, k, v in zip(cache.layers, keys, values):
        want_k, want_v = k.clone(), v.clone()
        for b in range(3):
            for i in range(int(counts[b])):
                want_k[b, :, target[b, i]] = k[b, :, source[b, i]]
                want_v[b, :, target[b, i]] = v[b, :, source[b, i]]
        assert layer.key_length == layer.value_length == 13
        assert torch.equal(layer.keys, want_k[:, :, :13]) and torch.equal(layer.values, want_v[:, :, :13])
    before = [layer.keys.clone() for layer in cache.layers]
    for bad_source, bad_counts in ((torch.tensor([[9, 256], [0, 0], [1, 2]]), counts),  # 256 slots allocated
                                   (torch.tensor([[9, -1], [0, 0], [1, 2]]), counts),
                                   (source, torch.tensor([2, 0, 3]))):
        with pytest.raises(ValueError, match="must index slots"):
            cache.move_entries(bad_source, target, bad_counts, 13)
    assert all(torch.equal(layer.keys, b) for layer, b in zip(cache.layers, before))  # nothing moved
    with native.disabled():
        assert not cache.move_entries(source, target, counts, 13)  # the caller moves them in torch


def test_the_lean_cache_checks_its_buffers_for_a_move_once_and_again_when_they_are_replaced() -> None:
    """A move reuses the cache's checked :class:`native.CacheBuffers` while every buffer is the same object; once
    the buffers are replaced (they grew), the next move checks the new ones and moves entries in them, not in
    the old ones its pointers reached before."""
    if not native.available():
        pytest.skip(f"native kernels unavailable: {native.unavailable_reason()}")
    cache = LEAN.make_tree_cache(2)

    def fill(slots: int) -> list[torch.Tensor]:
        keys = [torch.randn(2, 2, slots, 8) for _ in cache.layers]
        for layer, k in zip(cache.layers, keys):
            layer.keys, layer.values = k.clone(), k.clone() + 1
        return keys

    source, target, counts = torch.tensor([[9, 11], [7, 0]]), torch.tensor([[4, 5], [3, 0]]), torch.tensor([2, 1])
    seen: list[Any] = []
    with pytest.MonkeyPatch.context() as patch:
        real = native.move_entries
        patch.setattr(native, "move_entries", lambda buffers, *a: seen.append(buffers) or real(buffers, *a))
        fill(16)
        assert cache.move_entries(source, target, counts, 12) and cache.move_entries(source, target, counts, 12)
        assert isinstance(seen[0], native.CacheBuffers) and seen[1] is seen[0]
        old_buffers = [layer._keys for layer in cache.layers]
        keys = fill(300)  # more than the first buffers hold: every layer gets new ones
        assert all(layer._keys is not old for layer, old in zip(cache.layers, old_buffers))
        assert cache.move_entries(source, target, counts, 12)
    assert seen[2] is not seen[0] and seen[2].buffers[0][0] is cache.layers[0]._keys
    for layer, k in zip(cache.layers, keys):
        assert torch.equal(layer.keys[0, :, 4], k[0, :, 9]) and torch.equal(layer.keys[0, :, 5], k[0, :, 11])
        assert torch.equal(layer.keys[1, :, 3], k[1, :, 7]) and torch.equal(layer.values[1, :, 3], k[1, :, 7] + 1)


def _check_ragged_commit(model: Any, prompts: list[list[int]], width: int, keeps: list[list[int]]) -> None:
    cache = TreeKVCache(model, len(prompts), torch.device("cpu"))
    longest = max(len(p) for p in prompts)
    tokens = torch.tensor([p + [0] * (longest - len(p)) for p in prompts])
    parents = torch.arange(-1, longest - 1).expand(len(prompts), longest)
    cache.forward(tokens, parents)
    cache.commit(torch.arange(longest).expand(len(prompts), longest), torch.tensor([len(p) for p in prompts]))
    before = [cache.key_values(b) for b in range(len(prompts))]
    block = torch.randint(0, 64, (len(prompts), width), generator=torch.Generator().manual_seed(width))
    cache.forward(block, torch.arange(-1, width - 1).expand(len(prompts), width))
    physical = [(layer.keys.clone(), layer.values.clone()) for layer in cache.cache.layers]
    context = cache.context_size
    counts = [len(k) for k in keeps]
    keep = torch.tensor([k + [0] * (width - len(k)) for k in keeps])
    cache.commit(keep, torch.tensor(counts))
    for b, prompt in enumerate(prompts):
        assert int(cache.lengths[b]) == len(prompt) + counts[b]
        for (keys, values), (old_keys, old_values), (all_keys, all_values) in zip(
                cache.key_values(b), before[b], physical):
            assert torch.equal(keys[:, : len(prompt)], old_keys) and torch.equal(values[:, : len(prompt)], old_values)
            moved = [context + i for i in keeps[b]]
            assert torch.equal(keys[:, len(prompt):], all_keys[b][:, moved])
            assert torch.equal(values[:, len(prompt):], all_values[b][:, moved])


def test_engine_passes_on_cuda_exclude_cudnn_attention_and_restore_the_callers_choice() -> None:
    from spec_fast.kv_cache import decode_attention_backends

    before = torch.backends.cuda.cudnn_sdp_enabled()
    with decode_attention_backends(torch.device("cuda")):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.mem_efficient_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
    with decode_attention_backends(torch.device("cpu")):  # the CPU: nothing to choose, nothing changed
        assert torch.backends.cuda.cudnn_sdp_enabled() == before


def _ancestors_entry_by_entry(ancestors: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """The ancestor-or-self relation grown one new entry at a time (each entry's row = its parent's row plus
    itself): the definition ``extend_ancestors`` closes by doubling."""
    batch, num_old, num_new = ancestors.shape[0], ancestors.shape[1], parents.shape[1]
    out = torch.zeros(batch, num_old + num_new, num_old + num_new, dtype=torch.bool)
    out[:, :num_old, :num_old] = ancestors
    for b in range(batch):
        for j in range(num_new):
            parent = int(parents[b, j])
            if parent >= 0:
                out[b, num_old + j] = out[b, parent]
            out[b, num_old + j, num_old + j] = True
    return out


@given(st.data(), st.integers(1, 3), st.integers(0, 6), st.integers(1, 40))
@settings(max_examples=150, deadline=None)
def test_extend_ancestors_is_the_entry_by_entry_relation(data: Any, batch: int, num_old: int, num_new: int) -> None:
    """Random forests (parents before children, -1 = below the context) appended behind an existing block,
    chains of up to 46 entries included (the doubling's rounds must reach the deepest ancestor)."""
    from spec_fast.tree_attention import extend_ancestors

    def parents_of(start: int, count: int) -> torch.Tensor:
        chain = data.draw(st.booleans())
        return torch.tensor([[start + j - 1 if chain else data.draw(st.integers(-1, start + j - 1))
                              for j in range(count)] for _ in range(batch)], dtype=torch.long)

    empty = torch.zeros(batch, 0, 0, dtype=torch.bool)
    old = _ancestors_entry_by_entry(empty, parents_of(0, num_old)) if num_old else empty
    new_parents = parents_of(num_old, num_new)
    assert torch.equal(extend_ancestors(old, new_parents), _ancestors_entry_by_entry(old, new_parents))


@pytest.mark.parametrize("name", ["lean", "lean-64", "lean-python", "llama", "gpt2"])
@pytest.mark.parametrize("width", [1, 2, 5, 19])
def test_a_chain_forwarded_as_one_equals_the_same_block_as_a_tree(name: str, width: int) -> None:
    """``forward(chain=True)`` (the caller's word that the block is one path below the context) builds the
    ancestor relation and the depths directly and, for the lean forward, passes no mask (its causal
    attention): logits, relation, depths and the cache after a partial commit equal those of the same block
    given as a tree. "lean-64": 64-wide heads in groups of 3 (the native layer's shared sweep over a chunk
    of query rows); "lean-python": every lean layer in Python, where no mask must still mean causal."""
    if name.startswith("lean"):
        hf = tiny_llama(hidden=384, heads=6, kv_heads=2) if name == "lean-64" else MODELS["llama"]
        model = LeanLlama.from_hf(hf)
        model.use_native_layers(name != "lean-python")
    else:
        model = MODELS[name]
    generator = torch.Generator().manual_seed(width)
    context = torch.randint(0, 64, (2, 7), generator=generator)
    block = torch.randint(0, 64, (2, width), generator=generator)
    parents = torch.arange(-1, width - 1).expand(2, width)
    results = []
    for chain in (False, True):
        cache = TreeKVCache(model, 2, torch.device("cpu"))
        with torch.no_grad():
            cache.forward(context, torch.arange(-1, 6).expand(2, 7), chain=chain)
            cache.commit(torch.arange(7).expand(2, 7), torch.tensor([7, 7]))
            logits = cache.forward(block, parents, chain=chain).logits
            relation, depths = cache.ancestors.clone(), cache.block_depths.clone()
            cache.commit(torch.arange(width).expand(2, width), torch.tensor([width, max(width - 1, 0)]))
            after = cache.forward(torch.tensor([[3], [4]]), torch.tensor([[-1], [-1]])).logits
        results.append((logits, relation, depths, after))
    (tree_logits, tree_relation, tree_depths, tree_after), (logits, relation, depths, after) = results
    assert torch.equal(relation, tree_relation) and torch.equal(depths, tree_depths)
    if name in ("lean", "lean-64"):  # the native causal limit attends the slots the mask allows, in their order
        assert torch.equal(logits, tree_logits) and torch.equal(after, tree_after)
    else:
        torch.testing.assert_close(logits, tree_logits, rtol=0, atol=ATOL)
        torch.testing.assert_close(after, tree_after, rtol=0, atol=ATOL)
