"""Prefix caching: a request that shares a prompt prefix with an earlier one reuses its cache entries.

Reuse must change nothing but the prefill's work: the cache after the prefill and the root logits equal,
bit for bit, those of a prefill without reuse, and every request's tokens (greedy, and seeded sampled under
a fixed depth) equal its tokens with the prefix cache off. The negative control reuses the entries one
position off (what a wrong offset in the load would do): the same comparison must then fail.
"""

from __future__ import annotations

import random

import pytest
import torch

from spec_fast.decoding import SamplingParams
from spec_fast.drafts.retrieval import RetrievalDrafter
from spec_fast.engine import SpeculativeDecoder
from spec_fast.engine.batch_engine import BatchEngine
from spec_fast.engine.prefix_cache import PrefixCache, PrefixMatch
from spec_fast.lean import LeanLlama
from spec_fast.strategies import parse_strategy
from tests.engine.models import tiny_llama

VOCAB = 48
TARGET = tiny_llama(vocab_size=VOCAB, seed=7)
LEAN = LeanLlama.from_hf(TARGET, "float32")
_RNG = random.Random(5)
SHARED = [_RNG.randrange(VOCAB) for _ in range(12)]
# a shared opening with different tails, a repeat, a prompt that is a prefix of another, and a stranger
PROMPTS = ([SHARED + [_RNG.randrange(VOCAB) for _ in range(_RNG.randint(1, 6))] for _ in range(3)]
           + [SHARED + [3, 4, 5], SHARED + [3, 4, 5], SHARED + [3, 4, 5, 6, 7], SHARED[:9] + [1, 2],
              [_RNG.randrange(VOCAB) for _ in range(10)]])
SAMPLINGS = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.9, seed=21),
             SamplingParams(temperature=1.1, top_k=12, seed=22)]


def decoder(strategy: str) -> SpeculativeDecoder:
    drafter = RetrievalDrafter(None, VOCAB) if strategy != "ar" else None
    return SpeculativeDecoder(LEAN, drafter, parse_strategy(strategy))


def run(dec: SpeculativeDecoder, prefix_cache_tokens: int) -> tuple[list[list[int]], BatchEngine]:
    """Every prompt through one engine (two at a time, each arriving one step after the previous)."""
    engine = BatchEngine(dec, max_batch_size=2, depth_policy="fixed", prefix_cache_tokens=prefix_cache_tokens)
    tokens: dict[int, list[int]] = {}
    cached: dict[int, int] = {}
    order: list[int] = []
    for step in range(200):
        if len(order) < len(PROMPTS):
            i = len(order)
            order.append(engine.add_request(PROMPTS[i], SAMPLINGS[i % len(SAMPLINGS)], 6 + i % 3))
            tokens[order[-1]] = []
        for out in engine.step():
            tokens[out.request_id].extend(out.new_tokens)
            if out.finished:
                cached[out.request_id] = out.stats.cached_prompt_tokens
        if len(order) == len(PROMPTS) and not engine.has_unfinished():
            break
    if engine.prefix_cache is not None:  # the requests' counts add up to the cache's
        assert sum(cached.values()) == engine.prefix_cache.reused_tokens
    return [tokens[r] for r in order], engine


@pytest.mark.parametrize("strategy", ["ar", "chain:3"])
def test_reusing_prompt_prefixes_changes_no_token(strategy: str) -> None:
    dec = decoder(strategy)
    without, _ = run(dec, 0)
    with_reuse, engine = run(dec, 4096)
    assert engine.prefix_cache is not None and engine.prefix_cache.hits >= 4
    assert engine.prefix_cache.reused_tokens >= 4 * 9
    assert with_reuse == without


def prefill(prompts: list[list[int]], cache: PrefixCache | None) -> tuple[torch.Tensor, list[list[torch.Tensor]]]:
    """The root logits and every row's committed keys and values after a prefill of ``prompts``."""
    state = decoder("ar").begin(prompts, [4] * len(prompts), [SamplingParams()] * len(prompts),
                                [0] * len(prompts), set(), prefix_cache=cache)
    assert state.root_logits is not None
    entries = [[t for kv in state.target_cache.key_values(b) for t in kv] for b in range(len(prompts))]
    return state.root_logits, entries


def test_a_reused_prefix_leaves_the_cache_and_root_logits_of_a_full_prefill_bit_for_bit() -> None:
    cache = PrefixCache()
    prefill([PROMPTS[0], PROMPTS[7]], cache)  # fills the cache
    prompts = [PROMPTS[1], PROMPTS[3], PROMPTS[7], [5, 1, 4, 1, 5]]  # a shared opening, a repeat, a stranger
    logits, entries = prefill(prompts, cache)
    assert cache.hits == 3
    expected_logits, expected_entries = prefill(prompts, None)
    assert torch.equal(logits, expected_logits)
    for row, expected_row in zip(entries, expected_entries):
        assert all(torch.equal(a, b) for a, b in zip(row, expected_row))


class _OffByOne(PrefixCache):
    """Known-bad: hands out each reused prefix's entries shifted by one position."""

    def lookup(self, prompt: list[int], dtype: torch.dtype) -> PrefixMatch:  # type: ignore[override]
        match = super().lookup(prompt, dtype)
        if match.length == 0:
            return match
        shifted = tuple((torch.roll(k, 1, dims=1), torch.roll(v, 1, dims=1)) for k, v in match.layers)
        return PrefixMatch(match.length, shifted)


def test_negative_control_entries_reused_one_position_off_change_the_logits() -> None:
    cache = _OffByOne()
    prefill([PROMPTS[0]], cache)
    logits, _ = prefill([PROMPTS[1]], cache)
    assert cache.hits == 1
    expected, _ = prefill([PROMPTS[1]], None)
    assert not torch.equal(logits, expected)


def _layers(n: int, value: float = 0.0, dtype: torch.dtype = torch.float32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.full((2, n, 4), value, dtype=dtype), torch.full((2, n, 4), value, dtype=dtype))] * 3


def test_the_cache_keeps_its_budget_least_recently_used_first_out_and_leaves_the_last_token() -> None:
    cache = PrefixCache(max_tokens=30, min_tokens=4)
    a, b = list(range(10)), list(range(100, 112))
    cache.store(a, _layers(10))
    cache.store(b, _layers(12))
    assert cache.lookup(a, torch.float32).length == 9  # the prompt's last token is always computed
    assert cache.lookup(a + [7], torch.float32).length == 10
    assert cache.lookup(a[:3] + [50, 51], torch.float32).length == 0  # below min_tokens
    assert cache.lookup(a + [7], torch.float16).length == 0  # entries of another cache dtype
    cache.store(list(range(200, 212)), _layers(12))  # 34 tokens: b, used least recently, leaves
    assert cache.lookup(b + [1], torch.float32).length == 0 and cache.lookup(a + [1], torch.float32).length == 10
    assert cache.cached_tokens == 22
    cache.store(a + [1, 2], _layers(12, 1.0))  # extends a stored prompt: replaces it
    assert len(cache) == 2 and cache.cached_tokens == 24
    match = cache.lookup(a + [1, 2, 3], torch.float32)
    assert match.length == 12 and float(match.layers[0][0][0, 0, 0]) == 1.0
    cache.store(list(range(40)), _layers(40))  # over the whole budget: not stored
    assert cache.cached_tokens == 24


def test_prefix_caching_is_on_where_reuse_is_exact_and_refused_where_it_is_not() -> None:
    assert BatchEngine(decoder("ar")).prefix_cache is not None
    assert BatchEngine(decoder("ar"), static=True).prefix_cache is None
    assert BatchEngine(decoder("ar"), prefix_cache_tokens=0).prefix_cache is None
    hf = SpeculativeDecoder(TARGET, None, parse_strategy("ar"))
    assert BatchEngine(hf).prefix_cache is None
    with pytest.raises(ValueError, match="prefix_cache_tokens=64 needs a target"):
        BatchEngine(hf, prefix_cache_tokens=64)
    with pytest.raises(ValueError, match="prefix_cache_tokens must be"):
        BatchEngine(decoder("ar"), prefix_cache_tokens=-1)
