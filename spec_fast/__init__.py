"""spec_fast: the batched torch engine for multi-path speculative decoding (GPU first, runs on CPU).

With the same uniforms it returns exactly the tokens of :mod:`spec_ref`; greedy speculative output is
byte-identical to greedy autoregressive output in float32.

One call for text: ``spec_fast.generate("prompt")`` (:mod:`spec_fast.api`). The names below are imported
on first use, so that ``import spec_fast`` (and ``spec-fast --help``) does not pay for torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spec_fast._lazy import lazy_exports

#: public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "FlatTree": "spec_fast.flat_tree",
    "decoding_operator": "spec_fast.decoding",
    "counter_uniforms": "spec_fast.rng",
    "METHODS": "spec_fast.verify",
    "TreeVerifyOutput": "spec_fast.verify",
    "draw_uniforms": "spec_fast.verify",
    "uniforms_per_node": "spec_fast.verify",
    "verify_tree": "spec_fast.verify",
    "solver_sample": "spec_fast.verify.otlp",
    "solver_branching": "spec_fast.verify.otlp",
    "solver_acceptance": "spec_fast.verify.otlp",
    # the decoding engine
    "Drafter": "spec_fast.drafts.model",
    "EarlyExitDrafter": "spec_fast.drafts.model",
    "ModelDrafter": "spec_fast.drafts.model",
    "early_exit_model": "spec_fast.drafts.model",
    "GenerationResult": "spec_fast.engine",
    "SamplingParams": "spec_fast.decoding",
    "DecodeState": "spec_fast.engine.decode_state",
    "SpeculativeDecoder": "spec_fast.engine",
    # continuous batching: requests that join and leave a running batch
    "BatchEngine": "spec_fast.engine.batch_engine",
    "RequestOutput": "spec_fast.engine.batch_engine",
    "RequestStats": "spec_fast.engine.batch_engine",
    "QueueFullError": "spec_fast.engine.batch_engine",
    "verify_greedy": "spec_fast.verify",
    # dual drafts (seed 000 routing, seed 001 merged tree)
    "DualDrafter": "spec_fast.drafts.dual",
    "TreeKVCache": "spec_fast.kv_cache",
    "GenerationMetrics": "spec_fast.metrics",
    "chat_prompt_ids": "spec_fast.chat",
    "load_model": "spec_fast.models",
    "Strategy": "spec_fast.strategies",
    "parse_strategy": "spec_fast.strategies",
    # trained drafts (distilled model, eagle and rnn feature heads)
    "DRAFT_NAMES": "spec_fast.drafts.heads",
    "FeatureHead": "spec_fast.drafts.heads",
    "HeadDrafter": "spec_fast.drafts.heads",
    "load_distilled": "spec_fast.drafts.heads",
    "load_drafter": "spec_fast.drafts.heads",
    "load_head": "spec_fast.drafts.heads",
    # one call for text
    "generate": "spec_fast.api",
    "Completion": "spec_fast.api",
}

__all__ = ["FlatTree", "decoding_operator", "counter_uniforms", "METHODS", "TreeVerifyOutput",
    "draw_uniforms", "uniforms_per_node", "verify_tree", "solver_sample", "solver_branching",
    "solver_acceptance", "Drafter", "EarlyExitDrafter", "ModelDrafter", "early_exit_model",
    "GenerationResult", "SamplingParams", "DecodeState", "SpeculativeDecoder", "verify_greedy", "DualDrafter",
    "BatchEngine", "RequestOutput", "RequestStats", "QueueFullError",
    "TreeKVCache",
    "GenerationMetrics", "chat_prompt_ids", "load_model", "Strategy", "parse_strategy", "DRAFT_NAMES",
    "FeatureHead", "HeadDrafter", "load_distilled", "load_drafter", "load_head", "generate", "Completion"]


__getattr__, __dir__ = lazy_exports("spec_fast", _EXPORTS, globals())


if TYPE_CHECKING:
    from spec_fast.api import Completion, generate
    from spec_fast.engine.batch_engine import BatchEngine, QueueFullError, RequestOutput, RequestStats
    from spec_fast.decoding import SamplingParams, decoding_operator
    from spec_fast.drafts.model import Drafter, EarlyExitDrafter, ModelDrafter, early_exit_model
    from spec_fast.drafts.dual import DualDrafter
    from spec_fast.engine import DecodeState, GenerationResult, SpeculativeDecoder
    from spec_fast.flat_tree import FlatTree
    from spec_fast.drafts.heads import DRAFT_NAMES, FeatureHead, HeadDrafter, load_distilled, load_drafter, load_head
    from spec_fast.verify.otlp import solver_acceptance, solver_branching, solver_sample
    from spec_fast.kv_cache import TreeKVCache
    from spec_fast.metrics import GenerationMetrics
    from spec_fast.chat import chat_prompt_ids
    from spec_fast.models import load_model
    from spec_fast.rng import counter_uniforms
    from spec_fast.strategies import Strategy, parse_strategy
    from spec_fast.verify import (METHODS, TreeVerifyOutput, draw_uniforms, uniforms_per_node, verify_greedy,
                                  verify_tree)
