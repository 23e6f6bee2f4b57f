"""Linear layers of the lean forward: float32, bfloat16 or weight-only int8 / int4, all float32 in and out.

Each kind keeps the activations float32 between layers (norms, residual stream, attention) and converts
only the input of its own matrix product, so a model may mix kinds (int4 layers with an int8 LM head).
The quantised kinds use torch's fused CPU kernels for weight-only quantisation, which need bfloat16
activations:

* ``int8``: one scale per output channel, ``w ~= q * scale`` with ``q`` in [-127, 127]
  (``torch._weight_int8pack_mm``);
* ``int4``: asymmetric groups of :data:`INT4_GROUP_SIZE` input channels, ``w ~= (q - 8) * scale + zero`` with
  ``q`` in [0, 15] (``torch._weight_int4pack_mm_for_cpu``; the gpt-fast layout).

``float32`` weights on the CPU are packed for the project's own matrix product (:mod:`spec_fast.lean.native`,
C compiled on first use): every weight is read once per group of up to four rows, so a pass over 2-4
tokens costs about one over a single token, and every row is computed independently of the others (the
float32 forward becomes batch-invariant in its linear layers). Where that kernel is not available (no C
compiler, ``SPEC_FAST_NATIVE=0``, a CUDA device), float32 weights of layers that widen (more outputs than
inputs: the fused q/k/v and gate/up products and the LM head) are stored column-major, ``W^T`` contiguous
behind a ``[N, K]`` view (:func:`column_major`), which lets ``F.linear`` reach BLAS without a transpose: on
this CPU (one thread, oneMKL through torch 2.13) that made SmolLM2's products over 1-3 tokens 1.5-1.8x
faster than HF's row-major layout. Both are measured side by side in ``bench/results/target_cost.md``.

``bfloat16`` weights use oneDNN's bfloat16 matrix product, which is *not* batch-invariant on this CPU (a row's
output changed with the rows beside it, even between runs); they exist to be measured, not for decoding.

Both quantised kernels compute every output row independently of the other rows of the batch (checked in
the tests, at SmolLM2's layer sizes),
so a token's logits do not depend on how many tokens share its pass: a verification pass gives the very
logits a plain decoding step would, which is what keeps greedy speculative output identical to plain
decoding of the quantised model.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from spec_fast.lean import native
from spec_fast.lean.watch import WatchedModule

__all__ = ["KINDS", "INT4_GROUP_SIZE", "LeanLinear", "column_major", "hf_linears", "prefers_column_major",
           "stacked_linear"]

#: the weight formats of :class:`LeanLinear`
KINDS = ("float32", "bfloat16", "int8", "int4")
#: input channels per int4 group (divides the hidden and MLP sizes of the Llama family)
INT4_GROUP_SIZE = 32


def prefers_column_major(out_features: int, in_features: int) -> bool:
    """Whether a float32 ``[out_features, in_features]`` weight is stored column-major (module docstring)."""
    return out_features > in_features


def column_major(weight: torch.Tensor) -> torch.Tensor:
    """``weight [N, K]`` with the same values, stored as ``W^T`` contiguous (strides ``(1, N)``)."""
    return weight.t().contiguous().t()


class LeanLinear(WatchedModule):
    """``y = x W^T + b`` for ``x [..., K]`` float32 -> ``[..., N]`` float32, ``W`` stored as ``kind``.

    The bias (Qwen2's q/k/v projections) stays float32.
    """

    def __init__(self, in_features: int, out_features: int, kind: str = "float32", bias: bool = False) -> None:
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got kind={kind!r}")
        self.in_features = in_features
        self.out_features = out_features
        self.kind = kind
        # float32 keeps a Parameter (it may be the tied embedding itself); the other kinds hold buffers
        self.weight: torch.Tensor = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.scales: torch.Tensor | None
        self.bias: torch.Tensor | None
        #: float32 weights packed for :func:`spec_fast.lean.native.mm_float32` ``[ceil(N / 64), K, 64]``
        self.packed: torch.Tensor | None
        self.register_buffer("scales", None)
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)
        self.register_buffer("packed", None)

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None, kind: str) -> LeanLinear:
        """A layer holding ``weight [N, K]`` (and ``bias [N]``) in ``kind``.

        float32 on the CPU with the native kernel available: packed; a ``weight`` that is a Parameter (a
        tied embedding, owned elsewhere) is kept as ``.weight`` beside the packed copy, any other weight is
        packed only. Otherwise float32 shares a Parameter ``weight`` as it is stored, or copies a tensor into
        the layout of :func:`prefers_column_major`."""
        out_features, in_features = int(weight.shape[0]), int(weight.shape[1])
        layer = cls(in_features, out_features, kind, bias=bias is not None)
        if bias is not None:
            layer.bias = bias.detach().float().clone()
        w = weight.detach().float()
        if kind == "float32":
            shared = isinstance(weight, nn.Parameter)
            if w.device.type == "cpu" and native.available():
                layer.packed = native.pack_float32(w)
                if not shared:
                    del layer.weight  # read back through __getattr__ (unpacked) where anything asks
                    return layer
            if shared:
                layer.weight = weight
            else:
                layout = column_major(w) if prefers_column_major(out_features, in_features) else w
                layer.weight = nn.Parameter(layout, requires_grad=False)
            return layer
        del layer.weight
        if kind == "bfloat16":
            layer.register_buffer("weight", w.to(torch.bfloat16).contiguous())
        elif kind == "int8":
            scales = (w.abs().amax(dim=1) / 127.0).clamp(min=torch.finfo(torch.float32).tiny)
            q = torch.round(w / scales.unsqueeze(1)).clamp(-127, 127).to(torch.int8)
            layer.register_buffer("weight", q.contiguous())
            layer.register_buffer("scales", scales.to(torch.bfloat16))
        else:
            packed, scales_and_zeros = _pack_int4(w)
            layer.register_buffer("weight", packed)
            layer.register_buffer("scales", scales_and_zeros)
        return layer

    @classmethod
    def from_blocks(cls, kind: str, values: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor | None,
                    bias: torch.Tensor | None = None) -> LeanLinear:
        """A layer holding a GGUF block-quantised weight ``w[n, k] = scales[n, k // 32] * values[n, k] +
        offsets[n, k // 32]`` as it is (``kind`` ``"q4_1"`` or ``"q8_0"``, see
        :func:`spec_fast.lean.native.pack_blocks`), multiplied by the native kernel. Without the kernel
        (no C compiler, ``SPEC_FAST_NATIVE=0``) the weight is de-quantised to float32 instead."""
        out_features, in_features = int(values.shape[0]), int(values.shape[1])
        if not native.available():
            layer = cls.from_weight(_dequantize_blocks(values, scales, offsets), bias, "float32")
            return layer
        layer = cls(in_features, out_features, "float32", bias=bias is not None)
        layer.kind = kind
        if bias is not None:
            layer.bias = bias.detach().float().clone()
        del layer.weight
        layer.packed = native.pack_blocks(kind, values, scales, offsets)
        return layer

    def expose_weight(self, weight: nn.Parameter) -> None:
        """Answer ``.weight`` with ``weight``, a Parameter holding this layer's values (a tied embedding),
        instead of unpacking the packed layout on every read."""
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError(f"weight must be [{self.out_features}, {self.in_features}], got {tuple(weight.shape)}")
        self._parameters["weight"] = weight  # register_parameter refuses: __getattr__ answers 'weight'

    def __getattr__(self, name: str) -> Any:
        # a packed-only float32 layer has no stored [N, K] weight; reading ``.weight`` unpacks a copy
        if name == "weight":
            exposed = self.__dict__["_parameters"].get("weight")
            if exposed is not None:  # expose_weight's Parameter
                return exposed
            packed = self.__dict__["_buffers"].get("packed")
            if packed is not None:
                kind = self.__dict__["kind"]
                if kind in native.BLOCK_KINDS:
                    return native.unpack_blocks(kind, packed, self.out_features)
                return native.unpack_float32(packed, self.out_features)
        return super().__getattr__(name)

    def dequantized(self) -> torch.Tensor:
        """The weight as float32 ``[N, K]``, as the kernel sees it (tests)."""
        if self.kind in ("float32", "bfloat16", *native.BLOCK_KINDS):
            weight: torch.Tensor = self.weight
            return weight.float()
        eye = torch.eye(self.in_features, dtype=torch.float32)
        # W^T = I W^T: the kernel applied to the identity rows reads the weight back (bfloat16-exact)
        saved, self.bias = self.bias, None
        try:
            return self.forward(eye).t().contiguous()
        finally:
            self.bias = saved

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., K]`` float32 -> ``[..., N]`` float32."""
        if self.packed is not None:
            flat = x.reshape(-1, self.in_features)
            if flat.device.type != "cpu":  # moved to another device after packing: read back (slow, exact)
                product = nn.functional.linear(flat, self.weight.to(flat.device))
            elif self.kind in native.BLOCK_KINDS:
                product = native.mm_blocks(self.kind, flat, self.packed, self.out_features)
            else:
                product = native.mm_float32(flat, self.packed, self.out_features)
            out = product.reshape(*x.shape[:-1], self.out_features)
        elif self.kind == "float32":
            out = nn.functional.linear(x, self.weight)
        elif self.kind == "bfloat16":
            out = nn.functional.linear(x.to(torch.bfloat16), self.weight).float()
        else:
            flat = x.reshape(-1, self.in_features).to(torch.bfloat16)
            assert self.scales is not None
            if self.kind == "int8":
                out2 = torch._weight_int8pack_mm(flat, self.weight, self.scales)
            else:
                out2 = torch._weight_int4pack_mm_for_cpu(flat, self.weight, INT4_GROUP_SIZE, self.scales)
            out = out2.float().reshape(*x.shape[:-1], self.out_features)
        if self.bias is not None:
            out = out + self.bias
        return out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kind={self.kind}"


def dequantize_blocks(block: Any) -> torch.Tensor:
    """The float32 ``[N, K]`` weight of a :class:`spec_fast.lean.gguf.BlockWeight`."""
    return _dequantize_blocks(block.values, block.scales, block.offsets)


def _dequantize_blocks(values: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor | None) -> torch.Tensor:
    """``scales * values + offsets`` per group of 32 inputs -> float32 ``[N, K]`` (GGUF's de-quantisation)."""
    group = native.GROUP
    weight = values.float() * scales.float().repeat_interleave(group, dim=1)
    if offsets is not None:
        weight = weight + offsets.float().repeat_interleave(group, dim=1)
    return weight


def _pack_int4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight [N, K]`` float32 -> (packed uint8 ``[N, K/2]``, scales and zeros bfloat16 ``[K/G, N, 2]``)."""
    out_features, in_features = weight.shape
    group = INT4_GROUP_SIZE
    if in_features % group:
        raise ValueError(f"int4 needs input sizes divisible by {group}, got a layer with {in_features} inputs")
    grouped = weight.reshape(out_features, in_features // group, group)
    low = grouped.amin(dim=-1, keepdim=True)
    high = grouped.amax(dim=-1, keepdim=True)
    scales = ((high - low) / 15).clamp(min=1e-6)
    zeros = low + 8 * scales
    q = torch.clamp(torch.round((grouped - low) / scales), 0, 15).to(torch.int32).reshape(out_features, in_features)
    packed = torch._convert_weight_to_int4pack_for_cpu(q.contiguous(), 1)
    scales_and_zeros = torch.stack(
        [scales.reshape(out_features, -1).t(), zeros.reshape(out_features, -1).t()], dim=-1
    ).contiguous().to(torch.bfloat16)
    return packed, scales_and_zeros


def hf_linears(model: Any) -> list[Any]:
    """Every linear layer of an HF-layout model (or stand-in), the LM head included."""
    out = [model.get_output_embeddings()]
    for block in model.model.layers:
        attn, mlp = block.self_attn, block.mlp
        out += [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]
    return out


def stacked_linear(linears: list[Any], bias: torch.Tensor | None, weights: str) -> LeanLinear:
    """One :class:`LeanLinear` for HF linear layers stacked along their outputs (fused q/k/v, gate/up).

    ``weights="gguf"`` keeps blocks the file stores (all of one kind) as they are and de-quantises the rest."""
    blocks: list[Any] = [getattr(linear, "blocks", None) for linear in linears]
    if weights == "gguf":
        if all(b is not None for b in blocks) and len({b.kind for b in blocks}) == 1:
            offsets = None if blocks[0].offsets is None else torch.cat([b.offsets for b in blocks], dim=0)
            return LeanLinear.from_blocks(blocks[0].kind, torch.cat([b.values for b in blocks], dim=0),
                                          torch.cat([b.scales for b in blocks], dim=0), offsets, bias)
        weights = "float32"
    parts = [linear.weight.detach().float() if linear.weight is not None else dequantize_blocks(block)
             for linear, block in zip(linears, blocks)]
    return LeanLinear.from_weight(parts[0] if len(parts) == 1 else torch.cat(parts, dim=0), bias, weights)
