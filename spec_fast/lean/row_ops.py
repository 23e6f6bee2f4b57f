"""Row operations of the native library (``kernels.c``, ``layer.c``) outside the decoder layers: the model's
final norm, the argmax over rows of logits, the float16 rounding of cache entries. Each checks its arguments
at the boundary (:func:`spec_fast.lean.native._check`) and needs the library loaded (:func:`native.available`).
Importing this module plugs :func:`first_max_index` into :func:`spec_fast._sampling.first_max_index`.
"""

from __future__ import annotations

import torch

from spec_fast import _sampling
from spec_fast.lean import native

__all__ = ["first_max_index", "rms_norm", "round_half", "tempered_draw"]


def first_max_index(values: torch.Tensor) -> torch.Tensor:
    """``values [R, V]`` float32 on the CPU (rows of unit stride, ``V >= 1``) -> ``[R]`` int64: each row's
    index of its first maximum, a NaN counting as the maximum, exactly ``values.max(dim=1).indices``."""
    lib = native._library()
    assert lib is not None
    native._check("values", values, torch.float32, 2)
    rows, size = int(values.shape[0]), int(values.shape[1])
    if size < 1 or (size > 1 and values.stride(1) != 1):
        raise ValueError(f"values must be [R, V] with V >= 1 and rows of unit stride, got "
                         f"values.shape={tuple(values.shape)}, values.stride()={values.stride()}")
    out = torch.empty(rows, dtype=torch.int64)
    if rows > 0:
        lib.spec_fast_first_max(values.data_ptr(), rows, size, int(values.stride(0)), out.data_ptr())
    return out


def _first_max_where_loaded(values: torch.Tensor) -> torch.Tensor | None:
    """:func:`first_max_index` where the library is loaded already and ``values`` suits it, else None (the
    caller then reduces in torch; an argmax never builds the library)."""
    if native._STATE.get("lib") is None or values.dim() != 2 or (values.shape[1] > 1 and values.stride(1) != 1):
        return None
    return first_max_index(values)


_sampling.native_first_max = _first_max_where_loaded


def _tempered_draw_where_loaded(logits: torch.Tensor, temperature: torch.Tensor, uniforms: torch.Tensor
                                ) -> torch.Tensor | None:
    """:func:`tempered_draw` where the library is loaded already and ``logits`` suit it, else None."""
    if native._STATE.get("lib") is None or logits.dim() != 2 or (logits.shape[1] > 1 and logits.stride(1) != 1):
        return None
    return tempered_draw(logits, temperature, uniforms)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x [..., H]`` float32 on the CPU -> ``x / sqrt(mean(x^2) + eps) * weight`` as the native layers
    compute their norms (the mean accumulated in float64): a model's final norm, the same bits whether
    :func:`spec_fast.lean.native.run_layers` computed it or this did."""
    lib = native._library()
    assert lib is not None
    native._check("x", x, torch.float32, x.dim() if isinstance(x, torch.Tensor) else 0)
    size = int(x.shape[-1]) if x.dim() > 0 else 0
    native._check("weight", weight, torch.float32, 1, contiguous=True, shape=(size,))
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise ValueError(f"eps must be a float, got eps={eps!r}")
    source = x.contiguous()
    out = torch.empty(source.shape, dtype=torch.float32)
    lib.spec_fast_rms_norm(source.data_ptr(), source.numel() // max(size, 1), size, weight.data_ptr(), float(eps),
                           out.data_ptr())
    return out


def round_half(x: torch.Tensor) -> torch.Tensor:
    """``x`` (float32, CPU) rounded to float16 as the native layer stores cache entries (nearest-even)."""
    lib = native._library()
    assert lib is not None
    native._check("x", x, torch.float32, x.dim() if isinstance(x, torch.Tensor) else 0)
    source = x.contiguous()
    out = torch.empty(source.shape, dtype=torch.float16)
    lib.spec_fast_round_half(source.data_ptr(), source.numel(), out.data_ptr())
    return out


def tempered_draw(logits: torch.Tensor, temperature: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """``logits [R, V]`` float32 on the CPU (rows of unit stride), ``temperature [R]`` float32 (> 0) and
    ``uniforms [R]`` float32 in [0, 1) -> ``[R]`` int64: one draw per row from ``softmax((logits - max) / T)``
    (``spec_fast_tempered_draw`` in ``kernels.c``: the smallest index whose running weight exceeds ``u`` times
    the row's total, never one of zero weight; a row without positive weight gives its first maximum)."""
    lib = native._library()
    assert lib is not None
    native._check("logits", logits, torch.float32, 2)
    rows, size = int(logits.shape[0]), int(logits.shape[1])
    if size < 1 or (size > 1 and logits.stride(1) != 1):
        raise ValueError(f"logits must be [R, V] with V >= 1 and rows of unit stride, got "
                         f"logits.shape={tuple(logits.shape)}, logits.stride()={logits.stride()}")
    native._check("temperature", temperature, torch.float32, 1, contiguous=True, shape=(rows,))
    native._check("uniforms", uniforms, torch.float32, 1, contiguous=True, shape=(rows,))
    out = torch.empty(rows, dtype=torch.int64)
    if rows > 0:
        scratch = torch.empty(size, dtype=torch.float32)
        lib.spec_fast_tempered_draw(logits.data_ptr(), rows, size, int(logits.stride(0)), temperature.data_ptr(),
                                    uniforms.data_ptr(), scratch.data_ptr(), out.data_ptr())
    return out


_sampling.native_tempered_draw = _tempered_draw_where_loaded
