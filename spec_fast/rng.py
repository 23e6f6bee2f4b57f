"""Counter-based, device-independent uniforms for replayable verification (docs/engine.md section 4).

``counter_uniforms(seed, offset, shape, device)`` is a *pure function* of ``(seed, counter)`` where the
counter of element ``i`` (row-major index inside one row) is ``offset + i``. The hash is SplitMix64
(Steele, Lea & Flood 2014) evaluated twice, in wrapping int64 arithmetic with masked logical shifts, so
CPU and CUDA produce bit-identical values:

    key      = splitmix64(seed)
    bits     = splitmix64(key + counter)          (mod 2**64)
    uniform  = (bits >>> 40) * 2**-24             (float32, exactly on the 2**-24 grid, in [0, 1))

The 24-bit grid makes every uniform exactly representable in float32 *and* float64, so the same numbers
can be handed to :mod:`spec_ref` (``spec_ref.NodeReplaySource(uniforms[b].double().numpy())``) and the
multiplicative accept test ``u * q < p`` is evaluated on identical values by both.

Per-row seeds/offsets: ``seed`` and ``offset`` may be ints or ``[B]`` int64 tensors; with tensors,
``shape[0]`` must be ``B`` and row ``b`` uses ``(seed[b], offset[b])`` with counters over ``shape[1:]``.
Unused draws never shift later ones: the value at a position depends only on its counter.
"""

from __future__ import annotations

import torch

__all__ = ["counter_uniforms", "splitmix64", "UNIFORM_BITS"]

#: Number of random bits in each uniform (the grid is ``2**-UNIFORM_BITS``).
UNIFORM_BITS = 24

_MASK64 = (1 << 64) - 1


def _signed(value: int) -> int:
    """The int64 two's-complement value of a 64-bit unsigned constant."""
    value &= _MASK64
    return value - (1 << 64) if value >= (1 << 63) else value


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MIX1 = _signed(0xBF58476D1CE4E5B9)
_MIX2 = _signed(0x94D049BB133111EB)


def _shr(x: torch.Tensor, shift: int) -> torch.Tensor:
    """Logical (unsigned) right shift of int64 ``x`` by ``shift`` bits."""
    return torch.bitwise_and(torch.bitwise_right_shift(x, shift), (1 << (64 - shift)) - 1)


def splitmix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64 finaliser of int64 ``x`` (any shape), wrapping mod 2**64, as int64."""
    z = x + _GOLDEN
    z = torch.bitwise_xor(z, _shr(z, 30)) * _MIX1
    z = torch.bitwise_xor(z, _shr(z, 27)) * _MIX2
    return torch.bitwise_xor(z, _shr(z, 31))


#: at most this many counters on the CPU are hashed in Python integers (:func:`_splitmix64_int`), the same
#: bits: the twenty-odd tensor operations of the vectorised hash cost ~80 us however few counters a
#: decoding step draws (a few per row)
HOST_COUNTERS = 64


def _splitmix64_int(value: int) -> int:
    """:func:`splitmix64` of one int64 value in Python integers: the unsigned 64-bit result."""
    z = (value + _GOLDEN) & _MASK64
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK64
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK64
    return z ^ (z >> 31)


def _uniform_int(counter: int) -> float:
    """The uniform of key + counter (any integer, taken mod 2**64) on the 2**-24 grid."""
    return (_splitmix64_int(counter & _MASK64) >> (64 - UNIFORM_BITS)) * 2.0 ** -UNIFORM_BITS


def _as_int64(value: int | torch.Tensor, name: str, device: torch.device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        if value.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
            raise ValueError(f"{name} must be an integer tensor, got dtype={value.dtype}")
        if value.dim() != 1:
            raise ValueError(f"{name} must be an int or a [B] tensor, got shape {tuple(value.shape)}")
        return value.to(device=device, dtype=torch.int64)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int or a [B] int64 tensor, got {name}={value!r}")
    if not -(1 << 63) <= value <= _MASK64:
        # wrapping mod 2**64 would silently give 2**64 the stream of 0
        raise ValueError(f"{name} must fit in 64 bits (-2**63 <= {name} < 2**64), got {name}={value!r}")
    return torch.tensor([_signed(value)], dtype=torch.int64, device=device)


def counter_uniforms(
    seed: int | torch.Tensor,
    offset: int | torch.Tensor,
    shape: tuple[int, ...],
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Uniforms in [0, 1), float32 on the 2**-24 grid, as a pure function of (seed, offset, index).

    Args:
        seed: int, or ``[B]`` int64 tensor of per-row seeds (then ``shape[0] == B``).
        offset: int, or ``[B]`` int64 tensor of per-row counter offsets (then ``shape[0] == B``).
        shape: output shape. With per-row seeds/offsets, counters run over ``shape[1:]`` within each row;
            otherwise over the whole shape (row-major).
        device: where to compute; the values do not depend on it.

    Returns:
        ``shape`` float32 tensor.
    """
    device = torch.device(device)
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"shape={shape} must have non-negative sizes")
    per_row = isinstance(seed, torch.Tensor) or isinstance(offset, torch.Tensor)
    seed_t = _as_int64(seed, "seed", device)
    offset_t = _as_int64(offset, "offset", device)
    if per_row:
        if len(shape) == 0:
            raise ValueError(f"per-row seed/offset need shape=(B, ...), got shape={shape}")
        rows = shape[0]
        for name, t in (("seed", seed_t), ("offset", offset_t)):
            if t.shape[0] not in (1, rows):
                raise ValueError(f"{name} has {t.shape[0]} rows but shape[0]={rows}")
        inner = 1
        for s in shape[1:]:
            inner *= s
        if device.type == "cpu" and rows * inner <= HOST_COUNTERS:
            keys = [_splitmix64_int(k) for k in seed_t.tolist()]
            starts = offset_t.tolist()
            values = [_uniform_int(keys[b if len(keys) > 1 else 0] + starts[b if len(starts) > 1 else 0] + i)
                      for b in range(rows) for i in range(inner)]
            return torch.tensor(values, dtype=torch.float32).reshape(shape)
        index = torch.arange(inner, dtype=torch.int64, device=device).unsqueeze(0)  # [1, inner]
        key = splitmix64(seed_t).unsqueeze(1)  # [B or 1, 1]
        counter = offset_t.unsqueeze(1) + index  # [B or 1, inner]
        bits = splitmix64(key + counter).expand(rows, inner)
    else:
        total = 1
        for s in shape:
            total *= s
        index = torch.arange(total, dtype=torch.int64, device=device)
        bits = splitmix64(splitmix64(seed_t) + offset_t + index)
    top = _shr(bits, 64 - UNIFORM_BITS)
    return (top.to(torch.float32) * (2.0 ** -UNIFORM_BITS)).reshape(shape)
