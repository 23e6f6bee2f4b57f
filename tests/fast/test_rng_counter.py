"""spec_fast.rng: the counter-based uniforms are a pure, device-independent function of (seed, counter)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spec_fast.rng import UNIFORM_BITS, counter_uniforms
from tests.stats import ALPHA, POWER, chi2_gof, noncentrality, required_noncentrality

MASK = (1 << 64) - 1


def splitmix64_reference(x: int) -> int:
    """SplitMix64 on Python ints, mod 2**64 (Steele, Lea & Flood 2014)."""
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def uniform_reference(seed: int, counter: int) -> float:
    bits = splitmix64_reference((splitmix64_reference(seed & MASK) + counter) & MASK)
    return (bits >> (64 - UNIFORM_BITS)) / 2.0**UNIFORM_BITS


@settings(max_examples=40)
@given(seed=st.integers(-(2**63), 2**63 - 1), offset=st.integers(0, 2**40), size=st.integers(1, 6))
def test_uniforms_equal_an_independent_python_splitmix64_bit_for_bit(seed: int, offset: int, size: int) -> None:
    got = counter_uniforms(seed, offset, (size,)).tolist()
    assert got == [uniform_reference(seed, offset + i) for i in range(size)]


def test_uniforms_lie_on_the_float32_grid_in_the_half_open_unit_interval() -> None:
    u = counter_uniforms(123, 0, (4, 1000))
    assert u.dtype == torch.float32
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    scaled = u.to(torch.float64) * 2**UNIFORM_BITS
    assert torch.equal(scaled, scaled.floor())


@settings(max_examples=25)
@given(seed=st.integers(0, 2**62), offset=st.integers(0, 1000), skip=st.integers(0, 50))
def test_a_value_depends_only_on_its_counter_so_unused_draws_never_shift_later_ones(seed: int, offset: int, skip: int) -> None:
    long = counter_uniforms(seed, offset, (skip + 8,))
    assert torch.equal(counter_uniforms(seed, offset + skip, (8,)), long[skip:])


def test_per_row_seeds_and_offsets_equal_the_scalar_calls_row_by_row() -> None:
    seeds = torch.tensor([5, -7, 2**40, 5])
    offsets = torch.tensor([0, 3, 11, 100])
    table = counter_uniforms(seeds, offsets, (4, 3, 2))
    for b in range(4):
        assert torch.equal(table[b], counter_uniforms(int(seeds[b]), int(offsets[b]), (3, 2)))


def test_different_seeds_give_different_streams() -> None:
    assert not torch.equal(counter_uniforms(1, 0, (64,)), counter_uniforms(2, 0, (64,)))


@pytest.mark.parametrize(
    ("seed", "offset", "shape", "message"),
    [(1.5, 0, (2,), "seed"), (1, "x", (2,), "offset"), (torch.tensor([1, 2]), 0, (3,), "rows"), (1, 0, (-1,), "shape")],
)
def test_bad_arguments_raise_value_error_naming_them(seed: object, offset: object, shape: tuple[int, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        counter_uniforms(seed, offset, shape)  # type: ignore[arg-type]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_and_cpu_produce_bit_identical_uniforms() -> None:
    cpu = counter_uniforms(torch.tensor([3, 9]), torch.tensor([0, 77]), (2, 5000))
    gpu = counter_uniforms(torch.tensor([3, 9]), torch.tensor([0, 77]), (2, 5000), device="cuda")
    assert torch.equal(cpu, gpu.cpu())


CELLS = 64


def _histogram(u: torch.Tensor) -> np.ndarray:
    return np.bincount((u.to(torch.float64) * CELLS).long().numpy().ravel(), minlength=CELLS)


@pytest.mark.statistical
def test_counter_uniforms_are_uniform_chi2_alpha_1e6_power_099() -> None:
    """64 equal cells, N = 2**20 draws, alpha = 1e-6; negative control: u**1.02 (a mild distortion) is rejected,
    and N * chi2(mutant || uniform) exceeds the noncentrality needed for power 0.99."""
    n = 2**20
    u = counter_uniforms(20260, 0, (n,))
    expected = np.full(CELLS, 1.0 / CELLS)
    assert not chi2_gof(_histogram(u), expected, ALPHA).rejected
    mutant = u.to(torch.float64) ** 1.02
    edges = np.arange(CELLS + 1) / CELLS
    mutant_law = np.diff(edges ** (1 / 1.02))
    lam, df = noncentrality(n, mutant_law, expected)
    assert lam >= required_noncentrality(df, ALPHA, POWER)
    assert chi2_gof(_histogram(mutant), expected, ALPHA).rejected
