"""Tiny random HF models built in the tests (no download), shared by the engine tests."""

from __future__ import annotations

from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM


def tiny_llama(vocab_size: int = 64, layers: int = 4, seed: int = 0, hidden: int = 32, heads: int = 4,
               kv_heads: int = 2) -> Any:
    """A random Llama; ``initializer_range=0.3`` spreads the logits so float32 argmax ties are unlikely. Heads
    are ``hidden / heads`` wide (the native attention has vector paths for widths that are multiples of 16)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, initializer_range=0.3, max_position_embeddings=128,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    return LlamaForCausalLM(config).eval()


def tiny_gpt2(vocab_size: int = 64, layers: int = 4, seed: int = 0) -> Any:
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=vocab_size, n_embd=32, n_layer=layers, n_head=4, n_positions=128, initializer_range=0.3,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    return GPT2LMHeadModel(config).eval()


def hf_greedy(model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    out = model.generate(
        torch.tensor([prompt]), max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
        do_sample=False, eos_token_id=None, pad_token_id=0,
    )
    return [int(t) for t in out[0, len(prompt):]]


def save_tiny_chat_model(folder: str, layers: int = 4, seed: int = 0, max_positions: int = 4096) -> str:
    """A random Llama with a character-level tokenizer (printable ASCII and newline, ``<eos>``) and a
    small chat template, saved to ``folder`` like any HF model folder: what the CLI tests load."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "<eos>": 1, "<bos>": 2}
    for c in [chr(c) for c in range(32, 127)] + ["\n"]:
        vocab[c] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", bos_token="<bos>",
                                        unk_token="[UNK]")
    tokenizer.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                               "{% if add_generation_prompt %}<assistant>{% endif %}")
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, initializer_range=0.3, max_position_embeddings=max_positions,
        bos_token_id=2, eos_token_id=1, pad_token_id=None,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # logit 0 for [UNK], <eos>, <bos>: rarely the argmax, so texts run their full length
        model.lm_head.weight[:3] = 0.0
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
