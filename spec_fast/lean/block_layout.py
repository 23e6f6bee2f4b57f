"""The layout of GGUF block-quantised weights (Q4_1, Q8_0) that the native block products read
(``blocks.c``; its header says why it is laid out so): packing and unpacking, in torch alone.

:mod:`spec_fast.lean.native` re-exports these names next to the products that read the layout.
"""

from __future__ import annotations

import torch

__all__ = ["BLOCK", "BLOCK_KINDS", "GROUP", "QUADS", "group_bytes", "pack_blocks", "quantize_q8_0", "select_outputs",
           "unpack_blocks"]

#: output columns per packed block (``BLOCK`` in kernels.c)
BLOCK = 64
#: inputs per quantisation group of the block kinds (``GROUP`` in blocks.c; GGUF's block size)
GROUP = 32
#: groups of 4 inputs per group (one 32-bit accumulator lane per output and quad in blocks.c)
QUADS = GROUP // 4
#: GGUF's block-quantised formats the kernels read, and their code in blocks.c
BLOCK_KINDS = {"q4_1": 4, "q8_0": 8}


def pack_blocks(kind: str, values: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor | None) -> torch.Tensor:
    """A block-quantised weight ``w[n, k] = scales[n, k // 32] * values[n, k] + offsets[n, k // 32]`` in the
    layout of blocks.c: uint8 ``[ceil(N / 64), K / 32, bytes per group]``.

    Args:
        kind: ``"q4_1"`` (``values`` uint8 in 0..15, ``offsets`` float32 ``[N, K / 32]``) or ``"q8_0"``
            (``values`` int8, ``offsets`` None).
        values: ``[N, K]``, K a multiple of 32.
        scales: ``[N, K / 32]`` float32.

    The layout stores ``scales`` and ``offsets`` as float16, as GGUF does; ``ValueError`` when one of them is
    not a float16 value (it would be rounded, and the product would no longer be of the weight passed).
    """
    if kind not in BLOCK_KINDS:
        raise ValueError(f"kind must be one of {sorted(BLOCK_KINDS)}, got kind={kind!r}")
    out_features, in_features = int(values.shape[0]), int(values.shape[1])
    if in_features % GROUP:
        raise ValueError(f"block-quantised weights need K divisible by {GROUP}, got K={in_features}")
    groups = in_features // GROUP
    blocks = -(-out_features // BLOCK)
    padded = blocks * BLOCK

    def pad(t: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(padded, *t.shape[1:], dtype=t.dtype)
        out[:out_features] = t
        return out

    def halves(name: str, t: torch.Tensor) -> torch.Tensor:
        """[N, G] float16-exact values -> float16 [NB, G, 64] (per block and group, one per output)"""
        exact = t.float()
        half = exact.half()
        if not torch.allclose(half.float(), exact, rtol=0.0, atol=0.0, equal_nan=True):
            raise ValueError(f"{name} must hold float16 values (GGUF's precision), got {name} that rounds")
        return pad(half).view(blocks, BLOCK, groups).permute(0, 2, 1).contiguous()

    # [NB, 64 outputs j, G, 8 quads, 4 inputs i] -> per (block, group): quad, output, input
    grid = pad(values).view(blocks, BLOCK, groups, QUADS, 4)
    scale_bytes = halves("scales", scales).view(torch.uint8)
    if kind == "q4_1":
        if offsets is None:
            raise ValueError("q4_1 needs offsets (GGUF's m), got offsets=None")
        low, high = grid[:, : BLOCK // 2].to(torch.uint8), grid[:, BLOCK // 2 :].to(torch.uint8)
        nibbles = (low | (high << 4)).permute(0, 2, 3, 1, 4).reshape(blocks, groups, GROUP * BLOCK // 2)
        parts = [nibbles, scale_bytes, halves("offsets", offsets).view(torch.uint8)]
    else:
        # stored as q + 128; blocks.c takes the offset -128 d (both kinds multiply unsigned bytes)
        biased = (grid.to(torch.int16) + 128).to(torch.uint8).permute(0, 2, 3, 1, 4)
        parts = [biased.reshape(blocks, groups, GROUP * BLOCK), scale_bytes]
    return torch.cat([p.reshape(blocks, groups, -1) for p in parts], dim=2).contiguous()


def quantize_q8_0(weight: torch.Tensor) -> torch.Tensor:
    """A float ``weight [N, K]`` (K a multiple of 32) quantised to Q8_0 in the layout of :func:`pack_blocks`, by
    GGUF's scheme: per output and group of 32 inputs, the scale ``d = max|w| / 127`` (stored as float16) and
    ``q = round(w / d)``, so each weight is off by at most half a step of its group (plus the scale's rounding)."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(f"weight must be a floating-point [N, K] tensor, got "
                         f"{getattr(weight, 'dtype', type(weight).__name__)} {tuple(getattr(weight, 'shape', ()))}")
    out_features, in_features = int(weight.shape[0]), int(weight.shape[1])
    if in_features % GROUP:
        raise ValueError(f"block-quantised weights need K divisible by {GROUP}, got K={in_features}")
    groups = weight.detach().float().cpu().reshape(out_features, in_features // GROUP, GROUP)
    scale = groups.abs().amax(dim=-1) / 127.0
    safe = torch.where(scale > 0, scale, torch.ones_like(scale)).unsqueeze(-1)
    values = torch.round(groups / safe).clamp(-127, 127).to(torch.int8).reshape(out_features, in_features)
    return pack_blocks("q8_0", values, scale.half().float(), None)


def select_outputs(packed: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The Q8_0 layout of :func:`pack_blocks` holding only the outputs ``rows [S]`` (long, in that order): the
    same bytes :func:`pack_blocks` writes for those rows of the weight, moved without unpacking (a draft's LM
    head over a vocabulary subset reads the target's own blocks). Q8_0 only: Q4_1 shares each byte between
    two outputs."""
    if packed.dtype != torch.uint8 or packed.dim() != 3 or int(packed.shape[2]) != group_bytes("q8_0"):
        raise ValueError(f"packed must be a Q8_0 layout uint8 [NB, G, {group_bytes('q8_0')}], got "
                         f"{packed.dtype} {tuple(packed.shape)}")
    blocks, groups = int(packed.shape[0]), int(packed.shape[1])
    rows = torch.as_tensor(rows, dtype=torch.long).reshape(-1)
    if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= blocks * BLOCK):
        raise ValueError(f"rows must lie in [0, {blocks * BLOCK}), got min {int(rows.min())}, max {int(rows.max())}")
    value_bytes = GROUP * BLOCK
    # per output: its [G, 8 quads, 4 inputs] value bytes and [G, 2] float16 scale bytes
    values = packed[:, :, :value_bytes].reshape(blocks, groups, QUADS, BLOCK, 4).permute(0, 3, 1, 2, 4)
    scales = packed[:, :, value_bytes:].reshape(blocks, groups, BLOCK, 2).permute(0, 2, 1, 3)
    chosen, padded = int(rows.numel()), -(-int(rows.numel()) // BLOCK) * BLOCK
    # padding outputs as pack_blocks writes them: value 0 (stored 128), scale 0
    picked_values = torch.full((padded, groups, QUADS, 4), 128, dtype=torch.uint8)
    picked_scales = torch.zeros(padded, groups, 2, dtype=torch.uint8)
    picked_values[:chosen] = values.reshape(blocks * BLOCK, groups, QUADS, 4).index_select(0, rows)
    picked_scales[:chosen] = scales.reshape(blocks * BLOCK, groups, 2).index_select(0, rows)
    out_blocks = padded // BLOCK
    parts = [picked_values.view(out_blocks, BLOCK, groups, QUADS, 4).permute(0, 2, 3, 1, 4),
             picked_scales.view(out_blocks, BLOCK, groups, 2).permute(0, 2, 1, 3)]
    return torch.cat([p.reshape(out_blocks, groups, -1) for p in parts], dim=2).contiguous()


def group_bytes(kind: str) -> int:
    """Bytes per block of 64 outputs and group of 32 inputs in :func:`pack_blocks`'s layout: the values, then
    64 float16 scales and (Q4_1) 64 float16 offsets."""
    return (GROUP * BLOCK // 2 + 2 * 2 * BLOCK) if kind == "q4_1" else (GROUP * BLOCK + 2 * BLOCK)


def unpack_blocks(kind: str, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    """The float32 ``[N, K]`` weight (``scale * value + offset``) of a layout of :func:`pack_blocks`."""
    blocks, groups, _ = (int(n) for n in packed.shape)
    value_bytes = GROUP * BLOCK // 2 if kind == "q4_1" else GROUP * BLOCK
    if kind == "q4_1":
        nibbles = packed[:, :, :value_bytes].reshape(blocks, groups, QUADS, BLOCK // 2, 4)
        values = torch.cat([nibbles & 15, nibbles >> 4], dim=3).float()  # [NB, G, 8 quads, 64 j, 4 i]
    else:
        values = (packed[:, :, :value_bytes].reshape(blocks, groups, QUADS, BLOCK, 4).to(torch.int16) - 128).float()
    rest = packed[:, :, value_bytes:].contiguous().view(torch.float16).float().view(blocks, groups, -1, BLOCK)
    scale = rest[:, :, 0].view(blocks, groups, 1, BLOCK, 1)
    weight = values * scale
    if kind == "q4_1":
        weight = weight + rest[:, :, 1].view(blocks, groups, 1, BLOCK, 1)
    # [NB, G, 8 quads, 64 j, 4 i] -> [NB * 64, G * 32]
    return weight.permute(0, 3, 1, 2, 4).reshape(blocks * BLOCK, groups * GROUP)[:out_features]
