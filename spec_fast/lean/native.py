"""The lean forward's own CPU code (``kernels.c``: matrix products; ``layer.c``: a whole decoder layer),
built once with the machine's C compiler.

``kernels.c`` multiplies activations by a float32 weight packed in column blocks of 64 outputs (its header
says how and why): every weight is read once per group of up to four rows, so a pass over 2-4 tokens costs
about what a pass over one costs, and each output row is computed the same way whatever the other rows
are (batch-invariant); ``blocks.c`` does the same for GGUF's Q4_1 / Q8_0 blocks on integer dot products.
``layer.c`` runs a whole decoder layer around those products in one call (norms, rotary embedding, cache
writes, attention, SiLU: about twenty torch operations in Python, whose dispatch cost more than their
arithmetic at SmolLM2's size). All are compiled on first use with ``$CC`` (default ``cc``) and
``-O3 -march=native -ffp-contract=fast`` into the cache directory of :mod:`spec_fast.cache` (``kernels/<key>/``; the key covers the source, the
compiler and the CPU), written atomically, and loaded with :mod:`ctypes`: no torch headers, no Python
extension build, about a second of compilation.

Where no compiler is found, a source is missing, the build fails, or ``SPEC_FAST_NATIVE=0`` is set,
:func:`available` is False and the lean forward keeps torch's matrix products (same results up to float32
rounding); the first three print one notice on stderr naming the cause and the fix. Every native call checks
its tensors first (dtype, device, rank, layout, sizes: a ``ValueError`` naming the argument), since C reads
raw memory. :func:`build` compiles for another ``-march`` (the tests' portable build).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from spec_fast.lean.block_layout import (BLOCK, BLOCK_KINDS, GROUP, group_bytes, pack_blocks, select_outputs,
                                         unpack_blocks)

__all__ = ["BLOCK", "BLOCK_KINDS", "CACHE_DTYPES", "CacheBuffers", "GROUP", "LAYER_KINDS", "LayerStack",
           "LayerWeights", "amx", "available", "build", "disabled", "group_bytes", "layers_arguments", "mm_blocks",
           "mm_float32", "move_entries", "pack_blocks", "pack_float32", "run_layer", "run_layers", "select_outputs",
           "unavailable_reason", "unpack_blocks", "unpack_float32", "using"]

_VERSION = 16
#: -ffp-contract=fast lets every multiply-add be one fused instruction (the same in every row of a batch)
_FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-std=gnu11", "-shared", "-fPIC")
_SOURCES = tuple(os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
                 for name in ("kernels.c", "blocks.c", "layer.c"))
_LOCK = threading.Lock()
_STATE: dict[str, ctypes.CDLL | None] = {}
_REASON: dict[str, str] = {}


def available() -> bool:
    """Whether the native kernels can be used here (built and loaded on the first call)."""
    return _library() is not None


def unavailable_reason() -> str | None:
    """Why :func:`available` is False (None where it is True or was not asked yet)."""
    return (_REASON.get("lib") or None) if "lib" in _STATE and _STATE["lib"] is None else None


@contextmanager
def disabled() -> Iterator[None]:
    """Within the block, :func:`available` is False: models built there keep torch's products (for the
    benchmarks and tests that compare both; not thread-safe)."""
    with using(None):
        yield


@contextmanager
def using(lib: ctypes.CDLL | None) -> Iterator[None]:
    """Within the block the kernels are ``lib`` (a library of :func:`build`, e.g. the portable build; None:
    torch's products); not thread-safe."""
    saved = _library()
    _STATE["lib"] = lib
    try:
        yield
    finally:
        _STATE["lib"] = saved


def _library() -> ctypes.CDLL | None:
    if "lib" in _STATE:
        return _STATE["lib"]
    with _LOCK:
        if "lib" not in _STATE:
            if os.environ.get("SPEC_FAST_NATIVE", "1") == "0":
                _STATE["lib"], _REASON["lib"] = None, "SPEC_FAST_NATIVE=0 is set"
            else:
                lib, reason = _load()
                _STATE["lib"], _REASON["lib"] = lib, reason
                if lib is None:
                    # one notice per process: the engine still runs, on torch's products (several times slower,
                    # and its greedy text may differ in the last float32 bits)
                    print(f"spec-fast: native kernels unavailable ({reason}); running on torch's matrix "
                          f"products, several times slower. Fix: {_fix(reason)}, or set SPEC_FAST_NATIVE=0 to "
                          f"silence this", file=sys.stderr, flush=True)
    return _STATE["lib"]


def _fix(reason: str) -> str:
    if reason.startswith("no C compiler"):
        return "install a C compiler (e.g. apt install gcc) or point $CC at one"
    if reason.startswith("missing source"):
        return "reinstall spec-verify (its wheel must ship spec_fast/lean/*.c)"
    return "check $CC and the cache folder ($SPEC_FAST_CACHE), then retry"


def _cpu_identity() -> str:
    """What ``-march=native`` compiles for: the architecture and the CPU's feature flags."""
    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            flags = next((line for line in handle if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return f"{platform.machine()} {platform.system()} {flags.strip()}"


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def _load() -> tuple[ctypes.CDLL | None, str]:
    """The native library (built into the cache on first use), or None and why not."""
    compiler = _compiler()
    if compiler is None:
        return None, f"no C compiler found (CC={os.environ.get('CC', 'cc')!r}, gcc)"
    source = b""
    for name in _SOURCES:
        try:
            with open(name, "rb") as handle:
                source += handle.read()
        except OSError as err:
            return None, f"missing source {os.path.basename(name)}: {err.strerror or err}"
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as err:
        return None, f"the compiler {compiler} did not run: {err}"
    identity = source + version.encode() + " ".join(_FLAGS).encode() + _cpu_identity().encode()
    key = hashlib.sha256(identity).hexdigest()[:16]
    from spec_fast.cache import cache_root

    folder = os.path.join(cache_root(), "kernels", key)
    path = os.path.join(folder, "libspec_fast_kernels.so")
    if not os.path.isfile(path):
        error = _build(compiler, folder, path, _FLAGS)
        if error is not None:
            return None, error
    return _open(path)


def build(folder: str, march: str = "native", defines: Sequence[str] = ()) -> ctypes.CDLL:
    """Compile the kernels for ``-march=<march>`` into ``folder`` and load them, outside the cache (the
    tests compile the portable code path this way: ``march="x86-64-v2"`` has neither AVX-512 nor VNNI);
    ``defines``: ``NAME=VALUE`` macros (``-D``) that pick another of the kernels' code paths."""
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C compiler found")
    flags = tuple(f"-march={march}" if flag == "-march=native" else flag for flag in _FLAGS)
    flags += tuple(f"-D{define}" for define in defines)
    path = os.path.join(folder, f"libspec_fast_kernels_{march}.so")
    error = _build(compiler, folder, path, flags)
    if error is not None:
        raise RuntimeError(error)
    lib, reason = _open(path)
    if lib is None:
        raise RuntimeError(reason)
    return lib


def _open(path: str) -> tuple[ctypes.CDLL | None, str]:
    try:
        lib = ctypes.CDLL(path)
        lib.spec_fast_kernels_version.restype = ctypes.c_int64
        if lib.spec_fast_kernels_version() != _VERSION:
            return None, f"{path} is version {lib.spec_fast_kernels_version()}, not {_VERSION}"
        i64, ptr, float64 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_double
        layers: list[Any] = [i64, ptr, ptr, i64, i64, ptr, ptr, ptr, i64, ptr, ptr, ptr, ptr, i64, ptr, float64, ptr]
        signatures: dict[str, tuple[list[Any], Any]] = {  # name: (argument types, result type)
            "mm_f32": ([ptr, i64, i64, i64, ptr, i64, ptr, i64, i64], None),
            "mm_blocks": ([i64, ptr, i64, i64, i64, ptr, i64, ptr, i64, i64], i64),
            "block_products": ([i64], i64), "pack_f32": ([ptr, i64, i64, i64, ptr], None),
            "layers": (layers, i64), "layers_head": ([*layers, i64, ptr, i64, ptr, ptr], i64),
            "rms_norm": ([ptr, i64, i64, ptr, float64, ptr], None), "first_max": ([ptr, i64, i64, i64, ptr], None),
            "tempered_draw": ([ptr, i64, i64, i64, ptr, ptr, ptr, ptr], None),
            "tempered_probs": ([ptr, i64, i64, i64, ptr, ptr], None),
            "filtered_draw": ([ptr, i64, i64, i64, ptr, ptr, ptr, ptr, ptr, ptr, ptr], None),
            "naive_chain": ([ptr, i64, i64, i64, i64, i64, ptr, ptr, ptr, i64, i64, ptr, ptr, ptr, ptr, ptr], None),
            "move_entries": ([i64, ptr, ptr, i64, i64, i64, i64, ptr, ptr, ptr, i64, i64], i64),
            "round_half": ([ptr, i64, ptr], None),
            "feature_mlp": ([i64, i64, i64, ptr, ptr, i64, ptr, ptr, ptr, ptr, ptr, ptr, float64, ptr, i64, ptr, i64,
                             i64, ptr, ptr, ptr, i64], i64),
        }
        for name, (arguments, result) in signatures.items():
            function = getattr(lib, "spec_fast_" + name)
            function.argtypes, function.restype = arguments, result
    except (OSError, AttributeError) as err:
        return None, f"{path} did not load: {err}"
    return lib, ""


def _build(compiler: str, folder: str, path: str, flags: tuple[str, ...]) -> str | None:
    """Compile the sources into ``path`` (written under a temporary name, then renamed); None, or the error."""
    try:
        os.makedirs(folder, exist_ok=True)
        handle, staging = tempfile.mkstemp(suffix=".so", dir=folder)
        os.close(handle)
        # OpenMP shares a product's column blocks among torch's thread count; a compiler without it builds the
        # single-threaded library (the pragmas are ignored)
        for openmp in (("-fopenmp",), ()):
            done = subprocess.run([compiler, *flags, *openmp, *_SOURCES, "-o", staging, "-lm"],
                                  capture_output=True, text=True, timeout=300)
            if done.returncode == 0:
                break
        if done.returncode != 0:
            os.unlink(staging)
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            return f"{os.path.basename(compiler)} failed: {last}"
        os.replace(staging, path)
        return None
    except (OSError, subprocess.SubprocessError) as err:
        return f"the build in {folder} failed: {err}"


def _check(name: str, t: torch.Tensor, dtype: torch.dtype, dims: int, contiguous: bool = False,
           shape: tuple[int | None, ...] | None = None) -> None:
    """The boundary of every native call: C reads raw memory, so a wrong dtype, device, rank, layout or
    size would be read as garbage (or out of bounds) instead of failing; a ``ValueError`` naming the
    argument instead. ``shape`` entries None are not checked."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise ValueError(f"{name} must be {dtype}, got {name}.dtype={t.dtype}")
    if t.device.type != "cpu":
        raise ValueError(f"{name} must be on the CPU, got {name}.device={t.device}")
    if t.dim() != dims:
        raise ValueError(f"{name} must have {dims} dimensions, got {name}.shape={tuple(t.shape)}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got {name}.stride()={t.stride()}")
    if shape is not None and any(want is not None and int(got) != want for got, want in zip(t.shape, shape)):
        expected = "[" + ", ".join("*" if n is None else str(n) for n in shape) + "]"
        raise ValueError(f"{name} must have shape {expected}, got {name}.shape={tuple(t.shape)}")


def _check_out_features(packed: torch.Tensor, out_features: int) -> None:
    if isinstance(out_features, bool) or not isinstance(out_features, int) or not (
            (int(packed.shape[0]) - 1) * BLOCK < out_features <= int(packed.shape[0]) * BLOCK):
        raise ValueError(f"out_features must be an int in ({(int(packed.shape[0]) - 1) * BLOCK}, "
                         f"{int(packed.shape[0]) * BLOCK}] for packed.shape={tuple(packed.shape)}, "
                         f"got out_features={out_features!r}")


def _rows(name: str, x: torch.Tensor, in_features: int) -> torch.Tensor:
    """``x`` checked as float32 ``[M, in_features]`` on the CPU, with unit stride along its rows."""
    _check(name, x, torch.float32, 2, shape=(None, in_features))
    return x if x.stride(-1) == 1 and (x.shape[0] <= 1 or x.stride(0) >= in_features) else x.contiguous()


def pack_float32(weight: torch.Tensor) -> torch.Tensor:
    """``weight [N, K]`` -> the packed layout ``[ceil(N / 64), K, 64]`` float32 (zeros beyond ``N``)."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(f"weight must be a floating-point [N, K] tensor, got "
                         f"{getattr(weight, 'dtype', type(weight).__name__)} {tuple(getattr(weight, 'shape', ()))}")
    out_features, in_features = int(weight.shape[0]), int(weight.shape[1])
    blocks = -(-out_features // BLOCK)
    source = weight.detach().float()
    lib = _library()
    if lib is None or source.device.type != "cpu":
        padded = torch.zeros(blocks * BLOCK, in_features, dtype=torch.float32, device=source.device)
        padded[:out_features] = source
        return padded.view(blocks, BLOCK, in_features).transpose(1, 2).contiguous()
    if source.stride(-1) != 1:
        source = source.contiguous()
    packed = torch.empty(blocks, in_features, BLOCK, dtype=torch.float32)
    lib.spec_fast_pack_f32(source.data_ptr(), out_features, in_features, int(source.stride(0)), packed.data_ptr())
    return packed


def unpack_float32(packed: torch.Tensor, out_features: int) -> torch.Tensor:
    """The ``[N, K]`` weight of a packed layout (:func:`pack_float32`)."""
    blocks, in_features, _ = packed.shape
    return packed.transpose(1, 2).reshape(int(blocks) * BLOCK, int(in_features))[:out_features]


def mm_float32(x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    """``x [M, K]`` float32 on the CPU times the packed weight's transpose -> ``[M, N]`` float32.

    Only with :func:`available` True (the caller checks); other dtypes, devices and shapes are a ValueError."""
    lib = _library()
    assert lib is not None
    _check("packed", packed, torch.float32, 3, contiguous=True, shape=(None, None, BLOCK))
    _check_out_features(packed, out_features)
    x = _rows("x", x, int(packed.shape[1]))
    rows, in_features = int(x.shape[0]), int(x.shape[1])
    out = torch.empty(rows, out_features, dtype=torch.float32)
    lib.spec_fast_mm_f32(x.data_ptr(), rows, int(x.stride(0)) if rows > 0 else in_features, in_features,
                         packed.data_ptr(), out_features, out.data_ptr(), out_features, torch.get_num_threads())
    return out


def mm_blocks(kind: str, x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    """``x [M, K]`` float32 on the CPU times a block-quantised weight's transpose -> ``[M, N]`` float32.

    The rows of ``x`` are quantised to int8 per group of 32 inputs first (llama.cpp's scheme, blocks.c), so
    the result is the product up to that rounding; each row's result depends on that row only."""
    lib = _library()
    assert lib is not None
    if kind not in BLOCK_KINDS:
        raise ValueError(f"kind must be one of {sorted(BLOCK_KINDS)}, got kind={kind!r}")
    _check("packed", packed, torch.uint8, 3, contiguous=True, shape=(None, None, group_bytes(kind)))
    _check_out_features(packed, out_features)
    x = _rows("x", x, int(packed.shape[1]) * GROUP)
    rows, in_features = int(x.shape[0]), int(x.shape[1])
    out = torch.empty(rows, out_features, dtype=torch.float32)
    status = lib.spec_fast_mm_blocks(BLOCK_KINDS[kind], x.data_ptr(), rows,
                                     int(x.stride(0)) if rows > 0 else in_features, in_features, packed.data_ptr(),
                                     out_features, out.data_ptr(), out_features, torch.get_num_threads())
    if status != 0:
        raise MemoryError("the native block product could not allocate its scratch memory")
    return out


def amx(enabled: bool | None = None) -> bool:
    """Whether block products run each whole chunk of 16 rows on AMX tiles (blocks.c: a prefill, a wide
    pass); ``enabled`` switches that on or off first, for the whole process (not thread-safe; tests and
    benchmarks compare both). The results are the same bit for bit either way: only the speed differs. False
    where the build or the CPU lacks AMX or the kernel refuses the process its tile registers."""
    lib = _library()
    if lib is None:
        return False
    return bool(lib.spec_fast_block_products(-1 if enabled is None else int(enabled)))


class LayerWeights(ctypes.Structure):
    """The weights of one decoder layer as ``layer.c`` reads them (``spec_fast_layer_weights``, same field
    order). It holds raw pointers: whoever builds one keeps the tensors alive and unchanged while it is used."""

    _fields_ = [
        ("hidden", ctypes.c_int64), ("heads", ctypes.c_int64), ("kv_heads", ctypes.c_int64),
        ("head_dim", ctypes.c_int64), ("intermediate", ctypes.c_int64),
        ("qkv_kind", ctypes.c_int64), ("o_kind", ctypes.c_int64), ("gate_up_kind", ctypes.c_int64),
        ("down_kind", ctypes.c_int64),
        ("qkv", ctypes.c_void_p), ("o", ctypes.c_void_p), ("gate_up", ctypes.c_void_p), ("down", ctypes.c_void_p),
        ("qkv_bias", ctypes.c_void_p), ("o_bias", ctypes.c_void_p),
        ("norm1", ctypes.c_void_p), ("norm2", ctypes.c_void_p),
        ("eps1", ctypes.c_double), ("eps2", ctypes.c_double),
    ]


#: the code of a packed weight's kind in layer.c (0: packed float32)
LAYER_KINDS = {"float32": 0, **BLOCK_KINDS}
#: the KV cache dtypes the native layer reads and writes
CACHE_DTYPES = (torch.float32, torch.float16)


def run_layer(weights: LayerWeights, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
              past: int, keys: torch.Tensor, values: torch.Tensor) -> None:
    """One decoder layer (``layer.c``) over the residual stream ``x [B, Q, H]`` in place.

    Args:
        cos, sin: ``[B, Q, D]`` (any leading layout with contiguous rows of ``D``) for each token's position.
        mask: ``[B, Q, past + Q]`` additive float32, contiguous, or None (causal).
        past: the cache entries before this call.
        keys, values: ``[B, H_kv, capacity, D]`` contiguous buffers, both float32 or both float16 (a float16
            cache: each new entry rounded to nearest-even once, read back exactly), capacity >= ``past + Q``;
            the new entries are written at slots ``past .. past + Q - 1``.

    Only with :func:`available` True (the caller checks); other dtypes, devices, layouts and shapes are a
    ValueError."""
    run_layers([(weights, keys, values)], x, cos, sin, mask, past)


class LayerStack:
    """Decoder layers ``(weights, keys, values)`` (each as in :func:`run_layer`) checked once for
    :func:`run_layers`: every weights a :class:`LayerWeights` of the first one's hidden size, head size and
    key/value heads, every ``keys``/``values`` a contiguous CPU buffer ``[B, H_kv, capacity, D]`` of one batch
    size, float32 or float16, the values shaped as their keys. It holds the tensors, so the raw pointers it
    keeps stay valid; a model reuses it across the passes that see the same tensors (the checks per pass
    were a few tenths of a millisecond of Python, several percent of a one-row decoding step)."""

    def __init__(self, stack: Sequence[tuple[LayerWeights, torch.Tensor, torch.Tensor]]) -> None:
        self.layers = tuple(stack)
        first, buffer = self.layers[0][:2] if self.layers else (None, None)
        if first is not None and not isinstance(first, LayerWeights):
            raise ValueError(f"weights must be a LayerWeights, got {type(first).__name__}")
        shape = (int(first.hidden), int(first.head_dim), int(first.kv_heads)) if first is not None else (0, 0, 0)
        self.hidden, self.dim, self.kv_heads = shape
        self.batch = int(buffer.shape[0]) if isinstance(buffer, torch.Tensor) and buffer.dim() > 0 else 0
        for weights, keys, values in self.layers:
            if not isinstance(weights, LayerWeights) or (int(weights.hidden), int(weights.head_dim),
                                                         int(weights.kv_heads)) != shape:
                raise ValueError("every layer of a stack must be a LayerWeights of the first layer's hidden size, "
                                 "head size and key/value heads")
            cache_dtype = keys.dtype if isinstance(keys, torch.Tensor) and keys.dtype in CACHE_DTYPES else torch.float32
            for name, buffer in (("keys", keys), ("values", values)):
                _check(name, buffer, cache_dtype, 4, contiguous=True, shape=(self.batch, self.kv_heads, None, self.dim))
            if tuple(keys.shape) != tuple(values.shape):
                raise ValueError(f"values must have the shape of keys {tuple(keys.shape)}, got "
                                 f"values.shape={tuple(values.shape)}")
        #: the slots every layer's buffers hold
        self.capacity = min((int(keys.shape[2]) for _, keys, _ in self.layers), default=0)
        count = len(self.layers)
        # the arguments of spec_fast_layers, one entry per layer
        self._weights = (ctypes.POINTER(LayerWeights) * count)(*[ctypes.pointer(w) for w, _, _ in self.layers])
        self._keys = (ctypes.c_void_p * count)(*[keys.data_ptr() for _, keys, _ in self.layers])
        self._values = (ctypes.c_void_p * count)(*[values.data_ptr() for _, _, values in self.layers])
        self._capacities = (ctypes.c_int64 * count)(*[int(keys.shape[2]) for _, keys, _ in self.layers])
        self._halves = (ctypes.c_int64 * count)(*[int(keys.dtype == torch.float16) for _, keys, _ in self.layers])

    def __len__(self) -> int:
        return len(self.layers)


def run_layers(stack: LayerStack | Sequence[tuple[LayerWeights, torch.Tensor, torch.Tensor]], x: torch.Tensor,
               cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None, past: int,
               norm: tuple[torch.Tensor, float] | None = None) -> torch.Tensor | None:
    """The decoder layers ``stack`` (a :class:`LayerStack`, or the ``(weights, keys, values)`` of one, each as
    in :func:`run_layer`) one after another over ``x`` in place, in one native call (the shared arguments
    checked once per pass; each layer computes what a :func:`run_layer` call computes). With ``norm = (weight
    [H], eps)`` it returns the final norm (``row_ops.rms_norm``'s bits) as a new tensor, else None. A
    ``MemoryError`` can leave ``x`` partly updated."""
    lib = _library()
    assert lib is not None
    if len(stack) == 0:
        if norm is not None:
            raise ValueError("a final norm needs at least one layer in the stack (the norm's width is the layers')")
        return None
    arguments, normed = layers_arguments(stack, x, cos, sin, mask, past, norm)
    if lib.spec_fast_layers(*arguments) != 0:
        raise MemoryError("the native decoder layer could not allocate its scratch memory")
    return normed


def layers_arguments(stack: LayerStack | Sequence[tuple[LayerWeights, torch.Tensor, torch.Tensor]],
                     x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None, past: int,
                     norm: tuple[torch.Tensor, float] | None) -> tuple[tuple[Any, ...], torch.Tensor | None]:
    """:func:`run_layers`' checked arguments as ``spec_fast_layers``' (which open every such native call)."""
    layers = stack if isinstance(stack, LayerStack) else LayerStack(stack)
    _check("x", x, torch.float32, 3, contiguous=True, shape=(layers.batch, None, layers.hidden))
    batch, num_query, dim = int(x.shape[0]), int(x.shape[1]), layers.dim
    if isinstance(past, bool) or not isinstance(past, int) or past < 0:
        raise ValueError(f"past must be an int >= 0, got past={past!r}")
    for name, table in (("cos", cos), ("sin", sin)):
        _check(name, table, torch.float32, table.dim() if isinstance(table, torch.Tensor) else 0, contiguous=True)
        if table.numel() != batch * num_query * dim or int(table.shape[-1]) != dim:
            raise ValueError(f"{name} must hold [{batch}, {num_query}, {dim}] rows, got "
                             f"{name}.shape={tuple(table.shape)}")
    if mask is not None:
        _check("mask", mask, torch.float32, mask.dim() if isinstance(mask, torch.Tensor) else 0, contiguous=True)
        if mask.numel() != batch * num_query * (past + num_query) or int(mask.shape[-1]) != past + num_query:
            raise ValueError(f"mask must be [{batch}, {num_query}, {past + num_query}], got "
                             f"mask.shape={tuple(mask.shape)}")
    if layers.capacity < past + num_query:
        raise ValueError(f"keys must hold at least past + Q = {past + num_query} slots, got {layers.capacity}")
    normed, norm_data, eps = None, None, 0.0
    if norm is not None:
        weight, eps = norm
        _check("norm weight", weight, torch.float32, 1, contiguous=True, shape=(layers.hidden,))
        normed = torch.empty(x.shape, dtype=torch.float32)
        norm_data, eps = weight.data_ptr(), float(eps)
    mask_data, normed_data = None if mask is None else mask.data_ptr(), None if normed is None else normed.data_ptr()
    return ((len(layers), layers._weights, x.data_ptr(), batch, num_query, cos.data_ptr(), sin.data_ptr(), mask_data,
             past, layers._keys, layers._values, layers._capacities, layers._halves, torch.get_num_threads(),
             norm_data, eps, normed_data), normed)


class CacheBuffers:
    """Every layer's ``(keys, values)`` of a KV cache checked once for :func:`move_entries`: ``[B, H_kv,
    capacity, D]`` contiguous CPU buffers of one shape and one dtype, float32 or float16. It holds the tensors,
    so the pointer arrays it keeps stay valid; a cache reuses it while its buffers are the same objects."""

    def __init__(self, buffers: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.buffers = tuple(buffers)
        first = self.buffers[0][0] if self.buffers else None
        if self.buffers and not isinstance(first, torch.Tensor):
            raise ValueError(f"keys must be a torch.Tensor, got {type(first).__name__}")
        self.shape = tuple(first.shape) if isinstance(first, torch.Tensor) else ()
        cache_dtype = first.dtype if isinstance(first, torch.Tensor) and first.dtype in CACHE_DTYPES else torch.float32
        for keys, values in self.buffers:
            for name, buffer in (("keys", keys), ("values", values)):
                _check(name, buffer, cache_dtype, 4, contiguous=True, shape=self.shape)
        self.element_size = first.element_size() if isinstance(first, torch.Tensor) else 0
        self.key_pointers = (ctypes.c_void_p * len(self.buffers))(*[k.data_ptr() for k, _ in self.buffers])
        self.value_pointers = (ctypes.c_void_p * len(self.buffers))(*[v.data_ptr() for _, v in self.buffers])

    def __len__(self) -> int:
        return len(self.buffers)


def move_entries(buffers: CacheBuffers | Sequence[tuple[torch.Tensor, torch.Tensor]], source: torch.Tensor,
                 target: torch.Tensor, counts: torch.Tensor) -> None:
    """In every ``(keys, values)`` of ``buffers`` (a :class:`CacheBuffers`, or the pairs of one) and row ``b``,
    move the entry at slot ``source[b, i]`` to slot ``target[b, i]`` for ``i < counts[b]``, every kept entry of
    a row read before any is written (``layer.c``, ``spec_fast_move_entries``). ``source, target [B, M]`` and
    ``counts [B]`` are int64; an index outside the buffers or a count outside ``[0, M]`` is a ValueError and
    nothing moves."""
    lib = _library()
    assert lib is not None
    if len(buffers) == 0:
        return
    prepared = buffers if isinstance(buffers, CacheBuffers) else CacheBuffers(buffers)
    batch, heads, capacity, dim = prepared.shape
    _check("source", source, torch.int64, 2, contiguous=True, shape=(batch, None))
    most = int(source.shape[1])
    _check("target", target, torch.int64, 2, contiguous=True, shape=(batch, most))
    _check("counts", counts, torch.int64, 1, contiguous=True, shape=(batch,))
    status = lib.spec_fast_move_entries(len(prepared), prepared.key_pointers, prepared.value_pointers, batch,
                                        heads, capacity, dim, source.data_ptr(), target.data_ptr(), counts.data_ptr(),
                                        most, prepared.element_size)
    if status == -2:
        raise ValueError(f"source and target must index slots in [0, {capacity}) and counts lie in [0, {most}]")
    if status != 0:
        raise MemoryError("the native cache move could not allocate its scratch memory")
