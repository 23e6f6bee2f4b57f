"""What small host operations cost right after a decoding pass has streamed the weights through the caches.

A one-token pass of the default model reads ~97 MB of weights; the L3 of the machines we run on holds 32 MB or
less. This bench reads a buffer of ``S`` MB (a stand-in for the pass's weight stream), then times one small
operation, and the same operation again at once (warm), for:

* ``rms_norm``: ``torch.rms_norm`` over one row of 576 floats (the default model's final norm);
* ``layer check``: every decoder layer's ``native_weights()`` of the default model's lean forward (what a pass
  checked before it reused the kept layer stack, ``spec_fast/lean/watch.py``).

Medians over ``--repeats`` tries, 1 thread. ``python bench/cold_ops.py`` writes
``bench/results/cold_ops.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench._common import write_results  # noqa: E402
from bench._git import git_commit  # noqa: E402
from bench.kernel_blocks import ROOT  # noqa: E402
from bench.pass_width import cpu_model  # noqa: E402

SIZES_MB = (0, 8, 16, 32, 64, 96, 192)


def cold_and_warm(stream: torch.Tensor | None, op: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """Median seconds of ``op`` right after reading ``stream`` and of ``op`` again at once."""
    cold, warm = [], []
    for _ in range(repeats):
        if stream is not None:
            stream.sum()
        start = time.perf_counter()
        op()
        middle = time.perf_counter()
        op()
        warm.append(time.perf_counter() - middle)
        cold.append(middle - start)
    return statistics.median(cold), statistics.median(warm)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    from spec_fast.api import load_decoder
    from spec_fast.settings import resolve_settings

    target = load_decoder(resolve_settings(strategy="ar"))[0].target
    layers = list(target.model.layers)
    row, weight = torch.randn(1, 1, 576), torch.ones(576)
    ops: dict[str, Callable[[], Any]] = {
        "rms_norm": lambda: torch.rms_norm(row, (576,), weight, 1e-5),
        "layer check": lambda: [layer.native_weights() for layer in layers],
    }
    rows = []
    for size in SIZES_MB:
        stream = torch.ones(size * 2**20 // 4) if size else None
        for name, op in ops.items():
            cold, warm = cold_and_warm(stream, op, args.repeats)
            rows.append({"streamed_mb": size, "operation": name, "after_stream_us": cold * 1e6,
                         "warm_us": warm * 1e6, "ratio": cold / warm})
            print(f"{size} MB {name}: {cold * 1e6:.1f} us after the stream, {warm * 1e6:.1f} us warm", flush=True)
    table = ["Median microseconds of one call right after reading the buffer, and of the next call at once.", "",
             "| streamed MB | operation | after the stream (us) | warm (us) | ratio |", "|---:|---|---:|---:|---:|"]
    table += [f"| {r['streamed_mb']} | {r['operation']} | {r['after_stream_us']:.1f} | {r['warm_us']:.1f} | "
              f"{r['ratio']:.1f}x |" for r in rows]
    meta = {"command": "python bench/cold_ops.py " + " ".join(sys.argv[1:]), "commit": git_commit(ROOT),
            "hardware": f"{platform.machine()}, {cpu_model()}, {os.cpu_count()} CPUs, 1 torch thread",
            "model": f"SmolLM2-135M-Instruct lean forward ({len(layers)} layers)", "repeats": args.repeats,
            "caveat": "2-core machine shared with other jobs; one process"}

    def plot(plt: Any) -> Any:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for name in ops:
            ax.plot(SIZES_MB, [r["after_stream_us"] for r in rows if r["operation"] == name], marker="o",
                    label=f"{name}, after the stream")
            ax.plot(SIZES_MB, [r["warm_us"] for r in rows if r["operation"] == name], marker="x", linestyle="--",
                    label=f"{name}, warm")
        ax.set_xlabel("MB read just before")
        ax.set_ylabel("us per call")
        ax.legend(fontsize=7)
        return fig

    write_results(args.out, "cold_ops", "Small host operations after a weight-sized stream (1 thread)", meta, rows,
                  table, plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
