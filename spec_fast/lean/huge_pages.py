"""Copies of tensors in one buffer backed by 2 MiB pages, for weights that every decoding pass streams."""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Sequence

import torch

__all__ = ["HUGE_PAGE", "huge_page_copies"]

#: the huge page size of x86-64 and arm64 Linux kernels (2 MiB)
HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14


def huge_page_copies(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of the contiguous CPU ``tensors`` laid out one after another in one buffer that Linux is asked
    to back with 2 MiB pages (``madvise(MADV_HUGEPAGE)``, before the copies touch it), each copy 64-byte
    aligned; elsewhere, or where the request fails, the same copies on ordinary pages.

    A decoding pass streams every packed weight once: on 4 KiB pages that is a TLB miss every 4 KiB of a
    100 MB model. The products of 30 SmolLM2 layers (1 and 4 rows, 1 thread) ran faster from huge pages in
    a measurement that was not committed; the committed effect is inside the before/after pass costs of
    ``bench/results/target_cost_gguf/run2/``."""
    sizes = [int(t.numel()) * t.element_size() for t in tensors]
    offsets, total = [], 0
    for size in sizes:
        offsets.append(total)
        total += -(-size // 64) * 64
    if total == 0:
        return [t.clone() for t in tensors]
    buffer = torch.empty(total + HUGE_PAGE, dtype=torch.uint8)
    start = -buffer.data_ptr() % HUGE_PAGE
    madvise = getattr(ctypes.CDLL(None), "madvise", None) if sys.platform.startswith("linux") else None
    if madvise is not None:
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        madvise(ctypes.c_void_p(buffer.data_ptr() + start), ctypes.c_size_t(total), _MADV_HUGEPAGE)
    copies = []
    for tensor, offset, size in zip(tensors, offsets, sizes):
        view = buffer[start + offset:start + offset + size].view(tensor.dtype).view(tensor.shape)
        view.copy_(tensor)
        copies.append(view)
    return copies
