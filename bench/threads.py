"""Plain decoding speed of SmolLM2 with 1, 2 and torch's default number of CPU threads, on the machine as
it is and next to one competing busy process, in one run.

Why: the CLI's thread default must never be pathological. Torch's intra-op pool spins its threads
waiting for each other; when another process holds one of the cores, a pool as wide as the machine
waits for the descheduled thread on every operation. Each configuration decodes the same prompts
(greedy, plain decoding through ``SpeculativeDecoder`` with ``ar``), thread counts interleaved prompt by
prompt; the competing process is ``python -c "while True: pass"`` (one core busy). The load average
before each condition is recorded, since the machine may be shared. Writes
``bench/results/threads.{json,md}``.

    python bench/threads.py                 # 2 prompts x 16 tokens per configuration, a few minutes
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench._git import git_commit  # noqa: E402

from bench._common import write_results  # noqa: E402
from spec_fast.engine import SpeculativeDecoder  # noqa: E402
from spec_fast.models import chat_prompt_ids, load_model  # noqa: E402
from spec_fast.strategies import parse_strategy  # noqa: E402

PROMPTS = (
    "Explain speculative decoding in one paragraph.",
    "Write a short poem about the sea.",
    "What are three tips for writing clean Python code?",
    "Summarise the plot of Romeo and Juliet.",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = parser.parse_args(argv)
    default_threads = torch.get_num_threads()
    thread_counts = sorted({1, 2, default_threads})
    model, tokenizer = load_model()
    decoder = SpeculativeDecoder(model, None, parse_strategy("ar"))
    prompts = [chat_prompt_ids(tokenizer, p) for p in PROMPTS[: args.prompts]]
    torch.set_num_threads(1)
    decoder.generate([prompts[0]], max_new_tokens=4)  # warm-up

    rows: list[dict[str, Any]] = []
    for condition in ("as is", "one busy process"):
        load_before = os.getloadavg()[0]
        busy = None
        if condition != "as is":
            busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            time.sleep(1.0)
        try:
            rates: dict[int, list[float]] = {n: [] for n in thread_counts}
            for prompt in prompts:
                for n in thread_counts:
                    torch.set_num_threads(n)
                    result = decoder.generate([prompt], max_new_tokens=args.max_new_tokens)
                    rates[n].append(result.metrics.tokens_per_s)
                    print(f"{condition}: {n} threads {rates[n][-1]:.2f} tok/s", flush=True)
        finally:
            if busy is not None:
                busy.terminate()
                busy.wait()
        for n in thread_counts:
            rows.append({"condition": condition, "threads": n, "default": n == default_threads,
                         "tokens_per_s": statistics.median(rates[n]), "per_prompt": rates[n],
                         "load_average_before": load_before})
    torch.set_num_threads(default_threads)

    meta = {
        "command": "python bench/threads.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": git_commit(),
        "hardware": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.processor() or 'cpu'}",
        "torch": torch.__version__,
        "torch default threads": default_threads,
        "workload": f"SmolLM2-135M-Instruct float32, plain greedy decoding, {args.prompts} chat prompts x "
                    f"{args.max_new_tokens} new tokens per configuration, median tokens/s",
        "caveat": "the machine is shared with other jobs: the 'as is' condition is not idle (load average "
                  "recorded per condition)",
    }
    table = ["| condition | threads | tokens/s (median) | vs 1 thread | load average before |", "|---|---|---|---|---|"]
    for row in rows:
        one = next(r for r in rows if r["condition"] == row["condition"] and r["threads"] == 1)
        label = f"{row['threads']}" + (" (torch default)" if row["default"] else "")
        table.append(f"| {row['condition']} | {label} | {row['tokens_per_s']:.2f} | "
                     f"{row['tokens_per_s'] / one['tokens_per_s']:.2f}x | {row['load_average_before']:.2f} |")

    def plot(plt: Any) -> Any:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for i, condition in enumerate(("as is", "one busy process")):
            sub = [r for r in rows if r["condition"] == condition]
            ax.bar([j + 0.4 * i for j in range(len(sub))], [r["tokens_per_s"] for r in sub], width=0.4,
                   label=condition)
        ax.set_xticks([j + 0.2 for j in range(len(thread_counts))], [str(n) for n in thread_counts])
        ax.set_xlabel("torch threads")
        ax.set_ylabel("tokens/s")
        ax.legend()
        return fig

    write_results(args.out, "threads", "Plain decoding speed vs torch threads", meta, rows, table, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
