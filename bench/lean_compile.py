"""Does ``torch.compile`` pay for the lean int8 forward on this CPU? One run, eager vs compiled, side by side.

The compiled variant wraps every decoder layer's MLP block (norm-free, cache-free: gate/up product, SiLU,
product, down product) in ``torch.compile(dynamic=True)``; attention and the cache stay eager (they mutate
the preallocated cache). Single-token passes behind a 120-token context, eager and compiled alternating
round by round; the compile warm-up (first passes) is timed separately. Writes
``bench/results/lean_compile.{json,md,png}``.

    python bench/lean_compile.py
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
from bench._git import git_commit  # noqa: E402

from bench._common import write_results  # noqa: E402
from spec_fast.kv_cache import TreeKVCache  # noqa: E402
from spec_fast.lean import LeanLlama  # noqa: E402
from spec_fast.models import load_model  # noqa: E402

CONTEXT = 120


def prepared(model: Any) -> TreeKVCache:
    state = TreeKVCache(model, 1, torch.device("cpu"))
    context = torch.randint(100, 40000, (1, CONTEXT), generator=torch.Generator().manual_seed(0))
    state.forward(context, torch.arange(-1, CONTEXT - 1).unsqueeze(0), logits_to_keep=1)
    state.commit(torch.arange(CONTEXT).unsqueeze(0), torch.tensor([CONTEXT]))
    return state


def one_pass(state: TreeKVCache, token: int) -> float:
    start = time.perf_counter()
    state.forward(torch.tensor([[token]]), torch.tensor([[-1]]))
    elapsed = time.perf_counter() - start
    state.commit(torch.tensor([[0]]), torch.tensor([1]), True)
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument("--warm-cache", action="store_true",
                        help="keep torch's on-disk compile cache (default: a fresh one: the warm-up is a cold compile)")
    args = parser.parse_args(argv)
    if not args.warm_cache:
        import tempfile

        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="lean_compile_")
    torch.set_num_threads(args.threads)
    hf_model, _ = load_model()
    eager = LeanLlama.from_hf(hf_model, "int8")
    compiled = LeanLlama.from_hf(hf_model, "int8")
    for layer in compiled.model.layers:
        layer.mlp.forward = torch.compile(layer.mlp.forward, dynamic=True)  # type: ignore[union-attr]
    with torch.no_grad():
        eager_state, compiled_state = prepared(eager), prepared(compiled)
        warm_start = time.perf_counter()
        for i in range(3):
            one_pass(compiled_state, 500 + i)
        warm_up_s = time.perf_counter() - warm_start
        for i in range(3):
            one_pass(eager_state, 500 + i)
        times: dict[str, list[float]] = {"eager": [], "compiled MLP": []}
        for i in range(args.rounds):
            times["eager"].append(one_pass(eager_state, 1000 + i))
            times["compiled MLP"].append(one_pass(compiled_state, 1000 + i))
    rows = [{"variant": k, "median_ms": 1000 * statistics.median(v), "min_ms": 1000 * min(v)} for k, v in times.items()]
    commit = git_commit()
    meta = {
        "model": "SmolLM2-135M-Instruct, lean forward, int8 weights", "context_tokens": CONTEXT,
        "rounds": args.rounds, "threads": args.threads, "compile_warm_up_s": round(warm_up_s, 1),
        "compile_cache": "warm (existing on-disk cache)" if args.warm_cache else "cold (fresh cache directory)",
        "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "torch": torch.__version__,
        "commit": commit,
        "command": "python bench/lean_compile.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "caveat": "2-core machine shared with other jobs: absolute times are noisy; the variants alternate "
                  "pass by pass",
    }
    table = ["| variant | median ms per single-token pass | min ms |", "|---|---:|---:|"]
    table += [f"| {r['variant']} | {r['median_ms']:.1f} | {r['min_ms']:.1f} |" for r in rows]

    def plot(plt: Any) -> Any:
        fig, ax = plt.subplots(figsize=(5, 3))
        ax.bar([r["variant"] for r in rows], [r["median_ms"] for r in rows])
        ax.set_ylabel("ms per pass (median)")
        ax.set_title("lean int8: eager vs torch.compile'd MLP")
        return fig

    write_results(args.out, "lean_compile", "torch.compile of the lean int8 forward (SmolLM2-135M-Instruct, CPU)",
                  meta, rows, table, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
