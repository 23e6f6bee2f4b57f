"""A :class:`~spec_fast.lean.model.LeanLlama` read straight from a Llama-architecture GGUF file.

transformers' GGUF path builds a full HF model first (de-quantising every tensor into it) and the lean
forward then copies that model. :func:`lean_from_gguf` skips the HF model: it reads the file with the
``gguf`` package, de-quantises each tensor with the same ``gguf.dequantize`` transformers uses, undoes
llama.cpp's row permutation of the query and key projections (the converter interleaves the two halves of
each head's rotary dimensions), and hands :meth:`LeanLlama.from_hf` a stand-in with HF's attribute layout,
so the lean model is built by exactly the code that builds it from an HF model. Only the configuration is
an HF object (``LlamaConfig``: the lean forward reads its fields, and the engine reads
``max_position_embeddings``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from spec_fast.lean.model import LeanLlama

__all__ = ["lean_from_gguf", "read_gguf_llama", "gguf_llama_config", "unpermute_rotary_rows"]


def _field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None or not field.data:
        return None
    value = field.parts[field.data[0]]
    if field.types and field.types[0].name == "STRING":
        return bytes(value).decode("utf-8")
    return value.tolist()[0]


def gguf_llama_config(reader: Any) -> Any:
    """The ``LlamaConfig`` of an open ``gguf.GGUFReader`` over a ``general.architecture = llama`` file."""
    from transformers import LlamaConfig

    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"lean_from_gguf reads Llama-architecture GGUF files, got general.architecture={arch!r}")
    names = {t.name for t in reader.tensors}
    hidden = int(_field(reader, "llama.embedding_length"))
    heads = int(_field(reader, "llama.attention.head_count"))
    vocab = _field(reader, "llama.vocab_size")
    if vocab is None:  # older converters leave it out; the embedding's row count is the vocabulary
        vocab = next(int(t.shape[-1]) for t in reader.tensors if t.name == "token_embd.weight")
    rope_dim = _field(reader, "llama.rope.dimension_count")
    if rope_dim is not None and int(rope_dim) != hidden // heads:
        raise ValueError(f"partial rotary embeddings are not supported: llama.rope.dimension_count={rope_dim}")
    if _field(reader, "llama.rope.scaling.type") not in (None, "none"):
        raise ValueError("RoPE scaling in a GGUF file is not supported by lean_from_gguf")
    return LlamaConfig(
        vocab_size=int(vocab), hidden_size=hidden,
        intermediate_size=int(_field(reader, "llama.feed_forward_length")),
        num_hidden_layers=int(_field(reader, "llama.block_count")), num_attention_heads=heads,
        num_key_value_heads=int(_field(reader, "llama.attention.head_count_kv") or heads),
        max_position_embeddings=int(_field(reader, "llama.context_length")),
        rms_norm_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        rope_parameters={"rope_type": "default",
                         "rope_theta": float(_field(reader, "llama.rope.freq_base") or 10000.0)},
        tie_word_embeddings="output.weight" not in names, hidden_act="silu",
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


def _linear(weight: torch.Tensor) -> SimpleNamespace:
    return SimpleNamespace(weight=weight, bias=None)


@torch.no_grad()
def lean_from_gguf(path: str, weights: str = "float32", head_weights: str | None = None) -> LeanLlama:
    """The :class:`LeanLlama` of the Llama-architecture GGUF file ``path`` (weights de-quantised to float32,
    then stored as ``weights``; ``head_weights`` as in :meth:`LeanLlama.from_hf`)."""
    return LeanLlama.from_hf(read_gguf_llama(path), weights, head_weights)


def read_gguf_llama(path: str) -> Any:
    """The de-quantised float32 tensors of a Llama GGUF file in HF's attribute layout (``config``,
    ``model.embed_tokens.weight``, ``model.layers[i].self_attn.q_proj.weight``, ..., ``lm_head.weight``,
    ``get_output_embeddings()``): what :meth:`LeanLlama.from_hf` reads."""
    from gguf import GGUFReader, dequantize

    if not os.path.isfile(path):
        raise ValueError(f"GGUF file not found: path={path!r}")
    reader = GGUFReader(path)
    config = gguf_llama_config(reader)
    heads, kv_heads = int(config.num_attention_heads), int(config.num_key_value_heads)
    tensors: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        array = dequantize(tensor.data, tensor.tensor_type)
        if ".attn_q." in tensor.name:
            array = unpermute_rotary_rows(array, heads)
        elif ".attn_k." in tensor.name:
            array = unpermute_rotary_rows(array, kv_heads)
        tensors[tensor.name] = torch.from_numpy(np.copy(array)).float()

    def take(name: str) -> torch.Tensor:
        if name not in tensors:
            raise ValueError(f"GGUF file {path!r} has no tensor {name!r}")
        return tensors[name]

    eps = float(config.rms_norm_eps)
    layers = []
    for i in range(int(config.num_hidden_layers)):
        prefix = f"blk.{i}."
        layers.append(SimpleNamespace(
            self_attn=SimpleNamespace(q_proj=_linear(take(prefix + "attn_q.weight")),
                                      k_proj=_linear(take(prefix + "attn_k.weight")),
                                      v_proj=_linear(take(prefix + "attn_v.weight")),
                                      o_proj=_linear(take(prefix + "attn_output.weight"))),
            mlp=SimpleNamespace(gate_proj=_linear(take(prefix + "ffn_gate.weight")),
                                up_proj=_linear(take(prefix + "ffn_up.weight")),
                                down_proj=_linear(take(prefix + "ffn_down.weight"))),
            input_layernorm=SimpleNamespace(weight=take(prefix + "attn_norm.weight"), variance_epsilon=eps),
            post_attention_layernorm=SimpleNamespace(weight=take(prefix + "ffn_norm.weight"), variance_epsilon=eps),
        ))
    embed = SimpleNamespace(weight=take("token_embd.weight"))
    body = SimpleNamespace(embed_tokens=embed, layers=layers,
                           norm=SimpleNamespace(weight=take("output_norm.weight"), variance_epsilon=eps),
                           rotary_emb=SimpleNamespace(inv_freq=_rope_inv_freq(config), attention_scaling=1.0))
    head = embed if config.tie_word_embeddings else _linear(take("output.weight"))
    return _Stand(config=config, model=body, lm_head=head, generation_config=None)
