"""The batched, flattened draft tree that the kernels verify and the engine builds.

Layout (``B`` rows, ``N`` node slots, ``K`` = the most draws any node makes):

* ``tokens  [B, N]`` long: token of node i; the root (slot 0) holds the *root token* slot value ``-1``;
  padding slots hold ``-1``.
* ``parents [B, N]`` long: parent slot of node i, ``-1`` for the root and for padding. Ancestors first:
  ``parents[b, i] < i``.
* ``depths  [B, N]`` long: depth of node i (root 0, padding ``-1``).
* ``draws   [B, N, K]`` long: the ordered draws made at node i (draw order, with multiplicity), ``-1``
  padded. Every distinct draw has exactly one child slot with that token (children merged by token).
* ``valid   [B, N]`` bool: real nodes.
* ``process``: ``"iid" | "deterministic" | "without_replacement"`` as in :class:`spec_ref.DraftTree`.

Probabilities travel beside the tree as ``target_probs [B, N, V]`` (p at each node, already processed by
G) and ``draft_probs [B, N, V]`` (q each node's draws were *actually* sampled from).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["FlatTree"]


@dataclass(frozen=True, eq=False)
class FlatTree:
    tokens: torch.Tensor  # [B, N] long
    parents: torch.Tensor  # [B, N] long
    depths: torch.Tensor  # [B, N] long
    draws: torch.Tensor  # [B, N, K] long
    valid: torch.Tensor  # [B, N] bool
    process: str = "iid"

    @property
    def batch_size(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def num_slots(self) -> int:
        return int(self.tokens.shape[1])

    @property
    def max_draws(self) -> int:
        return int(self.draws.shape[2])

    def to(self, device: torch.device | str) -> FlatTree:
        return FlatTree(
            self.tokens.to(device),
            self.parents.to(device),
            self.depths.to(device),
            self.draws.to(device),
            self.valid.to(device),
            self.process,
        )
