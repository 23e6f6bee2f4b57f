"""Read a model-cache entry (:mod:`spec_fast.cache`) without transformers, for a start-up in seconds.

Importing transformers and building its model costs about 3-4 s of a second run's start on a 2-core CPU
(more than loading the weights); the float32 :class:`~spec_fast.lean.LeanLlama` built here from the
entry's ``config.json`` and ``model.safetensors`` computes the same logits bit for bit as the HF model the
entry was saved from (tests/engine/test_model_cache.py compares them), and :class:`EntryTokenizer` reads
the entry's ``tokenizer.json`` with the ``tokenizers`` library and renders its chat template with jinja2
as transformers does. The weights reach :meth:`LeanLlama.from_hf` through small stand-ins with the HF
attribute names, so both loads share one construction.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import torch

from spec_fast.lean.model import LeanLlama, supports

__all__ = ["EntryTokenizer", "entry_supported", "load_entry"]

_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def entry_supported(entry: str) -> str | None:
    """None if :func:`load_entry` can read ``entry``, else the reason why not (then load it with transformers)."""
    for name in _FILES:
        if not os.path.isfile(os.path.join(entry, name)):
            return f"the entry has no {name}"
    config = _read_config(entry)
    reason = supports(SimpleNamespace(config=config))
    if reason is not None:
        return reason
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default" or "rope_theta" not in rope:
        return "only the default RoPE (rope_type='default' with rope_theta) is read without transformers"
    if getattr(config, "dtype", "float32") != "float32":
        return f"the entry holds {config.dtype} weights; the lean forward reads float32"
    return None


def load_entry(entry: str, device: str = "cpu") -> tuple[LeanLlama, EntryTokenizer]:
    """``(float32 LeanLlama, tokenizer)`` of a model-cache ``entry`` (check it with :func:`entry_supported`)."""
    from safetensors.torch import load_file

    config = _read_config(entry)
    tensors = load_file(os.path.join(entry, "model.safetensors"))
    model = LeanLlama.from_hf(_HFStandIn(config, tensors), "float32").to(device)
    generation = os.path.join(entry, "generation_config.json")
    if os.path.isfile(generation):
        with open(generation, encoding="utf-8") as handle:
            model.generation_config = SimpleNamespace(**json.load(handle))
    return model, EntryTokenizer(entry)


def _read_config(entry: str) -> Any:
    with open(os.path.join(entry, "config.json"), encoding="utf-8") as handle:
        return SimpleNamespace(**json.load(handle))


def _rope_inv_freq(config: Any) -> torch.Tensor:
    """HF's default RoPE inverse frequencies, computed with the same operations (same bits)."""
    base = config.rope_parameters["rope_theta"]
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    inv_freq: torch.Tensor = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    return inv_freq


class _HFStandIn:
    """The attributes of an HF ``LlamaForCausalLM`` that :meth:`LeanLlama.from_hf` reads, over a state dict."""

    def __init__(self, config: Any, tensors: dict[str, torch.Tensor]) -> None:
        self.config = config
        self.generation_config = None
        self.tensors = tensors

        def linear(prefix: str) -> SimpleNamespace:
            return SimpleNamespace(weight=tensors[f"{prefix}.weight"], bias=tensors.get(f"{prefix}.bias"))

        def norm(prefix: str) -> SimpleNamespace:
            return SimpleNamespace(weight=tensors[f"{prefix}.weight"], variance_epsilon=float(config.rms_norm_eps))

        layers = []
        for i in range(int(config.num_hidden_layers)):
            p = f"model.layers.{i}"
            layers.append(SimpleNamespace(
                self_attn=SimpleNamespace(**{n: linear(f"{p}.self_attn.{n}") for n in ("q_proj", "k_proj", "v_proj",
                                                                                      "o_proj")}),
                mlp=SimpleNamespace(**{n: linear(f"{p}.mlp.{n}") for n in ("gate_proj", "up_proj", "down_proj")}),
                input_layernorm=norm(f"{p}.input_layernorm"),
                post_attention_layernorm=norm(f"{p}.post_attention_layernorm"),
            ))
        embed = SimpleNamespace(weight=tensors["model.embed_tokens.weight"])
        self.model = SimpleNamespace(embed_tokens=embed, layers=layers, norm=norm("model.norm"),
                                     rotary_emb=SimpleNamespace(inv_freq=_rope_inv_freq(config), attention_scaling=1.0))
        tied = getattr(config, "tie_word_embeddings", False) or "lm_head.weight" not in tensors
        self.head = embed if tied else SimpleNamespace(weight=tensors["lm_head.weight"])

    def get_output_embeddings(self) -> Any:
        return self.head

    def parameters(self) -> Iterator[torch.Tensor]:
        return iter(self.tensors.values())


class EntryTokenizer:
    """The calls spec_fast makes on an HF tokenizer, over an entry's ``tokenizer.json`` and chat template.

    ``tokenizer(text)["input_ids"]`` (special tokens added as the tokenizer's post-processor says),
    ``apply_chat_template(messages, add_generation_prompt=True, tokenize=True)`` (the template rendered in
    transformers' jinja2 sandbox with its options, then encoded without added special tokens, as
    transformers does), ``decode(ids, skip_special_tokens=...)``, ``eos_token_id``, ``chat_template``.
    """

    def __init__(self, entry: str) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(os.path.join(entry, "tokenizer.json"))
        with open(os.path.join(entry, "tokenizer_config.json"), encoding="utf-8") as handle:
            config = json.load(handle)
        self.special_tokens = {k: v for k, v in config.items()
                               if k in ("bos_token", "eos_token", "unk_token", "pad_token") and isinstance(v, str)}
        template = config.get("chat_template")
        template_file = os.path.join(entry, "chat_template.jinja")
        if os.path.isfile(template_file):
            with open(template_file, encoding="utf-8") as handle:
                template = handle.read()
        self.chat_template: str | None = template if isinstance(template, str) else None
        eos = self.special_tokens.get("eos_token")
        self.eos_token = eos
        self.eos_token_id: int | None = self._tokenizer.token_to_id(eos) if eos is not None else None
        self._compiled: Any = None

    def __call__(self, text: str) -> dict[str, list[int]]:
        return {"input_ids": list(self._tokenizer.encode(text, add_special_tokens=True).ids)}

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return str(self._tokenizer.decode([int(t) for t in ids], skip_special_tokens=skip_special_tokens))

    def apply_chat_template(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = False,
                            tokenize: bool = True) -> list[int] | str:
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template")
        if self._compiled is None:
            self._compiled = _compile_template(self.chat_template)
        text = self._compiled.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                     **self.special_tokens)
        if not tokenize:
            return str(text)
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)


def _compile_template(template: str) -> Any:
    """transformers' sandbox for chat templates (trim/lstrip blocks, loop controls, ``raise_exception``,
    ``tojson``)."""
    import jinja2.ext
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template)
