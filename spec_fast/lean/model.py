"""LeanLlama: a small Llama-family forward (Llama, SmolLM2, Qwen2-style q/k/v biases) built from HF weights.

It replaces HF's model at the engine's model-call level: ``model(input_ids=, attention_mask=, position_ids=,
past_key_values=, output_hidden_states=, logits_to_keep=)`` returns ``.logits [B, Q, V]`` and ``.hidden_states``
(HF's: the embeddings, every layer's output, the last after the final norm; that last alone with
``final_hidden_state_only``); :class:`~spec_fast.kv_cache.TreeKVCache` asks it for its cache (a
:class:`~spec_fast.lean.cache.LeanKVCache`). Positions are explicit and the attention mask is the engine's.

One decoder layer: RMSNorm -> one fused q/k/v product -> RoPE (the HF model's own inverse frequencies and
attention scaling, tabulated once) -> grouped-query attention over the cache without repeating keys -> output
product -> residual; RMSNorm -> one fused gate/up product -> SiLU(gate) * up -> down product -> residual.
Activations stay float32; only the weights change with ``weights`` (:mod:`spec_fast.lean.quant`). With the
native kernels (:mod:`spec_fast.lean.native`) every layer and the final norm run in one C call. The module
layout (``model.embed_tokens``, ``model.layers``, ``model.norm``, ``lm_head``) is HF's, so
:func:`spec_fast.drafts.model.early_exit_model` builds an early-exit draft from a LeanLlama unchanged."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from spec_fast.lean.cache import LeanKVCache, LeanLayerCache
from spec_fast.lean import native, row_ops
from spec_fast.lean.causal_pass import causal_logits
from spec_fast.lean.rotary import RotaryTable, rotate
from spec_fast.lean.quant import KINDS, LeanLinear, column_major, hf_linears, stacked_linear
from spec_fast.lean.watch import WatchedModule

__all__ = ["LeanLlama", "LeanOutput", "MODEL_WEIGHTS", "SUPPORTED_MODEL_TYPES", "supports"]

#: the ``weights`` of :meth:`LeanLlama.from_hf`: a kind of every layer, or ``"gguf"`` (a GGUF file's blocks as
#: stored, read by :func:`spec_fast.lean.gguf.read_gguf_llama` with ``keep_blocks=True``)
MODEL_WEIGHTS = (*KINDS, "gguf")

#: HF ``config.model_type`` values whose decoder LeanLlama reproduces
SUPPORTED_MODEL_TYPES = ("llama", "qwen2")


@dataclass
class LeanOutput:
    """What the engine reads from a model call (the names of HF's ``CausalLMOutputWithPast``)."""

    logits: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None
    past_key_values: LeanKVCache
    #: ``[B, Q]``: each new entry's index of its first maximum logit, where the pass computed it with the
    #: logits (:meth:`LeanLlama.forward_step`), else None
    first_max: torch.Tensor | None = None


def supports(model: Any) -> str | None:
    """None if ``model`` (an HF causal LM) can become a LeanLlama, else the reason why not."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"the lean forward covers model types {SUPPORTED_MODEL_TYPES}, got {model_type!r}"
    hidden_act = getattr(config, "hidden_act", "silu")
    if hidden_act != "silu":
        return f"the lean forward needs hidden_act='silu', got {hidden_act!r}"
    if getattr(config, "mlp_bias", False):
        return "the lean forward has no MLP biases (mlp_bias=True)"
    if model_type == "qwen2" and getattr(config, "use_sliding_window", False):
        return "the lean forward has no sliding-window attention (use_sliding_window=True)"
    rope_type = _rope_parameters(config).get("rope_type", "default")
    if rope_type == "dynamic":
        return "the lean forward tabulates RoPE once; dynamic RoPE scaling changes it with the length"
    return None


def _rope_parameters(config: Any) -> dict[str, Any]:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return dict(params)


class RMSNorm(WatchedModule):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., H]`` -> ``[..., H]`` (HF's order of operations: normalise in float32, then scale)."""
        return nn.functional.rms_norm(x, (int(x.shape[-1]),), self.weight, self.eps)


class Attention(WatchedModule):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, qkv_bias: bool, out_bias: bool) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.qkv_proj = LeanLinear(hidden, (heads + 2 * kv_heads) * head_dim, bias=qkv_bias)
        self.o_proj = LeanLinear(heads * head_dim, hidden, bias=out_bias)
        #: float64 for quantised or bfloat16 weights and for native products outside the native layer (see
        #: :class:`LeanLlama`), float32 otherwise
        self.attention_dtype = torch.float32
        #: the dtype the cache stores keys and values in (None: the attention dtype); see
        #: :meth:`LeanLlama.set_kv_cache_dtype`
        self.kv_cache_dtype: torch.dtype | None = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
                cache: LeanLayerCache) -> torch.Tensor:
        """``x [B, Q, H]``, ``mask [B, 1, Q, K]`` additive (or None: every cached entry) -> ``[B, Q, H]``."""
        batch, num_query, _ = x.shape
        dim, group = self.head_dim, self.heads // self.kv_heads
        qkv = self.qkv_proj(x).view(batch, num_query, self.heads + 2 * self.kv_heads, dim).transpose(1, 2)
        rotated = rotate(qkv[:, : self.heads + self.kv_heads], cos, sin)  # queries and keys in one go
        wide = self.attention_dtype
        stored = self.kv_cache_dtype or wide  # rounded once when stored, as the native layer does
        keys, values = cache.append(rotated[:, self.heads :].to(stored),
                                    qkv[:, self.heads + self.kv_heads :].to(stored))
        keys, values = keys.to(wide), values.to(wide)
        # grouped-query attention without repeating keys (SDPA's enable_gqa), HF's 1/sqrt(D) scaling
        out = nn.functional.scaled_dot_product_attention(
            rotated[:, : self.heads].to(wide), keys, values, attn_mask=None if mask is None else mask.to(wide),
            enable_gqa=group > 1).float()
        projected: torch.Tensor = self.o_proj(out.transpose(1, 2).reshape(batch, num_query, self.heads * dim))
        return projected


class MLP(WatchedModule):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.intermediate = intermediate
        self.gate_up_proj = LeanLinear(hidden, 2 * intermediate)
        self.down_proj = LeanLinear(intermediate, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        out: torch.Tensor = self.down_proj(nn.functional.silu(gate) * up)
        return out


class DecoderLayer(WatchedModule):
    def __init__(self, config: Any) -> None:
        super().__init__()
        hidden, heads = int(config.hidden_size), int(config.num_attention_heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
        qkv_bias = config.model_type == "qwen2" or bool(getattr(config, "attention_bias", False))
        out_bias = config.model_type != "qwen2" and bool(getattr(config, "attention_bias", False))
        self.input_layernorm = RMSNorm(hidden, float(config.rms_norm_eps))
        self.self_attn = Attention(hidden, heads, kv_heads, head_dim, qkv_bias, out_bias)
        self.post_attention_layernorm = RMSNorm(hidden, float(config.rms_norm_eps))
        self.mlp = MLP(hidden, int(config.intermediate_size))
        #: run in one C call where the weights allow it (:meth:`native_weights`); see LeanLlama.use_native_layers
        self.native_layer = True

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
                cache: LeanLayerCache) -> torch.Tensor:
        """``x [B, Q, H]``, ``cos``/``sin [B, 1, Q, D]``, ``mask [B, 1, Q, K]`` additive or None -> ``[B, Q, H]``."""
        call = self.native_call(x, mask, cache)
        if call is not None:
            if mask is not None and (mask.dtype != torch.float32 or not mask.is_contiguous()):
                mask = mask.float().contiguous()
            weights, keys, values = call
            out = x.contiguous().clone()
            past = cache.key_length
            native.run_layer(weights, out, cos.contiguous(), sin.contiguous(), mask, past, keys, values)
            cache.key_length = cache.value_length = past + int(x.shape[1])
            return out
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache)
        out2: torch.Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return out2

    def __getstate__(self) -> dict[str, Any]:
        # copies and pickles leave out the native struct (raw pointers into this layer's tensors, which
        # ctypes cannot copy): a copy builds its own on its first pass
        state = dict(self.__dict__)
        state.pop("_native", None)
        return state

    def native_weights(self) -> native.LayerWeights | None:
        """The layer's weights for the one-call C layer (:func:`spec_fast.lean.native.run_layer`), or None
        where it cannot run: the kernel is not available, or a product is not a packed native one."""
        # the struct holds raw pointers: rebuilt whenever a tensor it points into was replaced. Checked on every
        # call, through the modules' own dictionaries (nn.Module attribute lookups would cost ~1 ms a pass)
        modules: Any = self._modules
        attn_modules, mlp_modules = modules["self_attn"]._modules, modules["mlp"]._modules
        qkv, o = attn_modules["qkv_proj"]._buffers, attn_modules["o_proj"]._buffers
        tensors = (qkv.get("packed"), o.get("packed"), mlp_modules["gate_up_proj"]._buffers.get("packed"),
                   mlp_modules["down_proj"]._buffers.get("packed"), qkv.get("bias"), o.get("bias"),
                   modules["input_layernorm"]._parameters["weight"],
                   modules["post_attention_layernorm"]._parameters["weight"])
        # ids and storage: a tensor given new storage under the same object (.data, .to()) gets a new struct
        key = tuple((id(t), None if t is None else t.data_ptr()) for t in tensors)
        cached = self.__dict__.get("_native")
        if cached is not None and cached[0] == key:
            weights: native.LayerWeights | None = cached[2]
            return weights
        attn, mlp = self.self_attn, self.mlp
        linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
        norms = (self.input_layernorm.weight, self.post_attention_layernorm.weight)
        weights = None
        usable = (native.available() and all(lin.packed is not None and lin.kind in native.LAYER_KINDS
                                             and lin.packed.device.type == "cpu" for lin in linears)
                  and attn.heads % attn.kv_heads == 0 and attn.head_dim % 2 == 0
                  and all(t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous() for t in norms)
                  and all(b is None or (b.dtype == torch.float32 and b.is_contiguous() and b.device.type == "cpu")
                          for b in (attn.qkv_proj.bias, attn.o_proj.bias)))
        if usable:
            def pointer(t: torch.Tensor | None) -> int | None:
                return None if t is None else int(t.data_ptr())

            weights = native.LayerWeights(
                int(attn.o_proj.out_features), attn.heads, attn.kv_heads, attn.head_dim, mlp.intermediate,
                *(native.LAYER_KINDS[lin.kind] for lin in linears), *(pointer(lin.packed) for lin in linears),
                pointer(attn.qkv_proj.bias), pointer(attn.o_proj.bias), pointer(norms[0]), pointer(norms[1]),
                float(self.input_layernorm.eps), float(self.post_attention_layernorm.eps))
        # the key, compared on every call, and the tensors themselves: held here, so that no other tensor can
        # take one of those ids while the struct points into them
        self.__dict__["_native"] = (key, tensors, weights)
        return weights

    def native_call(self, x: torch.Tensor, mask: torch.Tensor | None, cache: LeanLayerCache
                    ) -> tuple[native.LayerWeights, torch.Tensor, torch.Tensor] | None:
        """``(weights, keys, values)`` for one C call of the layer over ``x [B, Q, H]`` behind ``cache`` (its
        buffers grown to hold the new entries), or None where the layer cannot run natively: switched off,
        attention not in float32, inputs not float32 on the CPU, a mask not ``[B, 1, Q, past + Q]``, weights
        that are not all packed native ones, a cache dtype other than float32 or float16, or a cache that holds
        another layout."""
        batch, num_query = int(x.shape[0]), int(x.shape[1])
        attn = self.self_attn
        if (not self.native_layer or attn.attention_dtype != torch.float32 or x.device.type != "cpu"
                or x.dtype != torch.float32):
            return None
        past = cache.key_length
        if mask is not None and tuple(mask.shape) != (batch, 1, num_query, past + num_query):
            return None
        weights = self.native_weights()
        if weights is None:
            return None
        stored = attn.kv_cache_dtype or torch.float32
        if stored not in native.CACHE_DTYPES:
            return None
        buffers = cache.reserve(batch, attn.kv_heads, attn.head_dim, past + num_query, stored, x.device)
        return None if buffers is None else (weights, *buffers)


class LeanBody(WatchedModule):
    """Embeddings, decoder layers, final norm and the RoPE table (HF's ``model.model``)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        hidden = int(config.hidden_size)
        # an explicit (empty) weight skips nn.Embedding's random init, whose meta-device version imports
        # torch._dynamo (seconds of start-up); from_hf replaces the weight anyway
        self.embed_tokens = nn.Embedding(int(config.vocab_size), hidden,
                                         _weight=torch.empty(int(config.vocab_size), hidden), _freeze=True)
        self.layers: nn.ModuleList = nn.ModuleList([DecoderLayer(config) for _ in range(int(config.num_hidden_layers))])
        self.norm = RMSNorm(hidden, float(config.rms_norm_eps))
        heads = int(config.num_attention_heads)
        head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
        # a placeholder on the CPU (from_hf puts the model's table here): RoPE tables built on the meta
        # device go through torch's reference ops, whose first use imports torch._dynamo (seconds)
        self.rotary = RotaryTable(torch.zeros(head_dim // 2, device="cpu"), 1.0, 1)


class LeanLlama(WatchedModule):
    """A Llama-family causal LM for inference (see the module docstring); build it with :meth:`from_hf`.

    With bfloat16, int8 or int4 weights the linear layers round their inputs to bfloat16 and compute every
    row independently of the rest of the batch, but attention over a tree block sees other keys (masked
    ones included) than a plain step does, and float32 attention kernels round differently with the number
    of queries and keys. A last-bit difference there flips a bfloat16 rounding at the next layer's input,
    and then a near-tie argmax: measured on SmolLM2 int8, greedy speculative output left plain decoding's
    within 20-60 tokens on 4 of 6 prompts. Attention therefore runs in float64 for these formats (KV cache
    included): a float64 difference in the last bit survives the rounding to float32 only with probability
    about 1e-9 per value, so verification reproduces plain decoding's logits. Float32 and GGUF-block weights
    multiplied by the native kernels (:mod:`spec_fast.lean.native`, batch-invariant) run each decoder layer
    in one C call (``layer.c``) whose float32 attention sums every query's terms in a fixed order over the
    cache slots it attends: the whole forward gives a token bit for bit the same logits whatever shares its
    pass, at HF's precision (where a layer cannot run there, it attends in float64 as above). Float32
    weights on torch's products keep HF's float32 attention (those products are not batch-invariant anyway,
    as in HF).
    """

    returns_final_hidden_state = True  # forward takes final_hidden_state_only (TreeKVCache asks for it)
    causal_without_mask = True  # attention_mask=None attends causally (TreeKVCache then builds no chain mask)

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        self.model = LeanBody(config)
        self.lm_head = LeanLinear(int(config.hidden_size), int(config.vocab_size))
        self.generation_config: Any = None
        #: the weight format of the decoder layers (``KINDS``)
        self.weights = "float32"

    @classmethod
    @torch.no_grad()
    def from_hf(cls, model: Any, weights: str = "float32", head_weights: str | None = None) -> LeanLlama:
        """The lean twin of an HF Llama-family causal LM ``model`` (its weights copied or quantised).

        Args:
            model: an HF ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` (any floating dtype).
            weights: the decoder layers' weight format, one of ``KINDS``.
            head_weights: the LM head's format; default ``weights``, except int4 layers keep an int8
                head (the head is the single largest matrix and the most sensitive to 4-bit error).
        """
        if weights not in MODEL_WEIGHTS:
            raise ValueError(f"weights must be one of {MODEL_WEIGHTS}, got weights={weights!r}")
        reason = supports(model)
        if reason is not None:
            raise ValueError(reason)
        head_kind = head_weights or ("int8" if weights == "int4" else weights)
        if head_kind not in MODEL_WEIGHTS:
            raise ValueError(f"head_weights must be one of {MODEL_WEIGHTS}, got head_weights={head_weights!r}")
        if weights == "gguf" and not any(getattr(linear, "blocks", None) is not None
                                         for linear in hf_linears(model)):
            raise ValueError("weights='gguf' keeps a GGUF file's quantised blocks; this model holds none "
                             "(read it with spec_fast.lean.lean_from_gguf(path, 'gguf'))")
        config = copy.deepcopy(model.config)
        with torch.device("meta"):
            lean = cls(config)
        hf = model.model
        head = model.get_output_embeddings().weight
        tied = head is hf.embed_tokens.weight
        embed_weight = hf.embed_tokens.weight.detach().float()
        if tied and head_kind == "float32" and not (embed_weight.device.type == "cpu" and native.available()):
            # torch's product reads the head from the embedding itself: store it the way the head wants it
            # (with the native kernel the head packs its own copy and the embedding stays row-major)
            embed_weight = column_major(embed_weight)
        lean.model.embed_tokens = nn.Embedding(int(embed_weight.shape[0]), int(embed_weight.shape[1]),
                                               _weight=embed_weight, _freeze=True)
        rotary = hf.rotary_emb
        lean.model.rotary = RotaryTable(rotary.inv_freq, float(getattr(rotary, "attention_scaling", 1.0)),
                                        int(config.max_position_embeddings))
        lean.model.norm = _norm(hf.norm)
        for index, block in enumerate(hf.layers):
            layer: Any = lean.model.layers[index]
            attn = block.self_attn
            qkv_bias = None
            if attn.q_proj.bias is not None:
                qkv_bias = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias], dim=0)
            layer.self_attn.qkv_proj = stacked_linear([attn.q_proj, attn.k_proj, attn.v_proj], qkv_bias, weights)
            layer.self_attn.o_proj = stacked_linear([attn.o_proj], attn.o_proj.bias, weights)
            mlp = block.mlp
            layer.mlp.gate_up_proj = stacked_linear([mlp.gate_proj, mlp.up_proj], None, weights)
            layer.mlp.down_proj = stacked_linear([mlp.down_proj], None, weights)
            layer.input_layernorm = _norm(block.input_layernorm)
            layer.post_attention_layernorm = _norm(block.post_attention_layernorm)
        head_module = model.get_output_embeddings()
        if head_kind == "gguf" and getattr(head_module, "blocks", None) is not None:
            blocks = head_module.blocks
            lean.lm_head = LeanLinear.from_blocks(blocks.kind, blocks.values, blocks.scales, blocks.offsets)
            embedding = lean.model.embed_tokens.weight
            if tied and isinstance(embedding, nn.Parameter):
                # the engine and the drafters read the vocabulary size from the head's weight: the embedding
                # holds the same values, so that costs no de-quantisation of the head
                lean.lm_head.expose_weight(embedding)
        elif tied and head_kind in ("float32", "gguf"):
            lean.lm_head = LeanLinear.from_weight(lean.model.embed_tokens.weight, None, "float32")
        else:
            lean.lm_head = LeanLinear.from_weight(head.detach().float(), None, head_kind)
        lean.generation_config = copy.deepcopy(getattr(model, "generation_config", None))
        lean.weights = weights
        lean.use_native_layers(True)  # each layer's path, and so the dtype its attention needs
        for name, tensor in list(lean.named_parameters()) + list(lean.named_buffers()):
            if tensor.is_meta:
                raise ValueError(f"the lean model did not get {name} from the HF model")
        return lean.to(next(model.parameters()).device).eval()

    def use_native_layers(self, enabled: bool) -> None:
        """Run each decoder layer in one C call where its weights allow it (the default), or as torch
        operations around the native products with float64 attention (the batch-invariant Python path; for
        the benchmarks and tests that compare both). Call before decoding, not between the passes of a
        generation: the two paths keep their caches in different dtypes."""
        layers: list[Any] = list(self.model.layers)
        for layer in layers:
            layer.native_layer = bool(enabled)
            native_products = any(m.packed is not None for m in layer.modules() if isinstance(m, LeanLinear))
            # a layer that runs in one C call attends in a fixed order, batch-invariant in float32; the
            # Python layer needs float64 attention around batch-invariant (native or quantised) products
            fused = enabled and layer.native_weights() is not None
            if self.weights != "float32" or native_products:
                layer.self_attn.attention_dtype = torch.float32 if fused else torch.float64

    @property
    def kv_cache_dtype(self) -> torch.dtype:
        """The dtype the KV cache stores keys and values in (float32 unless :meth:`set_kv_cache_dtype` chose
        float16)."""
        layers: list[Any] = list(self.model.layers)
        return (layers[0].self_attn.kv_cache_dtype if layers else None) or torch.float32

    def set_kv_cache_dtype(self, dtype: torch.dtype) -> None:
        """Store the KV cache in ``dtype``: float32, or float16 (llama.cpp's default cache type: half the bytes
        that every attention step reads). A float16 entry is rounded to nearest-even once, when stored, and
        read back exactly, in the native layer and the Python one alike: a token's cache entries are the same
        whichever pass stored them, so greedy speculative output still equals plain decoding. Call before
        decoding (a cache already holding entries of the other dtype is not converted)."""
        if dtype not in native.CACHE_DTYPES:
            raise ValueError(f"dtype must be torch.float32 or torch.float16, got dtype={dtype!r}")
        layers: list[Any] = list(self.model.layers)
        for layer in layers:
            layer.self_attn.kv_cache_dtype = None if dtype == torch.float32 else dtype

    def _final_norm(self, x: torch.Tensor) -> torch.Tensor:
        """``model.norm(x)`` as the native stack computes it wherever that could run (both paths of
        :meth:`forward` give the same bits)."""
        weight, cpu = self.model.norm.weight, x.device.type == "cpu"
        if cpu and weight.device == x.device and x.dtype == weight.dtype == torch.float32 and native.available():
            return row_ops.rms_norm(x, weight.contiguous(), self.model.norm.eps)
        return self.model.norm(x)  # type: ignore[no-any-return]

    # the HF methods the engine and the drafters call
    def get_output_embeddings(self) -> LeanLinear:
        return self.lm_head

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def make_tree_cache(self, batch_size: int) -> LeanKVCache:
        """The cache :class:`~spec_fast.kv_cache.TreeKVCache` keeps for this model (buffers sized on first use)."""
        return LeanKVCache(len(self.model.layers))

    def forward_step(self, input_ids: torch.Tensor, position: int, past_key_values: LeanKVCache,
                     output_hidden_states: bool = False) -> LeanOutput:
        """:meth:`forward` of ``input_ids [B, Q]`` at positions ``position ..`` behind a cache of ``position``
        entries per row, attending causally (every cached entry and the tokens before): the same output
        (``hidden_states``: the final normed states alone), with the little Python of :func:`causal_logits`
        where that serves the pass (a plain decoding step, a greedy chain's verification; then ``first_max
        [B, Q]`` too, with a head of GGUF blocks)."""
        done = causal_logits(self, input_ids, position, past_key_values)
        if done is None:
            positions = torch.arange(int(input_ids.shape[1]), device=input_ids.device) + position
            return self.forward(input_ids, position_ids=positions.unsqueeze(0).expand(int(input_ids.shape[0]), -1),
                                past_key_values=past_key_values, output_hidden_states=output_hidden_states,
                                final_hidden_state_only=output_hidden_states)
        return LeanOutput(done[0], (done[2],) if output_hidden_states else None, past_key_values, done[1])

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, past_key_values: LeanKVCache | None = None,
                use_cache: bool = True, output_hidden_states: bool = False, logits_to_keep: int = 0,
                final_hidden_state_only: bool = False, **unused: Any) -> LeanOutput:
        """``input_ids [B, Q]`` behind the ``K - Q`` entries of ``past_key_values`` -> :class:`LeanOutput`.

        Args:
            attention_mask: ``[B, 1, Q, K]`` additive float (0 = attend) or bool (True = attend); ``None``
                attends causally (every cached entry and the earlier new ones).
            position_ids: ``[B, Q]`` long; default ``past length + arange(Q)``.
            past_key_values: a :class:`LeanKVCache` (appended to in place); default a fresh one.
            logits_to_keep: ``k > 0`` computes the logits of the last ``k`` entries only.
            final_hidden_state_only: ``hidden_states`` = the final normed states alone, in one native call.
        """
        if past_key_values is None:
            past_key_values = self.make_tree_cache(int(input_ids.shape[0]))
        if not isinstance(past_key_values, LeanKVCache):
            raise ValueError(f"LeanLlama needs a LeanKVCache, got past_key_values={type(past_key_values).__name__}")
        batch, num_query = input_ids.shape
        past = past_key_values.get_seq_length()
        if position_ids is None:
            position_ids = (torch.arange(num_query, device=input_ids.device) + past).unsqueeze(0).expand(batch, -1)
        layers: list[Any] = list(self.model.layers)
        # converted once per pass to the attention dtype (each layer would otherwise convert it again)
        wide: torch.dtype = layers[0].self_attn.attention_dtype if layers else torch.float32
        # one [B, 1, Q, K] block for every layer (the native layer reads it row by row); none for causal
        # attention where the whole stack runs natively (the native layer attends causally without one)
        mask = (None if attention_mask is None
                else self._block_mask(attention_mask, batch, num_query, past, wide, input_ids.device))
        cos, sin = self.model.rotary(position_ids)
        x = self.model.embed_tokens(input_ids)
        every_layer = output_hidden_states and not final_hidden_state_only
        hidden: list[torch.Tensor] = [x] if every_layer else []
        stack = None if every_layer or not layers else past_key_values.native_stack(layers, x, mask)
        if stack is None and mask is None and num_query > 1:
            mask = self._block_mask(None, batch, num_query, past, wide, input_ids.device)
        if stack is not None:
            # every layer in one native call, the shared arguments checked once (the same arithmetic as the
            # loop below, without its per-layer Python), writing into a copy of x; it returns the final norm
            normed = native.run_layers(stack, x.contiguous().clone(), cos.contiguous(), sin.contiguous(), mask,
                                       past, norm=(self.model.norm.weight, self.model.norm.eps))
            assert normed is not None
            x = normed
            for layer_cache in past_key_values.layers:
                layer_cache.key_length = layer_cache.value_length = past + int(num_query)
        else:
            for layer, layer_cache in zip(layers, past_key_values.layers):
                x = layer(x, cos, sin, mask, layer_cache)
                if every_layer:
                    hidden.append(x)
            x = self._final_norm(x)
        if output_hidden_states:
            hidden[-1:] = [x]  # HF's last entry: the final normed states
        if logits_to_keep > 0:
            x = x[:, -logits_to_keep:]
        return LeanOutput(self.lm_head(x), tuple(hidden) if output_hidden_states else None, past_key_values)

    @staticmethod
    def _block_mask(attention_mask: torch.Tensor | None, batch: int, num_query: int, past: int,
                    wide: torch.dtype, device: torch.device) -> torch.Tensor | None:
        """:func:`_additive`'s mask in the attention dtype, expanded to ``[B, 1, Q, K]`` and contiguous."""
        mask = _additive(attention_mask, num_query, past, device)
        return None if mask is None else mask.to(wide).expand(batch, 1, num_query, int(mask.shape[-1])).contiguous()


def _norm(hf_norm: Any) -> RMSNorm:
    weight = hf_norm.weight.detach().float()
    eps = float(getattr(hf_norm, "variance_epsilon", getattr(hf_norm, "eps", 1e-6)))
    norm = RMSNorm(int(weight.shape[0]), eps)
    norm.weight = nn.Parameter(weight.clone(), requires_grad=False)
    return norm


def _additive(mask: torch.Tensor | None, num_query: int, past: int, device: torch.device) -> torch.Tensor | None:
    """The attention mask as an additive float32 ``[B, 1, Q, K]`` (``None`` for a single query)."""
    if mask is None:
        if num_query == 1:
            return None
        slots = torch.arange(past + num_query, device=device)
        allowed = slots.unsqueeze(0) <= (past + torch.arange(num_query, device=device)).unsqueeze(1)
        mask = allowed.view(1, 1, num_query, past + num_query)
    if mask.dtype == torch.bool:
        low = torch.finfo(torch.float32).min
        return torch.where(mask, torch.zeros((), device=device), torch.full((), low, device=device))
    return mask.float()
