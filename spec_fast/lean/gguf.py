"""A :class:`~spec_fast.lean.model.LeanLlama` read straight from a Llama-architecture GGUF file.

transformers' GGUF path builds a full HF model first (de-quantising every tensor into it) and the lean
forward then copies that model. :func:`lean_from_gguf` skips the HF model: it reads the file's tensor table
(:mod:`spec_fast.lean.gguf_file`), de-quantises each tensor with the same ``gguf.dequantize`` transformers uses, undoes
llama.cpp's row permutation of the query and key projections (the converter interleaves the two halves of
each head's rotary dimensions), and hands :meth:`LeanLlama.from_hf` a stand-in with HF's attribute layout,
so the lean model is built by exactly the code that builds it from an HF model. The configuration carries
``LlamaConfig``'s attribute names (the lean forward reads its fields, and the engine reads
``max_position_embeddings``) without importing transformers.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from spec_fast.lean.gguf_file import GGUFFile, read_gguf_file
from spec_fast.lean.huge_pages import huge_page_copies
from spec_fast.lean.model import LeanLlama
from spec_fast.lean.quant import LeanLinear

__all__ = ["BlockWeight", "lean_from_gguf", "read_gguf_llama", "gguf_llama_config", "unpermute_rotary_rows"]

#: GGUF tensor types whose blocks the native kernels multiply as stored (spec_fast.lean.native.BLOCK_KINDS)
_BLOCK_TYPES = {"Q4_1": "q4_1", "Q8_0": "q8_0"}


@dataclass(frozen=True)
class BlockWeight:
    """A GGUF block-quantised weight as stored: ``w[n, k] = scales[n, k // 32] * values[n, k] + offsets[n, k //
    32]`` (``kind`` ``"q4_1"``: values uint8 in 0..15 with offsets; ``"q8_0"``: values int8, no offsets)."""

    kind: str
    values: torch.Tensor
    scales: torch.Tensor
    offsets: torch.Tensor | None

    def rows(self, order: np.ndarray) -> BlockWeight:
        """The same weight with its output rows in ``order``."""
        index = torch.from_numpy(order)
        return BlockWeight(self.kind, self.values[index], self.scales[index],
                           None if self.offsets is None else self.offsets[index])


def read_blocks(data: np.ndarray, type_name: str) -> BlockWeight:
    """The blocks of a GGUF ``Q4_1`` or ``Q8_0`` tensor (``data``: its raw bytes ``[rows, bytes per row]``).

    Q4_1 blocks are 20 bytes per 32 values (fp16 d, fp16 m, 16 bytes: value j in the low nibble of byte j,
    value j + 16 in its high nibble); Q8_0 blocks 34 bytes (fp16 d, 32 int8 values)."""
    kind = _BLOCK_TYPES[type_name]
    rows = int(data.shape[0])
    raw = np.ascontiguousarray(data).reshape(rows, -1, 20 if kind == "q4_1" else 34)
    scales = raw[:, :, 0:2].copy().view(np.float16)[:, :, 0].astype(np.float32)
    if kind == "q4_1":
        offsets = torch.from_numpy(raw[:, :, 2:4].copy().view(np.float16)[:, :, 0].astype(np.float32))
        packed = raw[:, :, 4:]
        values = np.concatenate([packed & 15, packed >> 4], axis=2).reshape(rows, -1)
        return BlockWeight(kind, torch.from_numpy(values), torch.from_numpy(scales), offsets)
    values = raw[:, :, 2:].copy().view(np.int8).reshape(rows, -1)
    return BlockWeight(kind, torch.from_numpy(values), torch.from_numpy(scales), None)


def gguf_llama_config(gguf: GGUFFile) -> SimpleNamespace:
    """The configuration of a ``general.architecture = llama`` file in the attribute names of transformers'
    ``LlamaConfig`` (what :meth:`LeanLlama.from_hf` and the engine read; no transformers import)."""
    fields = gguf.fields
    arch = fields.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"lean_from_gguf reads Llama-architecture GGUF files, got general.architecture={arch!r}")
    names = {t.name for t in gguf.tensors}
    hidden = int(fields["llama.embedding_length"])
    heads = int(fields["llama.attention.head_count"])
    vocab = fields.get("llama.vocab_size")
    if vocab is None:  # older converters leave it out; the embedding's row count is the vocabulary
        vocab = next(int(t.shape[-1]) for t in gguf.tensors if t.name == "token_embd.weight")
    rope_dim = fields.get("llama.rope.dimension_count")
    if rope_dim is not None and int(rope_dim) != hidden // heads:
        raise ValueError(f"partial rotary embeddings are not supported: llama.rope.dimension_count={rope_dim}")
    if fields.get("llama.rope.scaling.type") not in (None, "none"):
        raise ValueError("RoPE scaling in a GGUF file is not supported by lean_from_gguf")
    return SimpleNamespace(
        model_type="llama", vocab_size=int(vocab), hidden_size=hidden,
        intermediate_size=int(fields["llama.feed_forward_length"]),
        num_hidden_layers=int(fields["llama.block_count"]), num_attention_heads=heads,
        num_key_value_heads=int(fields.get("llama.attention.head_count_kv") or heads), head_dim=hidden // heads,
        max_position_embeddings=int(fields["llama.context_length"]),
        rms_norm_eps=float(fields["llama.attention.layer_norm_rms_epsilon"]),
        rope_parameters={"rope_type": "default", "rope_theta": float(fields.get("llama.rope.freq_base") or 10000.0)},
        tie_word_embeddings="output.weight" not in names, hidden_act="silu", attention_bias=False, mlp_bias=False,
    )


def unpermute_rotary_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's converter permutation of a query/key weight ``[heads * head_dim, in]``: per head, rows
    ``(pair, half)`` back to ``(half, pair)``."""
    half = weight.shape[0] // heads // 2
    return weight.reshape(heads, half, 2, *weight.shape[1:]).swapaxes(2, 1).reshape(weight.shape)


def _rope_inv_freq(config: Any) -> torch.Tensor:
    """Default RoPE inverse frequencies, computed as transformers computes them (same float32 ops)."""
    params = getattr(config, "rope_parameters", None) or {}
    base = float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
    dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))


class _Stand(SimpleNamespace):
    """HF's attribute layout over plain tensors (what :meth:`LeanLlama.from_hf` reads)."""

    def get_output_embeddings(self) -> Any:
        return self.lm_head

    def parameters(self) -> Iterator[torch.Tensor]:
        yield self.model.embed_tokens.weight


def _linear(weight: torch.Tensor | None, blocks: BlockWeight | None = None) -> SimpleNamespace:
    return SimpleNamespace(weight=weight, bias=None, blocks=blocks)


@torch.no_grad()
def lean_from_gguf(path: str, weights: str = "float32", head_weights: str | None = None) -> LeanLlama:
    """The :class:`LeanLlama` of the Llama-architecture GGUF file ``path``: weights de-quantised to float32,
    then stored as ``weights`` (``head_weights`` as in :meth:`LeanLlama.from_hf`); ``weights="gguf"`` keeps
    the file's Q4_1 and Q8_0 blocks as they are (:meth:`LeanLinear.from_blocks`) and de-quantises the rest."""
    model = LeanLlama.from_hf(read_gguf_llama(path, keep_blocks=weights == "gguf"), weights, head_weights)
    if weights == "gguf":
        # every pass streams all packed weights once: one buffer on huge pages (huge_page_copies)
        packed = [(m, m.packed) for m in model.modules() if isinstance(m, LeanLinear) and m.packed is not None]
        for (layer, _), copy in zip(packed, huge_page_copies([t for _, t in packed if t is not None])):
            layer.packed = copy
    return model


def read_gguf_llama(path: str, keep_blocks: bool = False) -> Any:
    """The tensors of a Llama GGUF file in HF's attribute layout (``config``, ``model.embed_tokens.weight``,
    ``model.layers[i].self_attn.q_proj.weight``, ..., ``lm_head.weight``, ``get_output_embeddings()``): what
    :meth:`LeanLlama.from_hf` reads, de-quantised to float32. With ``keep_blocks`` each linear layer stored
    as Q4_1 or Q8_0 also carries its :class:`BlockWeight` (``.blocks``) and no de-quantised weight (the
    embedding is de-quantised anyway: lookups read it)."""
    from gguf import GGMLQuantizationType, dequantize

    if not os.path.isfile(path):
        raise ValueError(f"GGUF file not found: path={path!r}")
    gguf = read_gguf_file(path)
    config = gguf_llama_config(gguf)
    heads, kv_heads = int(config.num_attention_heads), int(config.num_key_value_heads)
    tensors: dict[str, torch.Tensor] = {}
    blocks: dict[str, BlockWeight] = {}
    for tensor in gguf.tensors:
        heads_of = heads if ".attn_q." in tensor.name else kv_heads if ".attn_k." in tensor.name else 0
        if keep_blocks and tensor.type_name in _BLOCK_TYPES:
            block = read_blocks(np.asarray(tensor.data), tensor.type_name)
            if heads_of:
                block = block.rows(unpermute_rotary_rows(np.arange(int(tensor.data.shape[0])), heads_of))
            blocks[tensor.name] = block
            if tensor.name != "token_embd.weight":
                continue
        array = dequantize(tensor.data, GGMLQuantizationType(tensor.type_id))
        if heads_of:
            array = unpermute_rotary_rows(array, heads_of)
        tensors[tensor.name] = torch.from_numpy(np.copy(array)).float()

    def take(name: str) -> torch.Tensor:
        if name not in tensors:
            raise ValueError(f"GGUF file {path!r} has no tensor {name!r}")
        return tensors[name]

    def linear(name: str) -> SimpleNamespace:
        if name in blocks:
            return _linear(None, blocks[name])
        return _linear(take(name))

    eps = float(config.rms_norm_eps)
    layers = []
    for i in range(int(config.num_hidden_layers)):
        prefix = f"blk.{i}."
        layers.append(SimpleNamespace(
            self_attn=SimpleNamespace(q_proj=linear(prefix + "attn_q.weight"),
                                      k_proj=linear(prefix + "attn_k.weight"),
                                      v_proj=linear(prefix + "attn_v.weight"),
                                      o_proj=linear(prefix + "attn_output.weight")),
            mlp=SimpleNamespace(gate_proj=linear(prefix + "ffn_gate.weight"),
                                up_proj=linear(prefix + "ffn_up.weight"),
                                down_proj=linear(prefix + "ffn_down.weight")),
            input_layernorm=SimpleNamespace(weight=take(prefix + "attn_norm.weight"), variance_epsilon=eps),
            post_attention_layernorm=SimpleNamespace(weight=take(prefix + "ffn_norm.weight"), variance_epsilon=eps),
        ))
    embed = SimpleNamespace(weight=take("token_embd.weight"), blocks=blocks.get("token_embd.weight"))
    body = SimpleNamespace(embed_tokens=embed, layers=layers,
                           norm=SimpleNamespace(weight=take("output_norm.weight"), variance_epsilon=eps),
                           rotary_emb=SimpleNamespace(inv_freq=_rope_inv_freq(config), attention_scaling=1.0))
    head = embed if config.tie_word_embeddings else linear("output.weight")
    return _Stand(config=config, model=body, lm_head=head, generation_config=None)
