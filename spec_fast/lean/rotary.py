"""Rotary position embeddings as the lean model applies them: HF's table of ``cos``/``sin`` per position,
computed once, and the rotation of the query and key halves."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["RotaryTable", "rotate"]


class RotaryTable(nn.Module):
    """``cos``/``sin [P, D]`` for positions ``0..P-1``, computed as HF's rotary embedding computes them."""

    def __init__(self, inv_freq: torch.Tensor, attention_scaling: float, max_positions: int) -> None:
        super().__init__()
        positions = torch.arange(max_positions, dtype=torch.float32, device=inv_freq.device)
        freqs = torch.outer(positions, inv_freq.float())
        angles = torch.cat([freqs, freqs], dim=-1)
        self.cos: torch.Tensor
        self.sin: torch.Tensor
        self.register_buffer("cos", angles.cos() * attention_scaling, persistent=False)
        self.register_buffer("sin", angles.sin() * attention_scaling, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``positions [B, Q]`` (below the table's length; the engine checks the context) -> ``cos, sin
        [B, 1, Q, D]`` (broadcast over heads)."""
        flat = positions.reshape(-1)
        shape = (int(positions.shape[0]), 1, int(positions.shape[1]), int(self.cos.shape[1]))
        return self.cos.index_select(0, flat).view(shape), self.sin.index_select(0, flat).view(shape)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x [..., D]`` rotated pairwise by the angles whose ``cos``/``sin`` broadcast to it (HF's convention:
    dimension ``i`` pairs with ``i + D/2``)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin
