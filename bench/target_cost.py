"""Cost of one SmolLM2-135M target pass as a function of its width (tokens per pass), CPU, in one run.

Why speculative shapes that fit this CPU are small: a pass over ``Q`` new tokens behind a 120-token
context is timed for ``Q = 1..16`` through our ``TreeKVCache`` (a chain block with its tree mask, as a
verification pass) and through HF's own ``DynamicCache`` (plain causal forward, cropped back after each
pass), widths interleaved round by round; the median of ``--rounds`` passes per width is reported, also
relative to ``Q = 1`` (the price of verifying ``Q - 1`` draft tokens in one pass). Writes
``bench/results/target_cost.{json,md,png}``.

    python bench/target_cost.py            # 15 rounds, about 2 minutes
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
from tqdm import tqdm

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench._common import write_results  # noqa: E402
from spec_fast.kv_cache import TreeKVCache  # noqa: E402
from spec_fast.models import load_model  # noqa: E402

WIDTHS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16)
CONTEXT = 120


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, _ = load_model()
    gen = torch.Generator().manual_seed(0)
    context = torch.randint(100, 40000, (1, CONTEXT), generator=gen)
    ours = TreeKVCache(model, 1, torch.device("cpu"))
    with torch.no_grad():
        ours.forward(context, torch.arange(-1, CONTEXT - 1).unsqueeze(0), logits_to_keep=1)
        ours.commit(torch.arange(CONTEXT).unsqueeze(0), torch.tensor([CONTEXT]))
        hf_cache = model(context, use_cache=True).past_key_values
    times: dict[tuple[str, int], list[float]] = {(k, q): [] for k in ("ours", "hf") for q in WIDTHS}
    with torch.no_grad(), tqdm(total=args.rounds * len(WIDTHS), desc="target passes", unit="width") as bar:
        for round_index in range(args.rounds + 1):  # round 0 warms up and is dropped
            for q in WIDTHS:
                tokens = torch.randint(100, 40000, (1, q), generator=gen)
                start = time.perf_counter()
                ours.forward(tokens, torch.arange(-1, q - 1).unsqueeze(0))
                mid = time.perf_counter()
                ours.commit(torch.zeros(1, 0, dtype=torch.long), torch.tensor([0]))
                mid2 = time.perf_counter()
                model(tokens, past_key_values=hf_cache, use_cache=True)
                end = time.perf_counter()
                hf_cache.crop(-q)
                if round_index > 0:
                    times[("ours", q)].append(mid - start)
                    times[("hf", q)].append(end - mid2)
                    bar.update(1)
    rows = []
    for q in WIDTHS:
        row: dict[str, Any] = {"width": q}
        for kind in ("ours", "hf"):
            row[f"{kind}_ms"] = 1000 * statistics.median(times[(kind, q)])
            row[f"{kind}_vs_width1"] = statistics.median(times[(kind, q)]) / statistics.median(times[(kind, 1)])
        rows.append(row)
    meta = {
        "model": "SmolLM2-135M-Instruct (float32)", "context_tokens": CONTEXT, "rounds": args.rounds,
        "threads": args.threads, "device": "cpu", "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(), "torch": torch.__version__,
        "command": "python bench/target_cost.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "note": "median per width; ours = TreeKVCache chain block with tree mask, hf = DynamicCache causal pass",
    }
    table = ["| tokens per pass | ours (ms) | ours vs 1 | HF cache (ms) | HF vs 1 |", "|---:|---:|---:|---:|---:|"]
    for r in rows:
        table.append(f"| {r['width']} | {r['ours_ms']:.1f} | {r['ours_vs_width1']:.2f}x | {r['hf_ms']:.1f} | "
                     f"{r['hf_vs_width1']:.2f}x |")

    def plot(plt: Any) -> Any:
        fig, ax = plt.subplots(figsize=(7, 4))
        for kind in ("ours", "hf"):
            ax.plot(WIDTHS, [r[f"{kind}_ms"] for r in rows], marker="o", label=kind)
        ax.set_xlabel("tokens per target pass")
        ax.set_ylabel("ms per pass (median)")
        ax.set_title(f"SmolLM2-135M target pass vs width (CPU, {args.threads} thread)")
        ax.legend()
        return fig

    write_results(args.out, "target_cost", "Target pass cost vs tokens per pass (SmolLM2-135M-Instruct, CPU)",
                  meta, rows, table, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
