"""The native library's edges (spec_fast/lean/native.py): what ships, what happens when it cannot be built,
what it accepts, and the portable code path.

* every C source that native.py compiles is package data in pyproject.toml (a wheel without one broke the
  first generate with FileNotFoundError);
* a missing source, a missing compiler or a failing compiler leaves :func:`native.available` False with one
  notice on stderr naming the cause and the fix, never an exception;
* every native call checks dtype, device, rank, layout and size first: a ``ValueError`` naming the
  argument (a float64 input to a Q8_0 layer used to return values off by up to 1e20);
* the portable build (``-march=x86-64-v2``: no AVX-512, no VNNI) computes what the native build computes,
  and keeps a token's logits independent of what shares its pass.
"""

from __future__ import annotations

import fnmatch
import os
import platform
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from spec_fast.lean import LeanLinear, LeanLlama, native
from spec_fast.lean.huge_pages import huge_page_copies
from tests.engine.models import tiny_llama
from tests.engine.test_lean import _drive
from tests.engine.test_lean_layer import _token_logits_depend_on_the_pass
from tests.native_kernels import require_native

ROOT = Path(__file__).resolve().parents[2]


def test_every_source_native_compiles_is_package_data() -> None:
    with open(ROOT / "pyproject.toml", "rb") as handle:
        patterns = tomllib.load(handle)["tool"]["setuptools"]["package-data"]["spec_fast"]
    package = ROOT / "spec_fast"
    for source in native._SOURCES:
        relative = Path(source).resolve().relative_to(package).as_posix()
        assert any(fnmatch.fnmatch(relative, p) for p in patterns), f"{relative} is not in spec_fast's package data"
    # and the sources are the C files in the folder (a new one must be compiled and shipped)
    assert sorted(Path(s).name for s in native._SOURCES) == sorted(p.name for p in (package / "lean").glob("*.c"))


def _probe(tmp_path: Path, setup: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    code = ("from spec_fast.lean import native\n" + setup +
            "\nprint(native.available(), native.available(), native.unavailable_reason() is not None)")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "SPEC_FAST_CACHE": str(tmp_path / "cache"), **env})


@pytest.mark.parametrize("cause", ["missing source", "no compiler", "compiler fails"])
def test_an_unbuildable_library_falls_back_with_one_notice_naming_cause_and_fix(tmp_path: Path, cause: str) -> None:
    setup, env = "", {}
    if cause == "missing source":
        setup = "native._SOURCES = native._SOURCES + ('/nonexistent/missing.c',)"
    elif cause == "no compiler":
        env = {"CC": "/nonexistent/cc", "PATH": str(tmp_path)}
    else:
        failing = tmp_path / "cc"
        failing.write_text("#!/bin/sh\necho 'cc: error: this compiler always fails' >&2\nexit 1\n")
        failing.chmod(0o755)
        env = {"CC": str(failing)}
    done = _probe(tmp_path, setup, env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "True"]
    notices = [line for line in done.stderr.splitlines() if "native kernels unavailable" in line]
    assert len(notices) == 1 and "Fix:" in notices[0], done.stderr
    expected = {"missing source": "missing.c", "no compiler": "no C compiler",
                "compiler fails": "this compiler always fails"}[cause]
    assert expected in notices[0]
    # negative control: the same probe with nothing broken builds the library and says nothing
    if cause == "missing source":
        require_native()
        healthy = _probe(tmp_path, "", {})
        assert healthy.stdout.split() == ["True", "True", "False"] and "unavailable" not in healthy.stderr


def _blocks(kind: str, out_features: int, in_features: int) -> LeanLinear:
    groups = in_features // native.GROUP
    if kind == "q4_1":
        values = torch.randint(0, 16, (out_features, in_features), dtype=torch.uint8)
        offsets: torch.Tensor | None = (torch.randn(out_features, groups) * 0.05).half().float()
    else:
        values = torch.randint(-128, 128, (out_features, in_features), dtype=torch.int8)
        offsets = None
    return LeanLinear.from_blocks(kind, values, scales=(torch.rand(out_features, groups) * 0.02).half().float(),
                                offsets=offsets)


@pytest.mark.usefixtures("native_kernels")
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16, torch.int64])
@pytest.mark.parametrize("kind", ["float32", "q8_0", "q4_1"])
def test_a_layer_refuses_inputs_the_kernel_cannot_read(kind: str, dtype: torch.dtype) -> None:
    torch.manual_seed(1)
    layer = LeanLinear.from_weight(torch.randn(70, 64), None, "float32") if kind == "float32" else _blocks(kind, 70, 64)
    assert layer.packed is not None
    x = torch.randn(3, 64)
    assert layer(x).shape == (3, 70)  # negative control: float32 runs
    with pytest.raises(ValueError, match=r"^x must be torch.float32, got x.dtype="):
        layer(x.to(dtype))


Call = Callable[[], Any]


def _calls() -> dict[str, tuple[Call, str]]:
    """Bad calls of every native entry point -> (the call, the start of the expected message)."""
    torch.manual_seed(2)
    packed = native.pack_float32(torch.randn(70, 64))
    blocks = _blocks("q8_0", 70, 64).packed
    assert blocks is not None
    x = torch.randn(3, 64)
    return {
        "f32 x rank": (lambda: native.mm_float32(x[0], packed, 70), "x must have 2 dimensions"),
        "f32 x width": (lambda: native.mm_float32(torch.randn(3, 63), packed, 70), "x must have shape [*, 64]"),
        "f32 packed dtype": (lambda: native.mm_float32(x, packed.double(), 70), "packed must be torch.float32"),
        "f32 packed layout": (lambda: native.mm_float32(x, packed.transpose(0, 1), 70), "packed must be contiguous"),
        "f32 out_features": (lambda: native.mm_float32(x, packed, 129), "out_features must be an int in (64, 128]"),
        "f32 x strided": (lambda: native.mm_float32(torch.randn(3, 128)[:, ::2], packed, 70), ""),
        "blocks kind": (lambda: native.mm_blocks("q5_0", x, blocks, 70), "kind must be one of"),
        "blocks packed of another kind": (lambda: native.mm_blocks("q4_1", x, blocks, 70), "packed must have shape"),
        "blocks x width": (lambda: native.mm_blocks("q8_0", torch.randn(3, 32), blocks, 70),
                           "x must have shape [*, 64]"),
        "blocks x dtype": (lambda: native.mm_blocks("q8_0", x.bfloat16(), blocks, 70), "x must be torch.float32"),
        "blocks out_features": (lambda: native.mm_blocks("q8_0", x, blocks, 0), "out_features must be an int"),
        "pack weight rank": (lambda: native.pack_float32(torch.randn(64)), "weight must be a floating-point [N, K]"),
    }


@pytest.mark.usefixtures("native_kernels")
@pytest.mark.parametrize("case", list(_calls()))
def test_every_product_checks_its_arguments_before_the_native_call(case: str) -> None:
    call, message = _calls()[case]
    if not message:  # a strided input is copied, not refused (the control)
        assert call().shape == (3, 70)
        return
    with pytest.raises(ValueError, match="^" + message.replace("[", r"\[").replace("*", r"\*").replace("(", r"\(")
                       .replace("]", r"\]").replace(")", r"\)")):
        call()


@pytest.mark.usefixtures("native_kernels")
def test_the_native_layer_checks_its_arguments() -> None:
    model = LeanLlama.from_hf(tiny_llama())
    layer = model.model.layers[0]
    weights = layer.native_weights()
    assert weights is not None
    hidden, heads, dim = int(weights.hidden), int(weights.kv_heads), int(weights.head_dim)
    x = torch.randn(1, 2, hidden)
    cos = sin = torch.ones(1, 2, dim)
    keys, values = torch.zeros(1, heads, 4, dim), torch.zeros(1, heads, 4, dim)
    native.run_layer(weights, x.clone(), cos, sin, None, 0, keys, values)  # the control: runs

    def call(**changed: Any) -> Call:
        args: dict[str, Any] = {"x": x, "cos": cos, "sin": sin, "mask": None, "past": 0, "keys": keys,
                                "values": values, **changed}
        return lambda: native.run_layer(weights, *args.values())

    bad: list[tuple[Call, str]] = [
        (call(x=x.double()), "x must be torch.float32"),
        (call(x=x[..., :-1].contiguous()), "x must have shape"),
        (call(x=torch.randn(1, 2, 2 * hidden)[..., ::2]), "x must be contiguous"),
        (call(cos=cos[:, :1]), "cos must hold"),
        (call(sin=sin.half()), "sin must be torch.float32"),
        (call(mask=torch.zeros(1, 2, 3)), "mask must be"),
        (call(past=3), "keys must hold at least"),
        (call(past=-1), "past must be an int >= 0"),
        (call(values=values[:, :, :3].contiguous()), "values must"),
        (call(keys=keys[:, :1].contiguous()), "keys must have shape"),
    ]
    for call, message in bad:
        with pytest.raises(ValueError, match="^" + message):
            call()


@pytest.fixture(scope="module")
def portable(tmp_path_factory: pytest.TempPathFactory) -> Any:
    require_native()
    march = "x86-64-v2" if platform.machine() in ("x86_64", "AMD64") else "armv8-a"
    return native.build(str(tmp_path_factory.mktemp("portable-kernels")), march)


def test_the_portable_build_computes_what_the_native_build_computes(portable: Any) -> None:
    torch.manual_seed(4)
    x = torch.randn(7, 576)
    for kind in ("float32", "q8_0", "q4_1"):
        layer = (LeanLinear.from_weight(torch.randn(192, 576), None, "float32") if kind == "float32"
                 else _blocks(kind, 192, 576))
        fast = layer(x)
        with native.using(portable):
            slow = layer(x)
            assert all(torch.equal(layer(x[i:i + 1]), slow[i:i + 1]) for i in range(7))  # rows independent
        # integer dot products are exact in both; float32 sums differ only in order (and FMA contraction)
        torch.testing.assert_close(slow, fast, rtol=1e-5, atol=1e-5 * 576 ** 0.5)
    hf = tiny_llama()
    with native.using(portable):
        model = LeanLlama.from_hf(hf)
        assert all(layer.native_weights() is not None for layer in model.model.layers)
        got = _drive(model)
        assert not _token_logits_depend_on_the_pass(LeanLlama.from_hf(tiny_llama(seed=7)))
    expected = _drive(LeanLlama.from_hf(hf))
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


def test_one_or_two_sweeps_over_a_block_give_the_same_bits(tmp_path_factory: pytest.TempPathFactory) -> None:
    # 3 and more rows sweep a Q4_1 block twice, half of its outputs at a time, except on AMD Zen, where one sweep
    # is faster (blocks.c, HALVES_FROM): both paths are built here whatever this machine picks, and every row
    # count must give the very bits of the other path (and of the row alone)
    require_native()
    one = native.build(str(tmp_path_factory.mktemp("one-sweep")), defines=("HALVES_FROM=99",))
    two = native.build(str(tmp_path_factory.mktemp("two-sweeps")), defines=("HALVES_FROM=3",))
    torch.manual_seed(6)
    x = torch.randn(9, 576)
    for kind in ("q8_0", "q4_1"):
        layer = _blocks(kind, 200, 576)  # the last block of outputs is partly filled
        for rows in range(1, 10):
            with native.using(one):
                swept_once = layer(x[:rows])
            with native.using(two):
                swept_twice = layer(x[:rows])
                alone = layer(x[rows - 1:rows])
            assert torch.equal(swept_once, swept_twice), (kind, rows)
            assert torch.equal(swept_twice[-1:], alone), (kind, rows)


def test_both_builds_quantise_awkward_activations_alike(portable: Any) -> None:
    # the native build quantises activations 16 lanes at a time, the portable one value by value: ties must
    # round half to even in both, NaN must be ignored by the group maximum and become 0, inf and zeros alike
    torch.manual_seed(5)
    x = torch.randn(9, 576) * torch.logspace(-20, 20, 9).unsqueeze(1)
    x[0, 3] = float("nan")
    x[1, :32] = float("nan")
    x[2, 7] = float("inf")
    x[3, 40] = -float("inf")
    x[4] = 0.0
    x[5, 64:96] = -0.0
    x[6, :32] = torch.arange(32) - 15.5  # with 127 in the group, dx = 1: these sit halfway between integers
    x[6, 0] = 127.0
    x[7] = torch.randn(576) * 1e-40  # subnormal
    for kind in ("q8_0", "q4_1"):
        layer = _blocks(kind, 70, 576)
        fast = layer(x)
        with native.using(portable):
            slow = layer(x)
        # (float sums in another order: rtol 1e-4; one integer off at a tie would be about 1e-2)
        torch.testing.assert_close(slow, fast, rtol=1e-4, atol=1e-5 * 576 ** 0.5, equal_nan=True)


def test_huge_page_copies_are_equal_aligned_copies_in_one_buffer() -> None:
    tensors = [torch.randint(0, 255, (3, 77), dtype=torch.uint8), torch.randn(5, 7), torch.zeros(0, dtype=torch.uint8),
               torch.randint(0, 255, (1000,), dtype=torch.uint8)]
    copies = huge_page_copies(tensors)
    for original, copy in zip(tensors, copies, strict=True):
        assert copy.dtype == original.dtype and copy.shape == original.shape and torch.equal(copy, original)
        assert copy.data_ptr() % 64 == 0 or copy.numel() == 0
        assert copy.numel() == 0 or copy.data_ptr() != original.data_ptr()  # a copy, not the caller's memory
    # one buffer: the non-empty copies share a storage, so one madvise covers them all
    storages = {c.untyped_storage().data_ptr() for c in copies if c.numel()}
    assert len(storages) == 1


def _functions(assembly: str) -> dict[str, str]:
    """Each function's body in GCC's assembly output, by symbol (clones such as ``.constprop.0`` included)."""
    bodies: dict[str, str] = {}
    current: list[str] | None = None
    for line in assembly.splitlines():
        if line and not line[0].isspace() and line.endswith(":") and not line.startswith("."):
            current = []
            bodies[line[:-1]] = ""
        elif current is not None and line.strip().startswith(".size"):
            name = line.split()[1].rstrip(",")
            if name in bodies:
                bodies[name] = "\n".join(current)
            current = None
        elif current is not None:
            current.append(line)
    return bodies


@pytest.mark.parametrize("march", ["icelake-server", "znver3"])
def test_the_vector_block_products_prefetch_their_weights(march: str) -> None:
    # A pass streams about 66 MB of block weights; without the prefetches the one-row step of the default model
    # ran 1.2-1.3x and the four-row step 1.3-1.5x slower on the Intel core, and no result changed: only the
    # generated code shows it. GCC deletes calls to a helper that holds nothing but prefetches (to it they have
    # no side effect). On AMD Zen (the znver macros) 1-2 row products leave the streaming to the hardware
    # prefetchers and 3-4 row ones prefetch into L2 (bench/results/pass_width.md).
    compiler = native._compiler()
    if compiler is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("no C compiler (CI=true: this check may not skip)")
        pytest.skip("no C compiler")
    flags = [flag for flag in native._FLAGS if flag not in ("-shared", "-fPIC", "-march=native")]
    # znver3 has no AVX-512: added by hand, as -march=native adds it on a Zen 4 core that GCC 12 calls znver3
    arch = (["-march=icelake-server"] if march == "icelake-server" else
            ["-march=znver3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni"])
    source = str(ROOT / "spec_fast" / "lean" / "blocks.c")
    done = subprocess.run([compiler, *flags, *arch, "-S", "-o", "-", source],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    products = {name: body for name, body in _functions(done.stdout).items() if name.startswith("rows_")}
    assert {name.split(".")[0] for name in products} >= {f"rows_{kind}_{rows}" for kind in (4, 8) for rows in (1, 2, 3, 4)}
    assert all("vpdpbusd" in body for body in products.values())
    rows = {name: int(name.split(".")[0].split("_")[2]) for name in products}
    expected = {name: ("prefetcht0" if march == "icelake-server" else "prefetcht1" if rows[name] >= 3 else None)
                for name in products}
    found = {name: sorted({line.split()[0] for line in body.splitlines() if line.strip().startswith("prefetch")})
             for name, body in products.items()}
    wrong = sorted(name for name in products
                   if found[name] != ([] if expected[name] is None else [expected[name]]))
    assert not wrong, f"prefetches {[(name, found[name]) for name in wrong]}, expected {expected}"


def _random_block_weight(kind: str, out_features: int, in_features: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    groups = in_features // native.GROUP
    scales = (torch.rand(out_features, groups, generator=gen) * 0.01).half().float()
    if kind == "q4_1":
        values = torch.randint(0, 16, (out_features, in_features), dtype=torch.uint8, generator=gen)
        offsets = (torch.rand(out_features, groups, generator=gen) * -0.05).half().float()
        return native.pack_blocks(kind, values, scales, offsets)
    values = torch.randint(-128, 128, (out_features, in_features), dtype=torch.int8, generator=gen)
    return native.pack_blocks(kind, values, scales, None)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
def test_amx_tiles_compute_what_the_vector_products_compute(kind: str, threads: int) -> None:
    # Whole chunks of 16 rows run on AMX tiles where the CPU and kernel allow them; the integer sums and float
    # steps are the same, so every bit must be.
    require_native()
    if not native.amx():
        pytest.skip("this CPU, build or kernel has no AMX tiles")
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(7)
        for out_features, in_features in [(64, 32), (130, 96), (576, 1536)]:
            packed = _random_block_weight(kind, out_features, in_features, out_features + in_features)
            for rows in (16, 17, 35, 48):
                x = torch.randn(rows, in_features, generator=gen) * 4
                x[1, :7] = 0.0
                x[2] *= 1e30
                native.amx(False)
                vector = native.mm_blocks(kind, x, packed, out_features)
                native.amx(True)
                tiles = native.mm_blocks(kind, x, packed, out_features)
                assert torch.equal(tiles.view(torch.int32), vector.view(torch.int32)), (out_features, in_features, rows)
                # a row within a chunk of tiles gets what it gets alone (one row never uses them)
                assert torch.equal(native.mm_blocks(kind, x[5:6], packed, out_features), tiles[5:6])
    finally:
        native.amx(True)
        torch.set_num_threads(saved)
