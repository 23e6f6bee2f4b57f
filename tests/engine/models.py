"""Tiny random HF models built in the tests (no download), shared by the engine tests."""

from __future__ import annotations

from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM


def tiny_llama(vocab_size: int = 64, layers: int = 4, seed: int = 0, hidden: int = 32) -> Any:
    """A random Llama; ``initializer_range=0.3`` spreads the logits so float32 argmax ties are unlikely."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, initializer_range=0.3, max_position_embeddings=128,
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
