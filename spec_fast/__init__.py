"""spec_fast: the batched torch engine for multi-path speculative decoding (GPU first, runs on CPU).

With the same uniforms it returns exactly the tokens of :mod:`spec_ref`; greedy speculative output is
byte-identical to greedy autoregressive output in float32.
"""

from spec_fast.flat_tree import FlatTree

__all__ = ["FlatTree"]
# --- further exports are added below this line ---
from spec_fast.decoding import decoding_operator
from spec_fast.rng import counter_uniforms
from spec_fast.verify import METHODS, TreeVerifyOutput, draw_uniforms, uniforms_per_node, verify_tree

__all__ += ["decoding_operator", "counter_uniforms", "METHODS", "TreeVerifyOutput", "draw_uniforms",
            "uniforms_per_node", "verify_tree"]
from spec_fast.kernels import solver_acceptance, solver_branching, solver_sample

__all__ += ["solver_sample", "solver_branching", "solver_acceptance"]
# issue 6: the decoding engine
from spec_fast.drafters import Drafter, EarlyExitDrafter, ModelDrafter, early_exit_model
from spec_fast.decoding import SamplingParams
from spec_fast.engine import DecodeState, GenerationResult, SpeculativeDecoder
from spec_fast.verify import verify_greedy
from spec_fast.kv_cache import TreeKVCache
from spec_fast.metrics import GenerationMetrics
from spec_fast.models import chat_prompt_ids, load_model
from spec_fast.strategies import Strategy, parse_strategy

__all__ += [
    "Drafter", "EarlyExitDrafter", "ModelDrafter", "early_exit_model", "GenerationResult", "SamplingParams",
    "SpeculativeDecoder", "DecodeState", "verify_greedy", "TreeKVCache", "GenerationMetrics", "chat_prompt_ids", "load_model",
    "Strategy", "parse_strategy",
]
# issue 7: trained drafts (distilled model, eagle and rnn feature heads)
from spec_fast.heads import DRAFT_NAMES, FeatureHead, HeadDrafter, load_distilled, load_drafter, load_head

__all__ += ["DRAFT_NAMES", "FeatureHead", "HeadDrafter", "load_distilled", "load_drafter", "load_head"]
# dual drafts (seeds/000 routing, seeds/001 merged tree)
from spec_fast.dual import DualDrafter

__all__ += ["DualDrafter"]
