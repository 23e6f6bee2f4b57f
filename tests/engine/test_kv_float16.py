"""The lean forward's KV cache in float16 (``LeanLlama.set_kv_cache_dtype``, ``--kv-cache-dtype float16``).

* an entry is rounded to float16 as torch rounds (nearest-even, overflow to infinity, subnormals kept), in the
  native and the portable build alike;
* the native layer and the Python layer store the same float16 cache and compute the same logits within float32
  rounding, through prefill, tree blocks, gather commits and ragged rows;
* a token's logits stay bit for bit independent of what shares its pass (what makes greedy speculative output
  equal plain decoding), for every attention path of layer.c;
* the setting is checked, and a float16 cache is refused where the forward is not the lean one.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
import torch

from spec_fast.lean import LeanLlama, native, row_ops
from spec_fast.settings import SettingError, resolve_settings
from tests.engine.models import tiny_llama
from tests.engine.test_lean import _drive
from tests.engine.test_lean_layer import HEAD_SHAPES, _token_logits_depend_on_the_pass
from tests.engine.test_native_boundary import portable  # noqa: F401  (the portable build, a fixture)
from tests.native_kernels import require_native


def _float(bits: int) -> float:
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])


def _awkward_floats() -> torch.Tensor:
    """Values at every edge of float16 rounding: ties between neighbours (normal and subnormal), the overflow
    threshold and its neighbours, the smallest normal and subnormal, zeros, infinities, NaN, and wide random
    magnitudes."""
    halves = torch.arange(0, 0x7C00, 7, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    upper = torch.arange(1, 0x7C01, 7, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    ties = (halves + upper) / 2  # exactly halfway (float32 holds every such midpoint)
    edges = torch.tensor([_float(0x477FF000), _float(0x477FEFFF), 65504.0, 65536.0, 1e6, 2.0 ** -14, 2.0 ** -24,
                          2.0 ** -25, _float(0x33000001), 2.0 ** -26, 0.0, 5.960464477539063e-08, 1e-30,
                          float("inf")])
    gen = torch.Generator().manual_seed(0)
    spread = torch.randn(20000, generator=gen) * torch.exp(torch.randn(20000, generator=gen) * 8)
    values = torch.cat([halves, ties, edges, spread])
    return torch.cat([values, -values])


@pytest.mark.parametrize("build", ["native", "portable"])
def test_cache_entries_round_to_float16_as_torch_does(build: str, request: Any) -> None:
    require_native()
    x = _awkward_floats()
    if build == "portable":
        with native.using(request.getfixturevalue("portable")):
            got = row_ops.round_half(x)
    else:
        got = row_ops.round_half(x)
    assert torch.equal(got.view(torch.int16), x.half().view(torch.int16))
    nan = row_ops.round_half(torch.tensor([float("nan"), -float("nan")]))
    assert bool(nan.isnan().all())


def test_a_float16_cache_matches_the_python_layer_and_stores_float16() -> None:
    require_native()
    hf = tiny_llama(hidden=384, heads=6, kv_heads=2)
    fused, python = LeanLlama.from_hf(hf), LeanLlama.from_hf(hf)
    python.use_native_layers(False)
    for model in (fused, python):
        model.set_kv_cache_dtype(torch.float16)
        assert model.kv_cache_dtype == torch.float16
    got, expected = _drive(fused), _drive(python)
    width = 384 / 32
    for g, e in zip(got, expected, strict=True):
        if g.dtype == torch.float16:  # the committed cache entries: the same float16 values within one rounding
            assert e.dtype == torch.float16
            torch.testing.assert_close(g.float(), e.float(), rtol=2e-3, atol=2e-3)
        else:
            torch.testing.assert_close(g, e.float(), rtol=1e-4 * width, atol=1e-4 * width)
    assert any(t.dtype == torch.float16 for t in got)
    # and close to a float32 cache (a float16 rounding of each entry, not garbage)
    float32 = _drive(LeanLlama.from_hf(hf))
    for g, f in zip(got, float32, strict=True):
        torch.testing.assert_close(g.float(), f.float(), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("shape", list(HEAD_SHAPES))
def test_with_a_float16_cache_a_token_gets_the_same_logits_whatever_shares_its_pass(shape: str) -> None:
    require_native()
    hidden, heads, kv_heads = HEAD_SHAPES[shape]
    model = LeanLlama.from_hf(tiny_llama(seed=7, hidden=hidden, heads=heads, kv_heads=kv_heads))
    model.set_kv_cache_dtype(torch.float16)
    assert not _token_logits_depend_on_the_pass(model)


def test_the_portable_build_reads_and_writes_the_float16_cache_as_the_native_build(portable: Any) -> None:  # noqa: F811
    hf = tiny_llama(hidden=384, heads=6, kv_heads=2)
    with native.using(portable):
        model = LeanLlama.from_hf(hf)
        model.set_kv_cache_dtype(torch.float16)
        got = _drive(model)
        assert not _token_logits_depend_on_the_pass(model)
    model = LeanLlama.from_hf(hf)
    model.set_kv_cache_dtype(torch.float16)
    expected = _drive(model)
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == e.dtype
        tolerance = 2e-3 if g.dtype == torch.float16 else 1e-4 * 384 / 32
        torch.testing.assert_close(g.float(), e.float(), rtol=tolerance, atol=tolerance)


def test_the_cache_dtype_is_checked() -> None:
    model = LeanLlama.from_hf(tiny_llama())
    with pytest.raises(ValueError, match="dtype must be torch.float32 or torch.float16"):
        model.set_kv_cache_dtype(torch.bfloat16)
    assert model.kv_cache_dtype == torch.float32
    assert resolve_settings().kv_cache_dtype == "float32"
    assert resolve_settings(kv_cache_dtype="float16").kv_cache_dtype == "float16"
    with pytest.raises(SettingError, match="kv_cache_dtype.*must be one of auto, float32, float16"):
        resolve_settings(kv_cache_dtype="fp8")
    with pytest.raises(SettingError, match="float16 is a cache type of the lean forward"):
        resolve_settings(kv_cache_dtype="float16", dtype="bfloat16")
