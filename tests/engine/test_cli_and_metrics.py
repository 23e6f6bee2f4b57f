"""CLI argument handling (errors before any model load) and the per-generation metrics."""

from __future__ import annotations

import pytest

from spec_fast.cli import build_parser, main
from spec_fast.drafts.model import EarlyExitDrafter, ModelDrafter
from spec_fast.engine import SpeculativeDecoder
from spec_fast.strategies import DEFAULT_STRATEGY, parse_strategy
from tests.engine.models import tiny_llama


@pytest.mark.parametrize(
    "argv,message",
    [
        (["generate", "hi", "--temperature", "-1"], "temperature"),
        (["generate", "hi", "--top-p", "0"], "--top-p"),
        (["generate", "hi", "--max-new-tokens", "0"], "max-new-tokens"),
        (["generate", "   "], "empty prompt"),
        (["generate", "hi", "--strategy", "tree:9"], "unknown strategy"),
        (["generate", "hi", "--strategy", "topk:3,2,6", "--verifier", "bv"], "not valid"),
    ],
)
def test_bad_cli_arguments_exit_with_a_clear_message(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_the_parser_defaults_follow_the_documented_conventions() -> None:
    args = build_parser().parse_args(["generate", "hello"])
    assert (args.temperature, args.top_k, args.top_p, args.dtype, args.device) == (0.0, 0, 1.0, "float32", "cpu")
    assert args.draft is None and args.strategy is None  # resolved by main(): retrieval for SmolLM2, else early exit
    from spec_fast.cli import DEFAULT_CUSTOM_DRAFT, DEFAULT_DRAFT
    from spec_fast.drafts.heads import DRAFTER_NAMES

    assert DEFAULT_DRAFT in DRAFTER_NAMES and DEFAULT_CUSTOM_DRAFT.startswith("early-exit:")
    assert parse_strategy(DEFAULT_STRATEGY).drafts


def test_metrics_count_every_row_step_and_every_emitted_token() -> None:
    target = tiny_llama()
    prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 9]]
    streamed: list[list[int]] = [[] for _ in prompts]

    def on_tokens(new: list[list[int]]) -> None:
        for b, tokens in enumerate(new):
            streamed[b].extend(tokens)

    decoder = SpeculativeDecoder(target, EarlyExitDrafter(target, 2), parse_strategy("iid:2x3"))
    result = decoder.generate(prompts, max_new_tokens=15, on_tokens=on_tokens)
    metrics = result.metrics
    assert streamed == result.tokens
    assert metrics.generated_tokens == 45
    hist = metrics.accepted_length_histogram
    # every (row, step) pair is counted once; emitted tokens >= generated (the last step may overshoot)
    assert sum(hist) >= metrics.target_passes
    assert sum((t + 1) * n for t, n in enumerate(hist)) >= 45
    assert 1.0 <= metrics.block_efficiency <= 4.0
    assert all(0.0 <= a <= 1.0 for a in metrics.per_depth_acceptance)
    assert metrics.draft_passes > 0 and metrics.tokens_per_s > 0 and metrics.peak_memory_bytes > 0
    assert 0 < metrics.ttft_s <= metrics.wall_s


def test_a_perfect_draft_reaches_the_maximal_block_efficiency_at_batch_size_two() -> None:
    target = tiny_llama()
    decoder = SpeculativeDecoder(target, ModelDrafter(target), parse_strategy("chain:3"))
    result = decoder.generate([[1, 2], [3, 4, 5]], max_new_tokens=16)
    # 16 tokens = 4 steps x (3 accepted + bonus) per row
    assert result.metrics.accepted_length_histogram == [0, 0, 0, 8]
    assert result.metrics.block_efficiency == 4.0 and result.metrics.target_passes == 4
    assert result.metrics.per_depth_acceptance == [1.0, 1.0, 1.0]
    # seed 003's measures: 3 tokens accepted per step, and its "Accept." counts the bonus: (3 + 1) / 3
    assert result.metrics.mean_accepted_length == 3.0 and result.metrics.acceptance_rate == 4 / 3


def test_seed_003_measures_count_accepted_tokens_bonus_and_drafted_depth_by_hand() -> None:
    from spec_fast.metrics import GenerationMetrics

    metrics = GenerationMetrics()
    # (accepted, depth): a drafted tree of depth 4 accepting 2, one of depth 2 accepting 0, a plain step
    metrics.record_step([2, 0], [4, 2])
    metrics.record_step([0], [0])
    assert metrics.mean_accepted_length == 2 / 3 and metrics.block_efficiency == 5 / 3
    # (2 + 0 accepted + 2 bonus tokens of the drafting steps) / (4 + 2 drafted depth); the plain step drafts nothing
    assert metrics.acceptance_rate == 4 / 6
    assert metrics.as_dict()["acceptance_rate"] == 4 / 6 and GenerationMetrics().acceptance_rate == 0.0


@pytest.mark.parametrize("strategy", ["ar", "chain:3", "topk:3,2,6"])
def test_the_prefill_serves_the_first_step_so_no_pass_is_spent_on_the_last_prompt_token(strategy: str) -> None:
    from tests.engine.models import hf_greedy

    target = tiny_llama()
    prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 9]]  # ragged: each row's root logits sit at its own position
    st = parse_strategy(strategy)
    decoder = SpeculativeDecoder(target, EarlyExitDrafter(target, 2) if st.drafts else None, st)
    result = decoder.generate(prompts, max_new_tokens=10)
    assert result.tokens == [hf_greedy(target, p, 10) for p in prompts]
    # HF generate's count: one prefill pass over the whole prompt, then one pass per step after the first
    # (plain decoding: 10 tokens = 1 prefill + 9 passes)
    assert result.state is not None
    assert result.state.target_cache.passes == 1 + result.metrics.target_passes - (0 if st.drafts else 1)
    if not st.drafts:
        assert result.metrics.target_passes == 10
