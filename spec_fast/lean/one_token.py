"""The lean model's pass over one new token per row behind an unpadded cache, with little Python around it.

A plain decoding step (:meth:`spec_fast.kv_cache.TreeKVCache.forward_committed`) runs the model on the roots
at one position, the cache's length, attending to every cached entry. :meth:`LeanLlama.forward
<spec_fast.lean.model.LeanLlama.forward>` serves that pass too, but reaches it through the module calls,
the position and mask handling of a tree pass and the head's generic product: about fifteen Python calls
and small tensor operations that cost 0.1-0.2 ms per step on one CPU thread after the weights streamed
through the caches. :func:`one_token_logits` computes the same logits (the same embedding rows, rotary
rows, native layer stack with the final norm, and head product: the same bits) for the case it covers.
"""

from __future__ import annotations

from typing import Any

import torch

from spec_fast.lean import native

__all__ = ["one_token_logits"]


def one_token_logits(model: Any, input_ids: torch.Tensor, position: int, cache: Any) -> torch.Tensor | None:
    """``model``'s logits ``[B, 1, V]`` for ``input_ids [B, 1]`` at ``position`` behind ``cache``'s
    ``position`` entries per row, every entry attended (the new ones appended to ``cache``), or None, with
    nothing done, where the one native call cannot serve the pass (not every layer native, not on the CPU,
    the cache not ``position`` entries long): the caller then runs ``model.forward``."""
    body = model.model
    layers: list[Any] = list(body.layers)
    embedding = body.embed_tokens.weight
    if (not layers or input_ids.device.type != "cpu" or embedding.device.type != "cpu"
            or embedding.dtype != torch.float32 or cache.get_seq_length() != position
            or position >= int(body.rotary.cos.shape[0])):
        return None
    batch = int(input_ids.shape[0])
    x = embedding.index_select(0, input_ids.view(-1)).view(batch, 1, -1)
    stack = cache.native_stack(layers, x, None)
    if stack is None:
        return None
    cos, sin = body.rotary.cos[position], body.rotary.sin[position]  # [D]: every row's position
    if batch > 1:
        cos, sin = cos.expand(batch, -1).contiguous(), sin.expand(batch, -1).contiguous()
    normed = native.run_layers(stack, x, cos, sin, None, position, norm=(body.norm.weight, body.norm.eps))
    assert normed is not None
    for layer_cache in cache.layers:
        layer_cache.key_length = layer_cache.value_length = position + 1
    logits: torch.Tensor = model.lm_head(normed)
    return logits
