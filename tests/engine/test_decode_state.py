"""Per-call state: one decoder shared by two threads gives each call the tokens it gives alone, and a seeded
call repeats its tokens exactly, with and without ``+adaptive`` (the controller steers greedy calls only)."""

from __future__ import annotations

import pytest
from spec_fast.decoding import SamplingParams
from spec_fast.drafts.model import EarlyExitDrafter
from spec_fast.engine import SpeculativeDecoder
from spec_fast.strategies import parse_strategy
from tests.engine.models import tiny_llama
from tests.engine.threads import run_in_two_threads

TARGET = tiny_llama(vocab_size=32, seed=5)
PROMPTS = ([[1, 5, 7, 9, 3], [4, 2]], [[8, 8, 1], [30, 2, 2, 2, 9, 1], [6]])


@pytest.mark.parametrize("strategy,temperature", [("topk:3,2,6", 0.0), ("iid:2x3", 0.9), ("dynatree:2,4,10", 0.0)])
def test_two_threads_sharing_a_decoder_get_the_tokens_of_calls_run_alone(strategy: str, temperature: float) -> None:
    decoder = SpeculativeDecoder(TARGET, EarlyExitDrafter(TARGET, 1), parse_strategy(strategy))
    sampling = [SamplingParams(temperature=temperature, seed=s) for s in (3, 4)]
    alone = [decoder.generate(p, max_new_tokens=16, sampling=s).tokens for p, s in zip(PROMPTS, sampling)]
    together = run_in_two_threads(
        lambda i: decoder.generate(PROMPTS[i], max_new_tokens=16, sampling=sampling[i]).tokens)
    assert together == [[alone[0]] * 2, [alone[1]] * 2]


@pytest.mark.parametrize("strategy", ["chain:3", "chain:3+adaptive", "iid:2x2+adaptive"])
def test_a_seeded_call_repeats_its_tokens_with_and_without_adaptive(strategy: str) -> None:
    decoder = SpeculativeDecoder(TARGET, EarlyExitDrafter(TARGET, 1), parse_strategy(strategy))
    sampling = SamplingParams(temperature=1.0, top_p=0.9, seed=11)
    first = decoder.generate(PROMPTS[1], max_new_tokens=12, sampling=sampling).tokens
    decoder.generate(PROMPTS[0], max_new_tokens=12)  # a greedy call in between trains the controller
    assert decoder.generate(PROMPTS[1], max_new_tokens=12, sampling=sampling).tokens == first
    plain = SpeculativeDecoder(TARGET, EarlyExitDrafter(TARGET, 1), parse_strategy(strategy.replace("+adaptive", "")))
    assert plain.generate(PROMPTS[1], max_new_tokens=12, sampling=sampling).tokens == first
