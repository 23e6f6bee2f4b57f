"""Tables, plots, the NDE selector and the reading of bench/study_regimes.py (from its saved rows)."""

from __future__ import annotations

from typing import Any


def tiny_model() -> tuple[Any, list[list[int]]]:
    """A seeded random Llama (V = 64, 2 layers) and 5 prompts of token ids, for ``--quick``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = LlamaForCausalLM(config)
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 64, (6,), generator=generator).tolist() for _ in range(5)]
    return model, prompts


def report(out: str, args: Any) -> None:
    pass
