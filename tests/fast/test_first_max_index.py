"""``first_max_index`` is ``torch.argmax``: the first maximum, a NaN counting as the maximum, on every dtype and
shape the engine passes it (it reads ``torch.max(dim)`` on the CPU, where that is faster)."""

from __future__ import annotations

import pytest
import torch

from spec_fast._sampling import first_max_index


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_first_max_index_is_argmax_with_ties_nan_and_infinities(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(3)
    for trial in range(300):
        vocab = int(torch.randint(1, 200, (), generator=generator))
        values = torch.randint(-3, 3, (3, 2, vocab), generator=generator).to(dtype)  # many ties
        for mark, value in ((0.05, float("nan")), (0.05, float("inf")), (0.05, -float("inf"))):
            if trial % 2:
                values[torch.rand(values.shape, generator=generator) < mark] = value
        for dim in (-1, 1, 0):
            for keepdim in (False, True):
                assert torch.equal(first_max_index(values, dim, keepdim), values.argmax(dim=dim, keepdim=keepdim))


def test_first_max_index_of_a_vocabulary_row_block_and_a_control() -> None:
    logits = torch.randn(4, 1, 49152, generator=torch.Generator().manual_seed(4))
    logits[0, 0, 100] = logits[0, 0, 200] = 50.0  # a tie: the lower id
    assert torch.equal(first_max_index(logits), logits.argmax(dim=-1))
    assert int(first_max_index(logits)[0, 0]) == 100
    # control: the last maximum would differ on the tie, and this comparison sees it
    last = logits.shape[-1] - 1 - logits.flip(-1).argmax(dim=-1)
    assert not torch.equal(last, logits.argmax(dim=-1))
