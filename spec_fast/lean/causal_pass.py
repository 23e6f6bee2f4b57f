"""The lean model's pass over new tokens that attend causally behind an unpadded cache, with little Python.

A plain decoding step (:meth:`spec_fast.kv_cache.TreeKVCache.forward_committed`) runs the model on the roots
at one position, the cache's length, attending to every cached entry; a greedy chain's verification pass
(:meth:`spec_fast.kv_cache.TreeKVCache.forward` with ``chain=True``) runs it on the root and the drafted path,
each token attending to every cached entry and the path above it. :meth:`LeanLlama.forward
<spec_fast.lean.model.LeanLlama.forward>` serves these passes too, but reaches them through the module calls,
the position and mask handling of a tree pass and the head's generic product: about fifteen Python calls
and small tensor operations that cost 0.1-0.2 ms per step on one CPU thread after the weights streamed
through the caches. :func:`causal_logits` computes the same logits (the same embedding rows, rotary rows,
native layer stack with the final norm, and head product: the same bits) for the case it covers, with a head
of GGUF blocks in the same native call as the layers, together with each token's argmax, which is all a
greedy verification reads of the logits; the final normed states, which a trained draft head reads, come
with them.
"""

from __future__ import annotations

from typing import Any

import torch

from spec_fast.lean import native

__all__ = ["causal_logits"]


def causal_logits(model: Any, input_ids: torch.Tensor, position: int, cache: Any
                  ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor] | None:
    """``(logits [B, Q, V], first maxima [B, Q] or None, the final normed hidden states [B, Q, H])`` of
    ``model`` for ``input_ids [B, Q]`` at positions ``position .. position + Q - 1`` behind ``cache``'s
    ``position`` entries per row, token j attending to every cached entry and to tokens 0..j (the new entries
    appended to ``cache``), or None, with nothing done, where the one native call cannot serve the pass (not
    every layer native, not on the CPU, the cache not ``position`` entries long, positions past the rotary
    table): the caller then runs ``model.forward``. With a head of GGUF blocks the same native call computes the
    logits and each token's index of its first maximum logit (``first_max_index``'s), else the head's product
    follows and the maxima are None."""
    body = model.model
    layers: list[Any] = list(body.layers)
    embedding = body.embed_tokens.weight
    batch, num_query = int(input_ids.shape[0]), int(input_ids.shape[1])
    if (not layers or num_query < 1 or input_ids.device.type != "cpu" or embedding.device.type != "cpu"
            or embedding.dtype != torch.float32 or cache.get_seq_length() != position
            or position + num_query > int(body.rotary.cos.shape[0])):
        return None
    x = embedding.index_select(0, input_ids.reshape(-1)).view(batch, num_query, -1)
    stack = cache.native_stack(layers, x, None)
    if stack is None:
        return None
    # every row's positions are the same: [Q, D] rows of the tables, copied per row only where B > 1
    cos, sin = body.rotary.cos[position:position + num_query], body.rotary.sin[position:position + num_query]
    if batch > 1:
        cos = cos.unsqueeze(0).expand(batch, -1, -1).contiguous()
        sin = sin.unsqueeze(0).expand(batch, -1, -1).contiguous()
    head = model.lm_head
    if head.packed is not None and head.kind in native.BLOCK_KINDS and head.bias is None:
        logits, first_max, normed = _layers_and_head(stack, x, cos, sin, position, body.norm, head)
    else:
        final = native.run_layers(stack, x, cos, sin, None, position, norm=(body.norm.weight, body.norm.eps))
        assert final is not None
        normed, logits, first_max = final, head(final), None
    for layer_cache in cache.layers:
        layer_cache.key_length = layer_cache.value_length = position + num_query
    return logits, first_max, normed


def _layers_and_head(stack: native.LayerStack, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, past: int,
                     norm: Any, head: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``native.run_layers(stack, x [B, Q, H], cos, sin, None, past, norm=(norm.weight, norm.eps))`` and then
    ``head``'s product and the first maxima, in one native call (``spec_fast_layers_head``): ``(logits [B, Q,
    V], [B, Q], the normed states [B, Q, H])``, every argument checked as those calls check theirs."""
    lib = native._library()
    assert lib is not None
    arguments, normed = native.layers_arguments(stack, x, cos, sin, None, past, (norm.weight, norm.eps))
    packed, vocab, hidden = head.packed, int(head.out_features), int(x.shape[-1])
    native._check("packed", packed, torch.uint8, 3, contiguous=True, shape=(None, None, native.group_bytes(head.kind)))
    native._check_out_features(packed, vocab)
    if int(packed.shape[1]) * native.GROUP != hidden:
        raise ValueError(f"the head's blocks {tuple(packed.shape)} take {int(packed.shape[1]) * native.GROUP} "
                         f"inputs, the layers give {hidden}")
    batch, num_query = int(x.shape[0]), int(x.shape[1])
    logits = torch.empty(batch, num_query, vocab, dtype=torch.float32)
    first_max = torch.empty(batch, num_query, dtype=torch.int64)
    assert normed is not None
    status = lib.spec_fast_layers_head(*arguments, native.BLOCK_KINDS[head.kind], packed.data_ptr(), vocab,
                                       logits.data_ptr(), first_max.data_ptr())
    if status != 0:
        raise MemoryError("the native decoder layers or head could not allocate their scratch memory")
    return logits, first_max, normed
