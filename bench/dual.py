"""Dual drafting on SmolLM2-135M-Instruct: merge and route for (rnn, retrieval) against each single draft
at the same per-head shape and against AR, greedy, on held-out chat prompts, in one run.

Configurations are interleaved prompt by prompt (slow phases of the shared machine hit all alike). Reports
block efficiency (tokens per target pass), draft tokens accepted per head, route wins / accepted-path
supplier counts, tokens/s and its ratio to our AR in the same run, host reads per step (Tensor.item /
tolist / __bool__ ... counted during the run), and whether the output equals AR token for token.
Writes ``bench/results/dual.{json,md,png}``.

    python bench/dual.py --quick      # 3 prompts x 24 new tokens (a few minutes on 2 CPU cores)
    python bench/dual.py              # 6 prompts x 48 new tokens
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from typing import Any

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench._common import write_results  # noqa: E402
from spec_fast.decoding import SamplingParams  # noqa: E402
from spec_fast.dual import DualDrafter  # noqa: E402
from spec_fast.engine import SpeculativeDecoder  # noqa: E402
from spec_fast.heads import load_drafter  # noqa: E402
from spec_fast.models import chat_prompt_ids, load_model  # noqa: E402
from spec_fast.strategies import parse_strategy  # noqa: E402
from spec_fast.training import HELDOUT_PROMPTS  # noqa: E402

READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")


class _ReadCounter:
    """Counts host reads of tensor values while active (wraps the Tensor methods that sync)."""

    def __init__(self) -> None:
        self.count = 0
        self._originals = {name: getattr(torch.Tensor, name) for name in READS}

    def __enter__(self) -> _ReadCounter:
        for name, original in self._originals.items():
            def counted(tensor: torch.Tensor, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
                self.count += 1
                return _original(tensor, *args, **kwargs)
            setattr(torch.Tensor, name, counted)
        return self

    def __exit__(self, *exc: Any) -> None:
        for name, original in self._originals.items():
            setattr(torch.Tensor, name, original)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--strategy", default="chain:2", help="per-head shape (chain:L or topk:D,K,B)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    prompts_n, new = (3, 24) if args.quick else (6, 48)
    model, tokenizer = load_model(device=args.device)
    rnn, retrieval = load_drafter("rnn", model), load_drafter("retrieval", model)
    strategy = parse_strategy(args.strategy)
    configs: dict[str, SpeculativeDecoder] = {
        "ar": SpeculativeDecoder(model, None, parse_strategy("ar")),
        "rnn": SpeculativeDecoder(model, rnn, strategy),
        "retrieval": SpeculativeDecoder(model, retrieval, strategy),
        "merge(rnn,retrieval)": SpeculativeDecoder(model, DualDrafter(rnn, retrieval, "merge"), strategy),
        "route(rnn,retrieval)": SpeculativeDecoder(model, DualDrafter(rnn, retrieval, "route"), strategy),
    }
    totals: dict[str, dict[str, Any]] = {name: {"tokens": 0, "seconds": 0.0, "passes": 0, "reads": 0, "steps": 0,
                                                "head_accepted": [0, 0], "head_selected": [0, 0], "identical": True}
                                         for name in configs}
    prompts = [chat_prompt_ids(tokenizer, text) for text in HELDOUT_PROMPTS[:prompts_n]]
    sampling = SamplingParams()
    for prompt in prompts:
        reference: list[int] | None = None
        for name, decoder in configs.items():
            with _ReadCounter() as reads:
                start = time.perf_counter()
                result = decoder.generate([prompt], max_new_tokens=new, sampling=sampling,
                                          eos_token_id=tokenizer.eos_token_id)
                seconds = time.perf_counter() - start
            row = totals[name]
            if reference is None:
                reference = result.tokens[0]
            row["identical"] = row["identical"] and result.tokens[0] == reference
            row["tokens"] += len(result.tokens[0])
            row["seconds"] += seconds
            row["passes"] += result.metrics.target_passes
            row["reads"] += reads.count
            row["steps"] += max(result.metrics.target_passes, 1)
            for h in range(len(result.metrics.head_accepted_tokens)):
                row["head_accepted"][h] += result.metrics.head_accepted_tokens[h]
                row["head_selected"][h] += result.metrics.head_selected[h]
    ar_rate = totals["ar"]["tokens"] / totals["ar"]["seconds"]
    rows = []
    for name, row in totals.items():
        rate = row["tokens"] / row["seconds"]
        rows.append({
            "config": name, "strategy": configs[name].label(sampling), "tokens": row["tokens"],
            "block_efficiency": row["tokens"] / max(row["passes"], 1), "tokens_per_s": rate,
            "ratio_to_ar": rate / ar_rate, "host_reads_per_step": row["reads"] / row["steps"],
            "head_accepted_tokens": row["head_accepted"], "head_selected": row["head_selected"],
            "identical_to_ar": row["identical"],
        })
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    meta = {
        "command": "python bench/dual.py " + " ".join(sys.argv[1:]), "commit": commit,
        "hardware": f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores, torch "
                    f"{torch.__version__}, {args.threads} thread(s), device {args.device}".replace("  ", " "),
        "caveat": "shared machine (other jobs running): ratios are side by side in one run, absolute tok/s noisy",
        "prompts": f"{prompts_n} held-out chat prompts (spec_fast.training.HELDOUT_PROMPTS), {new} new tokens, greedy",
    }
    table = ["| config | block eff. | tok/s | x AR | host reads/step | accepted (head 1, 2) | selected (head 1, 2) | = AR |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        table.append(f"| {r['config']} | {r['block_efficiency']:.2f} | {r['tokens_per_s']:.1f} | {r['ratio_to_ar']:.2f} "
                     f"| {r['host_reads_per_step']:.1f} | {r['head_accepted_tokens']} | {r['head_selected']} "
                     f"| {r['identical_to_ar']} |")
    table += ["", "Selected: route = steps whose tree was that head's; merge = steps whose accepted path came from "
              "that head (steps accepting nothing count for neither)."]

    def plot(plt: Any) -> Any:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
        names = [r["config"] for r in rows]
        axes[0].barh(names, [r["block_efficiency"] for r in rows])
        axes[0].set_xlabel("block efficiency (tokens / target pass)")
        axes[1].barh(names, [r["ratio_to_ar"] for r in rows])
        axes[1].axvline(1.0, color="k", lw=0.8)
        axes[1].set_xlabel("tokens/s relative to AR (same run)")
        return fig

    write_results(args.out, "dual", f"Dual drafting (rnn, retrieval), per head {args.strategy}, greedy", meta, rows,
                  table, plot)


if __name__ == "__main__":
    main()
