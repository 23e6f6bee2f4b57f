"""Row operations of the native library (``kernels.c``, ``layer.c``) outside the decoder layers: the model's
final norm, the argmax over rows of logits, the float16 rounding of cache entries, and sampling from the
tempered softmax of logits (a plain step's draw, the naive verification of sampled chains). Each checks its
arguments at the boundary (:func:`spec_fast.lean.native._check`) and needs the library loaded
(:func:`native.available`). Importing this module plugs :func:`first_max_index`, :func:`tempered_draw` and
:func:`naive_chain` into :mod:`spec_fast._sampling`'s hooks (used only where the library is loaded already).
"""

from __future__ import annotations

import torch

from spec_fast import _sampling
from spec_fast.lean import native

__all__ = ["first_max_index", "rms_norm", "round_half", "tempered_draw", "filtered_draw", "tempered_probs",
           "naive_chain"]


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
    rows, size = _rows("logits", logits, 2)
    native._check("temperature", temperature, torch.float32, 1, contiguous=True, shape=(rows,))
    native._check("uniforms", uniforms, torch.float32, 1, contiguous=True, shape=(rows,))
    out = torch.empty(rows, dtype=torch.int64)
    if rows > 0:
        scratch = torch.empty(size, dtype=torch.float32)
        lib.spec_fast_tempered_draw(logits.data_ptr(), rows, size, int(logits.stride(0)), temperature.data_ptr(),
                                    uniforms.data_ptr(), scratch.data_ptr(), out.data_ptr())
    return out


def filtered_draw(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                  uniforms: torch.Tensor) -> torch.Tensor:
    """``logits [R, V]`` float32 on the CPU (rows of unit stride), ``temperature [R]`` float32 (> 0), ``top_k
    [R]`` int64 (0 or >= V: off), ``top_p [R]`` float64 in (0, 1] (1: off) and ``uniforms [R]`` float32 in
    [0, 1) -> ``[R]`` int64: one draw per row from G, the tempered softmax cut by top-k and then top-p
    (``spec_fast_filtered_draw`` in ``kernels.c``: G's law up to float rounding, ordering only the tokens the
    cuts need; rows without either cut draw exactly as :func:`tempered_draw`)."""
    lib = native._library()
    assert lib is not None
    rows, size = _rows("logits", logits, 2)
    if size >= 2**32:  # the C code keeps a token's id in 32 bits of its sort key
        raise ValueError(f"logits must have fewer than 2**32 values a row, got {size}")
    native._check("temperature", temperature, torch.float32, 1, contiguous=True, shape=(rows,))
    native._check("top_k", top_k, torch.int64, 1, contiguous=True, shape=(rows,))
    native._check("top_p", top_p, torch.float64, 1, contiguous=True, shape=(rows,))
    native._check("uniforms", uniforms, torch.float32, 1, contiguous=True, shape=(rows,))
    wrong = (~((top_p > 0) & (top_p <= 1))).nonzero()
    if wrong.shape[0]:  # NaN fails both
        raise ValueError(f"top_p must lie in (0, 1], got top_p[{int(wrong[0])}]={float(top_p[int(wrong[0])])!r}")
    out = torch.empty(rows, dtype=torch.int64)
    if rows > 0:
        weights = torch.empty(size, dtype=torch.float32)
        keys = torch.empty(size, dtype=torch.int64)  # uint64 keys to the C code
        lib.spec_fast_filtered_draw(logits.data_ptr(), rows, size, int(logits.stride(0)), temperature.data_ptr(),
                                    top_k.data_ptr(), top_p.data_ptr(), uniforms.data_ptr(), weights.data_ptr(),
                                    keys.data_ptr(), out.data_ptr())
    return out


def _filtered_draw_where_loaded(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                                top_p: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor | None:
    """:func:`filtered_draw` where the library is loaded already and ``logits`` suit it, else None."""
    if native._STATE.get("lib") is None or logits.dim() != 2 or (logits.shape[1] > 1 and logits.stride(1) != 1):
        return None
    return filtered_draw(logits, temperature, top_k, top_p, uniforms)


def _rows(name: str, values: torch.Tensor, dims: int) -> tuple[int, ...]:
    """The shape of float32 ``values`` with ``dims`` dimensions whose last has unit stride (``V >= 1``)."""
    native._check(name, values, torch.float32, dims)
    if values.shape[-1] < 1 or (values.shape[-1] > 1 and values.stride(-1) != 1):
        raise ValueError(f"{name} must have V >= 1 values of unit stride in its last dimension, got "
                         f"{name}.shape={tuple(values.shape)}, {name}.stride()={values.stride()}")
    return tuple(int(n) for n in values.shape)


def tempered_probs(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """``logits [R, V]`` float32 on the CPU, ``temperature [R]`` float32 -> ``[R, V]``: the tempered softmax as
    :func:`naive_chain` computes p (the weights of :func:`tempered_draw` over their float64 total, rounded to
    float32; zeros for a row without positive weight)."""
    lib = native._library()
    assert lib is not None
    rows, size = _rows("logits", logits, 2)
    native._check("temperature", temperature, torch.float32, 1, contiguous=True, shape=(rows,))
    out = torch.empty(rows, size, dtype=torch.float32)
    if rows > 0:
        lib.spec_fast_tempered_probs(logits.data_ptr(), rows, size, int(logits.stride(0)), temperature.data_ptr(),
                                     out.data_ptr())
    return out


def naive_chain(logits: torch.Tensor, temperature: torch.Tensor, child: torch.Tensor, draft_probs: torch.Tensor,
                u0: torch.Tensor, u1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Naive verification of one chain per row against the tempered softmax of ``logits [R, N, V]`` (CPU
    float32, p as :func:`tempered_probs` gives it): ``temperature [R]``, ``child [R, N]`` int64 (the drafted
    token below each slot, -1 at a leaf), ``draft_probs [R, N, V]`` float32, ``u0``/``u1 [R, N]`` float32
    (``spec_fast_naive_chain`` in ``kernels.c``) -> each row's stop slot and next token, ``[R]`` int64 each:
    the accept tests of ``verify_tree("naive")`` on those p, its draws up to the rounding of running sums."""
    lib = native._library()
    assert lib is not None
    rows, slots, size = _rows("logits", logits, 3)
    _rows("draft_probs", draft_probs, 3)
    if tuple(draft_probs.shape) != (rows, slots, size):
        raise ValueError(f"draft_probs must have shape [{rows}, {slots}, {size}], got "
                         f"draft_probs.shape={tuple(draft_probs.shape)}")
    native._check("temperature", temperature, torch.float32, 1, contiguous=True, shape=(rows,))
    native._check("child", child, torch.int64, 2, contiguous=True, shape=(rows, slots))
    for name, uniforms in (("u0", u0), ("u1", u1)):
        native._check(name, uniforms, torch.float32, 2, contiguous=True, shape=(rows, slots))
    stop = torch.zeros(rows, dtype=torch.int64)
    token = torch.zeros(rows, dtype=torch.int64)
    if rows > 0 and slots > 0:
        scratch = torch.empty(2 * size, dtype=torch.float32)
        lib.spec_fast_naive_chain(logits.data_ptr(), rows, slots, size, int(logits.stride(0)), int(logits.stride(1)),
                                  temperature.data_ptr(), child.data_ptr(), draft_probs.data_ptr(),
                                  int(draft_probs.stride(0)), int(draft_probs.stride(1)), u0.data_ptr(),
                                  u1.data_ptr(), scratch.data_ptr(), stop.data_ptr(), token.data_ptr())
    return stop, token


def _naive_chain_where_loaded(logits: torch.Tensor, temperature: torch.Tensor, child: torch.Tensor,
                              draft_probs: torch.Tensor, u0: torch.Tensor, u1: torch.Tensor
                              ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """:func:`naive_chain` where the library is loaded already and the tensors suit it, else None."""
    if (native._STATE.get("lib") is None or logits.dim() != 3 or draft_probs.dim() != 3
            or any(t.shape[-1] > 1 and t.stride(-1) != 1 for t in (logits, draft_probs))):
        return None
    return naive_chain(logits, temperature, child, draft_probs, u0, u1)


_sampling.native_tempered_draw = _tempered_draw_where_loaded
_sampling.native_filtered_draw = _filtered_draw_where_loaded
_sampling.native_naive_chain = _naive_chain_where_loaded
