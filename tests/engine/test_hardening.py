"""Engine-level hardening: a tiny temperature is the T -> 0 limit (never an id outside [0, V)), absurd tree
sizes and seeds are refused before anything is allocated, the CLI reports them in one line."""

from __future__ import annotations

import pytest
import torch

from spec_fast.drafts.model import EarlyExitDrafter
from spec_fast.engine import SamplingParams, SpeculativeDecoder
from spec_fast.strategies import MAX_TREE_NODES, parse_strategy
from tests.engine.models import tiny_llama

VOCAB = 64


def _large_logit_target() -> torch.nn.Module:
    """A tiny Llama whose logits reach ~+-100: logits / 1e-38 overflows float32 (the old NaN path)."""
    model = tiny_llama(vocab_size=VOCAB)
    with torch.no_grad():
        model.lm_head.weight.mul_(100.0)
    return model


@pytest.mark.parametrize(
    ("spec", "temperature"), [("chain:3", 1e-38), ("iid:2x2", 1e-38), ("dynatree:1,3,8", 1e-38), ("chain:3", 1e-300)]
)
def test_a_tiny_temperature_decodes_like_greedy_and_stays_in_the_vocabulary(spec: str, temperature: float) -> None:
    """T = 1e-38 used to stream token V = 64 and then raise IndexError; its limit is the argmax (no ties in
    these random logits), so the tokens equal greedy decoding."""
    torch.manual_seed(0)
    target = _large_logit_target()
    prompts = [[1, 2, 3], [5, 9]]
    greedy = SpeculativeDecoder(target, EarlyExitDrafter(target, 2), parse_strategy(spec)).generate(
        prompts, max_new_tokens=6
    )
    strategy = parse_strategy(spec, "nss" if spec.startswith("dynatree") else None)
    tiny = SpeculativeDecoder(target, EarlyExitDrafter(target, 2), strategy).generate(
        prompts, max_new_tokens=6, sampling=SamplingParams(temperature=temperature, seed=3)
    )
    for row in tiny.tokens:
        assert all(0 <= t < VOCAB for t in row)
    assert tiny.tokens == greedy.tokens


@pytest.mark.parametrize(
    ("spec", "nodes"), [("iid:128x32", 4097), ("delayed:100,2,20", 2003), ("topk:4,2,5000", 5001), ("iid:1000000x1", 1000001)]
)
def test_strategies_with_too_many_nodes_are_refused_with_a_memory_estimate(spec: str, nodes: int) -> None:
    with pytest.raises(ValueError, match=rf"{nodes} nodes per tree, more than {MAX_TREE_NODES}; .* GiB per prompt"):
        parse_strategy(spec)
    assert parse_strategy("iid:32x31").max_nodes == 993


@pytest.mark.parametrize("seed", [-1, 2**64 - 1, 2**64, 2**70])
def test_seeds_outside_64_bits_are_refused(seed: int) -> None:
    with pytest.raises(ValueError, match=rf"seed must be an integer in \[0, 2\*\*64 - 1\), got seed={seed}"):
        SamplingParams(temperature=1.0, seed=seed)
    SamplingParams(temperature=1.0, seed=2**64 - 2)  # the largest: seed + 1 still fits the counter stream


def test_the_largest_seed_decodes() -> None:
    target = tiny_llama(vocab_size=VOCAB)
    decoder = SpeculativeDecoder(target, EarlyExitDrafter(target, 2), parse_strategy("chain:2"))
    out = decoder.generate([[1, 2]], max_new_tokens=4, sampling=SamplingParams(temperature=1.0, seed=2**64 - 2))
    assert len(out.tokens[0]) == 4 and all(0 <= t < VOCAB for t in out.tokens[0])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["generate", "hi", "--strategy", "iid:128x32", "--temperature", "1"], "4097 nodes per tree"),
        (["generate", "hi", "--seed", str(2**64)], "--seed: must be an integer in [0, 2**64 - 1)"),
        (["generate", "hi", "--seed", "-5"], "got -5"),
    ],
)
def test_the_cli_reports_size_and_seed_limits_in_one_line(argv: list[str], message: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from spec_fast.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
