"""The native first-maximum sweep (``spec_fast_first_max`` in spec_fast/lean/kernels.c) behind
:func:`spec_fast._sampling.first_max_index` on the CPU.

* on any float32 rows (ties, NaN anywhere, infinities, zeros of both signs, strided rows, widths around the
  16-lane vectors) it returns exactly ``torch.max(dim).indices``, in the native and the portable build;
* ``first_max_index`` takes it for argmaxes over several rows of logits where the library is loaded, and
  reduces in torch otherwise (no build is triggered by an argmax), with the same indices either way; its
  boundary refuses what it cannot read.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spec_fast import _sampling
from spec_fast.lean import native, row_ops
from tests.engine.test_native_boundary import portable  # noqa: F401  (the fixture)

pytestmark = pytest.mark.usefixtures("native_kernels")

SPECIAL = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1.0, -1.0, 3.5]


@st.composite
def rows(draw: Any) -> torch.Tensor:
    """``[R, V]`` float32 with many ties and special values; sometimes a strided view of a wider buffer."""
    count = draw(st.integers(1, 3))
    width = draw(st.sampled_from([1, 2, 15, 16, 17, 31, 32, 33, 47, 64, 100]))
    values = draw(st.lists(st.sampled_from(SPECIAL), min_size=count * (width + 3), max_size=count * (width + 3)))
    wide = torch.tensor(values, dtype=torch.float32).view(count, width + 3)
    start = draw(st.integers(0, 3))
    return wide[:, start:start + width] if draw(st.booleans()) and start + width <= width + 3 else wide[:, :width]


@settings(max_examples=400, deadline=None)
@given(rows())
def test_the_sweep_returns_torchs_first_maximum_on_any_rows(values: torch.Tensor) -> None:
    expected = values.max(dim=1).indices
    assert torch.equal(row_ops.first_max_index(values), expected)
    assert torch.equal(_sampling.first_max_index(values), expected)
    assert torch.equal(_sampling.first_max_index(values, keepdim=True), expected.unsqueeze(1))


def test_the_sweep_finds_the_first_maximum_and_the_first_nan_at_every_position() -> None:
    width = 49152
    for at in (0, 1, 15, 16, 17, 4096, width - 17, width - 16, width - 1):
        values = torch.zeros(2, width)
        values[0, at] = 1.0
        values[1, at] = float("nan")
        values[1, width - 1] = float("nan")
        values[1, min(at + 1, width - 1)] = 5.0
        assert row_ops.first_max_index(values).tolist() == [at, at]
        ties = torch.zeros(1, width)
        ties[0, at:] = 2.0  # every slot from `at` on is a maximum: the first wins
        assert row_ops.first_max_index(ties).tolist() == [at]
    chain = torch.randn(3, 5, width, generator=torch.Generator().manual_seed(1))  # a batch of depth-4 chains
    assert torch.equal(_sampling.first_max_index(chain), chain.max(dim=-1).indices)


def test_the_portable_build_sweeps_alike(portable: Any) -> None:  # noqa: F811
    values = torch.randn(4, 1000, generator=torch.Generator().manual_seed(2))
    values[1, 500] = float("nan")
    values[2, :] = float("-inf")
    values[3, 7] = values[3, 900] = float("inf")
    with native.using(portable):
        assert torch.equal(row_ops.first_max_index(values), values.max(dim=1).indices)


def test_first_max_index_uses_the_sweep_only_where_the_library_is_loaded(monkeypatch: Any) -> None:
    calls = []
    sweep = row_ops.first_max_index
    monkeypatch.setattr(row_ops, "first_max_index", lambda values: calls.append(values.shape) or sweep(values))
    logits = torch.randn(2, 3, 40, generator=torch.Generator().manual_seed(3))
    expected = logits.max(dim=-1).indices
    assert torch.equal(_sampling.first_max_index(logits), expected) and calls == []  # too few values
    monkeypatch.setattr(_sampling, "NATIVE_FIRST_MAX_FROM", 240)
    assert torch.equal(_sampling.first_max_index(logits), expected) and calls == [(6, 40)]
    with native.disabled():  # no library: torch's reduction, the same indices
        assert torch.equal(_sampling.first_max_index(logits), expected) and len(calls) == 1
    for other in (logits.double(), logits.transpose(1, 2)):  # another dtype, another dimension's argmax
        dim = 1 if other.shape[1] == 40 else -1
        assert torch.equal(_sampling.first_max_index(other, dim=dim), other.max(dim=dim).indices)
    assert len(calls) == 1


def test_the_sweep_refuses_what_it_cannot_read() -> None:
    with pytest.raises(ValueError, match="^values must be torch.float32"):
        row_ops.first_max_index(torch.zeros(2, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="^values must have 2 dimensions"):
        row_ops.first_max_index(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match=r"^values must be \[R, V\] with V >= 1"):
        row_ops.first_max_index(torch.zeros(3, 0))
    with pytest.raises(ValueError, match=r"^values must be \[R, V\] with V >= 1 and rows of unit stride"):
        row_ops.first_max_index(torch.zeros(4, 3).t())
