"""The LM head of a trained draft: the target's LM head restricted to a vocabulary subset (module docstring of
:mod:`spec_fast.drafts.heads`), on the native kernels at run time."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["SubsetHead"]


class SubsetHead(nn.Module):
    """The target's LM head restricted to the vocabulary subset ``vocab_ids [S]`` (frozen, shared).

    ``forward(hidden [..., H]) -> logits [..., V]`` with ``-inf`` outside the subset;
    :meth:`subset_logits` gives the ``[..., S]`` scores (training). After :meth:`use_native` (the runtime
    drafts of :func:`load_drafter`) a gradient-free float32 CPU forward multiplies by a native kernel: where
    the target's LM head is GGUF Q8_0 blocks (the default model's embedding), by the subset's rows of those
    blocks (:func:`spec_fast.lean.block_layout.select_outputs`: the target's own weights, 1.06 bytes a weight,
    with activations rounded as the target's LM head rounds them), else by the float32 kernel
    (:func:`spec_fast.lean.native.mm_float32`). Torch's matrix-vector product read this ``[8192, 576]``
    weight at about a third of the float32 kernel's speed, and a draft pass is mostly this product.
    """

    def __init__(self, lm_head: nn.Module, vocab_ids: torch.Tensor) -> None:
        super().__init__()
        weight: torch.Tensor = lm_head.weight  # type: ignore[assignment]  # [V, H], shared with the target
        self.weight = weight
        self.vocab_size = int(weight.shape[0])
        ids = vocab_ids.to(torch.long)
        self.vocab_ids: torch.Tensor
        self.sub_weight: torch.Tensor
        self.register_buffer("vocab_ids", ids, persistent=False)
        self.register_buffer("sub_weight", weight.detach().index_select(0, ids).clone(), persistent=False)
        #: ``sub_weight`` packed for the native kernel (:meth:`use_native`), else None
        self.packed: torch.Tensor | None = None
        #: the kind of :attr:`packed`: ``"float32"`` or ``"q8_0"`` (the target's blocks)
        self.packed_kind = "float32"
        self._lm_head = [lm_head]  # kept out of the module tree (shared, frozen)

    def use_native(self, enabled: bool, target_lm_head: nn.Module | None = None) -> None:
        """Multiply by a native kernel where it can (class docstring); a no-op without one. ``target_lm_head``:
        the running target's LM head (a lean model's GGUF blocks) when this head was built from an HF copy
        of it; its blocks are used only where they hold exactly this head's weights."""
        from spec_fast.lean import native

        usable = enabled and native.available() and self.sub_weight.device.type == "cpu"
        self.packed, self.packed_kind = None, "float32"
        if not usable:
            return
        subset = int(self.vocab_ids.shape[0])
        for source in (target_lm_head, self._lm_head[0]):
            blocks = getattr(source, "packed", None) if getattr(source, "kind", None) == "q8_0" else None
            if blocks is None or int(getattr(source, "out_features", -1)) != self.vocab_size:
                continue
            picked = native.select_outputs(blocks, self.vocab_ids.cpu())
            if torch.equal(native.unpack_blocks("q8_0", picked, subset), self.sub_weight.float()):
                self.packed, self.packed_kind = picked, "q8_0"
                return
        self.packed = native.pack_float32(self.sub_weight)

    def subset_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [..., H]`` -> ``[..., S]`` scores of the subset tokens."""
        return nn.functional.linear(hidden, self.sub_weight.to(hidden.dtype))

    def scores(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [..., H]`` -> ``[..., S]`` scores of the subset tokens, by the native kernel where
        :meth:`use_native` packed one (float32 on the CPU, no gradient wanted), else as :meth:`subset_logits`."""
        if (self.packed is not None and hidden.device.type == "cpu" and hidden.dtype == torch.float32
                and not (torch.is_grad_enabled() and hidden.requires_grad)):
            from spec_fast.lean import native

            rows, subset = hidden.reshape(-1, hidden.shape[-1]), int(self.vocab_ids.shape[0])
            flat = (native.mm_blocks("q8_0", rows, self.packed, subset) if self.packed_kind == "q8_0"
                    else native.mm_float32(rows, self.packed, subset))
            return flat.reshape(*hidden.shape[:-1], flat.shape[-1])
        return self.subset_logits(hidden)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [..., H]`` -> ``[..., V]`` logits, ``-inf`` outside the subset."""
        return self.dense(self.scores(hidden))

    def dense(self, scores: torch.Tensor) -> torch.Tensor:
        """Subset ``scores [..., S]`` -> ``[..., V]`` logits, ``-inf`` outside the subset."""
        out = scores.new_full((*scores.shape[:-1], self.vocab_size), float("-inf"))
        out[..., self.vocab_ids] = scores
        return out
