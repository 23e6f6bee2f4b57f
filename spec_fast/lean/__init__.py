"""A lean Llama-family forward with a preallocated KV cache and weight-only int8/int4 or bfloat16 weights.

:class:`LeanLlama` (``LeanLlama.from_hf(model, weights=...)``) is a drop-in target or draft for
:class:`spec_fast.engine.SpeculativeDecoder`; :func:`spec_fast.models.load_model` builds one with
``lean=True`` or ``quantize="int8" | "int4"``; :func:`lean_from_gguf` reads one straight from a Llama GGUF file.
"""

from spec_fast.lean.cache import LeanKVCache, LeanLayerCache
from spec_fast.lean.gguf import lean_from_gguf, read_gguf_llama
from spec_fast.lean.model import SUPPORTED_MODEL_TYPES, LeanLlama, LeanOutput, supports
from spec_fast.lean.quant import KINDS, LeanLinear

__all__ = ["KINDS", "LeanKVCache", "LeanLayerCache", "LeanLinear", "LeanLlama", "LeanOutput",
           "SUPPORTED_MODEL_TYPES", "lean_from_gguf", "read_gguf_llama", "supports"]
