"""The engine on a CUDA device: what the CPU suite checks, rerun where the tensors live on the GPU.

These run under ``scripts/gpu_check.sh`` (``pytest -m gpu``) on a machine with a CUDA device and are skipped
elsewhere; CI has no GPU. They pin the promises that depend on where the tensors live:

* greedy speculative output equals greedy plain output (and HF ``generate``) in float32, every tree shape;
* requests that join and leave a running :class:`BatchEngine` get the tokens they get alone;
* a seeded sampled run repeats itself and never emits a token outside the vocabulary;
* host reads per step stay within the budget the CPU suite documents (``tests/engine/test_host_syncs.py``),
  so the device never waits on the host more often than on the CPU.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import pytest
import torch

from spec_fast.engine.batch_engine import BatchEngine
from spec_fast.decoding import SamplingParams
from spec_fast.drafts.dual import DualDrafter
from spec_fast.drafts.model import EarlyExitDrafter, ModelDrafter
from spec_fast.engine import SpeculativeDecoder
from spec_fast.strategies import parse_strategy
from tests.engine.models import tiny_llama
from tests.engine.test_host_syncs import _reads_per_step

#: ``SPEC_VERIFY_GPU_TEST_DEVICE=cpu`` runs this module on the CPU: a dry run of the tests themselves, on a
#: machine without a GPU, before a scarce GPU session spends its minutes on them
CUDA = torch.device(os.environ.get("SPEC_VERIFY_GPU_TEST_DEVICE", "cuda"))
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(CUDA.type == "cuda" and not torch.cuda.is_available(),
                                                  reason="needs a CUDA device")]
PROMPTS = [[1, 5, 7, 9, 3], [4, 2], [8, 8, 8, 8, 8, 8, 8, 1], [60]]
NEW_TOKENS = 24
STRATEGIES = ["chain:1", "chain:4", "iid:3x3", "delayed:2,1,2", "topk:3,2,6", "dynatree", "chain:3+adaptive"]


@pytest.fixture(scope="module")
def target() -> Any:
    return tiny_llama().to(CUDA)


@pytest.fixture(scope="module")
def plain(target: Any) -> list[list[int]]:
    return SpeculativeDecoder(target, None, parse_strategy("ar")).generate(PROMPTS, NEW_TOKENS).tokens


def test_plain_decoding_on_the_device_equals_hf_generate(target: Any, plain: list[list[int]]) -> None:
    for prompt, tokens in zip(PROMPTS, plain):
        out = target.generate(torch.tensor([prompt], device=CUDA), max_new_tokens=NEW_TOKENS,
                              min_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert out[0, len(prompt):].tolist() == tokens


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("draft", ["early-exit", "separate"])
def test_greedy_speculative_output_equals_plain_output_on_the_device(target: Any, plain: list[list[int]],
                                                                    strategy: str, draft: str) -> None:
    drafter = EarlyExitDrafter(target, 2) if draft == "early-exit" else ModelDrafter(
        tiny_llama(layers=1, seed=7).to(CUDA))
    result = SpeculativeDecoder(target, drafter, parse_strategy(strategy)).generate(PROMPTS, NEW_TOKENS)
    assert result.tokens == plain


@pytest.mark.parametrize("mode", ["merge", "route"])
def test_a_dual_draft_is_lossless_on_the_device(target: Any, plain: list[list[int]], mode: str) -> None:
    drafter = DualDrafter(ModelDrafter(tiny_llama(layers=1, seed=7).to(CUDA)), EarlyExitDrafter(target, 1), mode)
    assert SpeculativeDecoder(target, drafter, parse_strategy("chain:3")).generate(PROMPTS, NEW_TOKENS).tokens == plain


def test_requests_joining_a_running_batch_on_the_device_get_their_solo_tokens(target: Any,
                                                                              plain: list[list[int]]) -> None:
    engine = BatchEngine(SpeculativeDecoder(target, EarlyExitDrafter(target, 2), parse_strategy("chain:3")),
                         max_batch_size=2)
    got: dict[int, list[int]] = {}
    ids: dict[int, int] = {}
    for step in range(200):  # bounded: 4 requests of 24 tokens end well before
        if step < len(PROMPTS):  # one arrival per step, more than the batch holds
            ids[engine.add_request(PROMPTS[step], SamplingParams(), NEW_TOKENS)] = step
        for output in engine.step():
            got.setdefault(ids[output.request_id], []).extend(output.new_tokens)
        if step >= len(PROMPTS) and not engine.has_unfinished():
            break
    assert [got[i] for i in range(len(PROMPTS))] == plain


def test_seeded_sampling_on_the_device_repeats_and_stays_in_the_vocabulary(target: Any) -> None:
    decoder = SpeculativeDecoder(target, EarlyExitDrafter(target, 2), parse_strategy("iid:2x3"))
    sampling = SamplingParams(temperature=0.8, top_p=0.95, seed=11)
    first = decoder.generate(PROMPTS, NEW_TOKENS, sampling=sampling).tokens
    again = decoder.generate(PROMPTS, NEW_TOKENS, sampling=sampling).tokens
    assert first == again
    vocab = int(target.config.vocab_size)
    assert all(0 <= t < vocab for row in first for t in row)


@pytest.mark.parametrize(("strategy", "budget"), [("ar", 2), ("chain:3", 3), ("topk:3,2,5", 3 + 2 * 3)])
def test_host_reads_per_step_on_the_device_stay_within_the_cpu_budget(target: Any, strategy: str,
                                                                     budget: int) -> None:
    decoder = SpeculativeDecoder(target, ModelDrafter(tiny_llama(layers=1, seed=4).to(CUDA)) if strategy != "ar"
                                 else None, parse_strategy(strategy))
    assert _reads_per_step(decoder, 8) <= budget


def _cudnn_attention_calls(engine: BatchEngine, steps: int) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            engine.step()
    return sum(event.count for event in prof.key_averages() if "cudnn_attention" in event.key)


def test_decoding_steps_on_the_device_never_build_cudnn_attention_plans(monkeypatch: pytest.MonkeyPatch) -> None:
    """cuDNN's attention builds a plan per new key length (a decoding step's is new every step), which cost
    ~1.2 ms of host time per layer per step on an H200; the engine's passes exclude it. The control lets
    torch choose and sees cuDNN chosen for the same bfloat16 steps (on a card where torch prefers it)."""
    import spec_fast.kv_cache as kv_cache

    model = tiny_llama(vocab_size=256, layers=2, hidden=256).to(CUDA, torch.bfloat16)

    def running_engine() -> BatchEngine:
        engine = BatchEngine(SpeculativeDecoder(model, None, parse_strategy("ar")), max_batch_size=2)
        for prompt in PROMPTS[:2]:
            engine.add_request(prompt, SamplingParams(), 12)
        engine.step()
        return engine

    with torch.inference_mode():
        assert _cudnn_attention_calls(running_engine(), 6) == 0
        if CUDA.type == "cuda":
            monkeypatch.setattr(kv_cache, "decode_attention_backends", lambda device: contextlib.nullcontext())
            assert _cudnn_attention_calls(running_engine(), 6) > 0
