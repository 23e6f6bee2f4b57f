"""Bad input gives a clear ValueError naming the problem, before any model call."""

from __future__ import annotations

import pytest

from spec_fast.drafts.model import EarlyExitDrafter, ModelDrafter, early_exit_model
from spec_fast.engine import SamplingParams, SpeculativeDecoder
from spec_fast.models import chat_prompt_ids, parse_dtype
from spec_fast.strategies import Strategy, parse_strategy
from tests.engine.models import tiny_llama

TARGET = tiny_llama()


def test_target_and_draft_with_different_vocabularies_are_refused() -> None:
    with pytest.raises(ValueError, match="vocabularies differ"):
        SpeculativeDecoder(TARGET, ModelDrafter(tiny_llama(vocab_size=65)), parse_strategy("chain:2"))


@pytest.mark.parametrize(
    "prompts,max_new,match",
    [
        ([[]], 4, "prompt 0 is empty"),
        ([], 4, "at least one prompt"),
        ([[1, 2]], 0, "max_new_tokens"),
        ([[1, 2]], -3, "max_new_tokens"),
        ([[1, 2]], 2.5, "max_new_tokens"),
        ([[1, 99]], 4, "outside"),
        ([[1] * 120], 20, "exceeds the model context of 128"),
        ([[1] * 200], 1, "exceeds the model context"),
    ],
)
def test_bad_prompts_and_lengths_raise_clear_errors(prompts: list[list[int]], max_new: int, match: str) -> None:
    decoder = SpeculativeDecoder(TARGET, EarlyExitDrafter(TARGET, 2), parse_strategy("chain:2"))
    with pytest.raises(ValueError, match=match):
        decoder.generate(prompts, max_new_tokens=max_new)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"seed": 1.5}, "seed"),
    ],
)
def test_invalid_sampling_settings_raise_clear_errors(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "spec,verifier,match",
    [
        ("tree:3", None, "unknown strategy"),
        ("chain:x", None, "integers"),
        ("chain:0", None, "depth"),
        ("topk:3,2,8", "specinfer", "not valid for shape 'topk'"),
        ("iid:2x3", "bv", "not valid"),
        ("delayed:2,1,0", None, "L2"),
    ],
)
def test_bad_strategy_strings_and_verifier_pairs_are_refused(spec: str, verifier: str | None, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_strategy(spec, verifier)


def test_a_greedy_verifier_with_a_positive_temperature_is_refused() -> None:
    decoder = SpeculativeDecoder(TARGET, EarlyExitDrafter(TARGET, 2), Strategy("chain", depth=2, verifier="greedy"))
    with pytest.raises(ValueError, match="greedy"):
        decoder.generate([[1, 2]], max_new_tokens=3, sampling=SamplingParams(temperature=0.5))


def test_a_drafting_strategy_without_a_drafter_is_refused() -> None:
    with pytest.raises(ValueError, match="needs a drafter"):
        SpeculativeDecoder(TARGET, None, parse_strategy("chain:2"))


def test_early_exit_depth_outside_the_model_is_refused() -> None:
    for layers in (0, 4, 10):
        with pytest.raises(ValueError, match="num_layers"):
            early_exit_model(TARGET, layers)


def test_an_unknown_dtype_and_an_empty_chat_prompt_are_refused() -> None:
    with pytest.raises(ValueError, match="dtype"):
        parse_dtype("float8")
    with pytest.raises(ValueError, match="empty prompt"):
        chat_prompt_ids(object(), "   ")
