"""The RNG protocol, its sources, the exact enumerator, and bad/degenerate solver input."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from spec_ref import SOLVERS, GeneratorSource, NodeReplaySource, ReplaySource, exact_law, inverse_cdf, residual
from spec_ref.rng import as_source

F = Fraction
TARGET = [0.5, 0.25, 0.25, 0.0]
DRAFT = [0.125, 0.125, 0.5, 0.25]


# ----- sources -----------------------------------------------------------------------------------------
def test_replay_source_consumes_one_uniform_per_protocol_call_in_order() -> None:
    source = ReplaySource([0.1, 0.6, 0.99, 0.5])
    assert source.uniform() == 0.1
    assert source.bernoulli(0.5) is False  # 0.6 < 0.5 is false
    assert source.categorical(np.array([1.0, 1.0, 2.0])) == 2  # 0.99 * 4 = 3.96 -> last bucket
    assert source.integers(4) == 2  # floor(0.5 * 4)
    assert source.consumed == 4
    with pytest.raises(ValueError, match="ran out of uniforms"):
        source.uniform()


def test_replay_source_rejects_uniforms_outside_the_half_open_unit_interval() -> None:
    with pytest.raises(ValueError, match="uniforms must lie in"):
        ReplaySource([0.2, 1.0])


def test_node_replay_source_gives_each_node_its_own_row() -> None:
    source = NodeReplaySource(np.array([[0.1, 0.2], [0.7, 0.8]]))
    assert source.substream(1).uniform() == 0.7
    assert source.substream(0).uniform() == 0.1
    with pytest.raises(ValueError, match="substream"):
        source.uniform()


def test_inverse_cdf_never_returns_a_zero_weight_index_even_when_rounding_overshoots() -> None:
    weights = np.array([0.1, 0.2, 0.0])
    assert inverse_cdf(weights, np.nextafter(1.0, 0.0)) == 1
    assert inverse_cdf(np.array([0.0, 1.0, 0.0]), 0.0) == 1


def test_generator_source_is_reproducible_and_seeds_give_different_streams() -> None:
    a = [GeneratorSource(np.random.default_rng(7)).uniform() for _ in range(1)]
    b = [GeneratorSource(np.random.default_rng(7)).uniform() for _ in range(1)]
    c = [GeneratorSource(np.random.default_rng(8)).uniform() for _ in range(1)]
    assert a == b and a != c
    assert isinstance(as_source(3), GeneratorSource)
    with pytest.raises(ValueError, match="rng must be"):
        as_source("not a generator")


def test_exact_law_of_a_coin_and_a_die_uses_exact_fractions() -> None:
    def run(rng: Any) -> tuple[bool, int]:
        return rng.bernoulli(F(1, 3)), rng.integers(3)

    law = exact_law(run)
    assert law == {(a, b): (F(1, 3) if a else F(2, 3)) / 3 for a in (True, False) for b in range(3)}


def test_symbolic_uniform_integrates_repeated_comparisons_of_one_uniform_exactly() -> None:
    def run(rng: Any) -> int:
        u = rng.uniform()
        if u * 4 < 1:  # u < 1/4
            return 0
        if u < F(1, 2):  # then u in [1/4, 1/2)
            return 1
        return 2

    assert exact_law(run) == {0: F(1, 4), 1: F(1, 4), 2: F(1, 2)}


def test_exact_law_refuses_to_enumerate_more_than_max_paths() -> None:
    with pytest.raises(RuntimeError, match="max_paths"):
        exact_law(lambda rng: tuple(rng.integers(10) for _ in range(4)), max_paths=100)


def test_residual_falls_back_to_the_current_target_when_the_positive_mass_is_zero() -> None:
    target = np.array([0.3, 0.7])
    assert residual(target, target).tolist() == target.tolist()


# ----- bad input ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SOLVERS))
@pytest.mark.parametrize(
    ("target", "draft", "tokens", "message"),
    [
        ([0.5, float("nan")], [0.5, 0.5], [0], r"target_probs must be finite, got target_probs\[1\]=nan"),
        ([0.5, 0.5], [0.5, float("inf")], [0], r"draft_probs must be finite"),
        ([1.5, -0.5], [0.5, 0.5], [0], r"target_probs must be non-negative, got target_probs\[1\]=-0.5"),
        ([0.5, 0.4], [0.5, 0.5], [0], r"sum\(target_probs\)=0.9"),
        ([0.5, 0.5], [0.2, 0.3, 0.5], [0], r"draft_probs.shape=\(3,\) must be \(2,\)"),
        ([[0.5, 0.5]], [0.5, 0.5], [0], r"target_probs must be a vector \[V\]"),
        ([0.5, 0.5], [1.0, 0.0], [1], r"draft_tokens\[0\]=1 has draft_probs\[1\]=0.0"),
        ([0.5, 0.5], [0.5, 0.5], [2], r"draft_tokens\[0\]=2 must lie in \[0, V\)"),
        ([0.5, 0.5], [0.5, 0.5], [0.5], r"draft_tokens\[0\] must be an integer"),
    ],
)
def test_bad_solver_input_raises_value_error_naming_argument_and_value(
    name: str, target: list[float], draft: list[float], tokens: list[Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        SOLVERS[name].sample(target, draft, tokens, np.random.default_rng(0))


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_bad_draft_count_raises(name: str) -> None:
    with pytest.raises(ValueError, match="k must be a non-negative integer, got k=-1"):
        SOLVERS[name].acceptance(TARGET, DRAFT, -1)


def test_unnormalised_input_within_tolerance_is_renormalised() -> None:
    plan = SOLVERS["naive"].plan([0.5 * (1 + 1e-7), 0.5], [0.5, 0.5], 1)
    assert abs(plan.target_probs.sum() - 1.0) < 1e-15


# ----- degenerate but legal input ----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["naive", "spectr", "specinfer", "khisti"])
def test_equal_target_and_draft_accept_every_draft_for_any_uniform(name: str) -> None:
    for u in (0.0, 0.5, np.nextafter(1.0, 0.0)):
        tokens = [2, 0, 2]
        out = SOLVERS[name].sample(TARGET[:3] + [0.0], TARGET[:3] + [0.0], tokens, ReplaySource([u] * 8))
        assert out in tokens


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_disjoint_supports_never_accept_and_sample_from_the_target(name: str) -> None:
    branching = SOLVERS[name].branching([0.0, 0.0, 0.5, 0.5], [0.5, 0.5, 0.0, 0.0], [0, 1])
    assert branching.tolist() == [0.0, 0.0, 0.5, 0.5]


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_one_hot_target_always_outputs_its_token(name: str) -> None:
    for seed in range(5):
        assert SOLVERS[name].sample([0, 0, 1.0], [0.4, 0.4, 0.2], [0, 1, 2], np.random.default_rng(seed)) == 2


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_vocabulary_of_one_token_and_zero_drafts_work(name: str) -> None:
    assert SOLVERS[name].sample([1.0], [1.0], [0, 0], ReplaySource([0.3] * 8)) == 0
    assert SOLVERS[name].sample([0.2, 0.8], [0.5, 0.5], [], ReplaySource([0.1])) == 0
    assert SOLVERS[name].branching([0.2, 0.8], [0.5, 0.5], []).tolist() == [0.2, 0.8]


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_uniform_of_exactly_zero_never_accepts_a_token_of_zero_target_mass(name: str) -> None:
    out = SOLVERS[name].sample([0.0, 1.0], [0.5, 0.5], [0], ReplaySource([0.0] * 4))
    assert out == 1


def test_residual_that_rounds_to_zero_mass_falls_back_to_the_target() -> None:
    # q(0) = 0.1 + 0.2 rounds above p(0) = 0.3, so (p - q)_+ is exactly 0 in float64; a uniform just below
    # 1 rejects x = 0 and the residual must fall back to p, not to uniform or to token 0.
    target = np.array([0.3, 0.7])
    draft = np.array([0.1 + 0.2, 0.7])
    assert np.maximum(target / target.sum() - draft / draft.sum(), 0).sum() == 0.0
    source = ReplaySource([np.nextafter(1.0, 0.0), 0.9])
    assert SOLVERS["naive"].sample(target, draft, [0], source) == 1
