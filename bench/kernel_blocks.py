"""The block-quantised product (``spec_fast/lean/blocks.c``) against the same file at another commit, side by side.

Builds the native kernels from the working tree and from ``--baseline`` (a git revision; its ``spec_fast/lean``
C sources are read with ``git show``) into temporary folders, then times ``mm_blocks`` on SmolLM2-shaped
Q4_1 and Q8_0 weights for each row count ``M``: the two builds alternate within every round and the best round
counts (1 thread). Reports GMAC/s (multiply-adds per second), the weight bytes read per second, and whether
each build's rows are independent (a row's result alone equals its result among the others, bit for bit).

    python bench/kernel_blocks.py --baseline e801824      # writes bench/results/kernel_blocks.{json,md,png}

``--baseline amx-off`` compares this commit's build with itself, its AMX tiles switched off (``native.amx``)
against on: the tiles' speed from the same sources (a build of another commit cannot load where the kernels'
version changed).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench._common import write_results  # noqa: E402
from bench._git import git_commit  # noqa: E402
from spec_fast.lean import native  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SOURCES = ("kernels.c", "blocks.c", "layer.c")
#: SmolLM2-135M's product shapes (out, in): the MLP's up/gate and down, and the LM head (its Q8_0 embedding)
SHAPES = {"q4_1": [(1536, 576), (576, 1536)], "q8_0": [(49152, 576)]}
ROWS = (1, 2, 3, 4, 5, 8, 16, 64, 256)


def build(sources: dict[str, str], folder: str) -> Any:
    for name, text in sources.items():
        with open(os.path.join(folder, name), "w") as fh:
            fh.write(text)
    saved = native._SOURCES
    native._SOURCES = tuple(os.path.join(folder, name) for name in SOURCES)
    try:
        return native.build(os.path.join(folder, "lib"), "native")
    finally:
        native._SOURCES = saved


def sources_at(revision: str) -> dict[str, str]:
    """The kernels' C sources at a git revision (a ``ValueError`` with git's message when it has none)."""
    try:
        return {n: subprocess.run(["git", "show", f"{revision}:spec_fast/lean/{n}"], cwd=ROOT, check=True,
                                  capture_output=True, text=True).stdout for n in SOURCES}
    except subprocess.CalledProcessError as err:
        raise ValueError(err.stderr.strip()) from None


def working_sources() -> dict[str, str]:
    """The kernels' C sources in the working tree."""
    return {n: open(os.path.join(ROOT, "spec_fast", "lean", n)).read() for n in SOURCES}


def both_sources(revision: str) -> tuple[dict[str, str], dict[str, str]] | None:
    """(the working tree's kernel sources, those at ``revision``), or None after printing why git has none."""
    try:
        baseline = sources_at(revision)
    except ValueError as err:
        print(f"error: --baseline {revision!r}: {err}", file=sys.stderr)
        return None
    return working_sources(), baseline


def weight(kind: str, out_features: int, in_features: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(out_features + in_features)
    groups = in_features // 32
    scales = (torch.rand(out_features, groups, generator=gen) * 0.01).half().float()
    if kind == "q4_1":
        values = torch.randint(0, 16, (out_features, in_features), dtype=torch.uint8, generator=gen)
        return native.pack_blocks(kind, values, scales, (torch.rand(out_features, groups, generator=gen) * -0.05).half().float())
    values = torch.randint(-128, 128, (out_features, in_features), dtype=torch.int8, generator=gen)
    return native.pack_blocks(kind, values, scales, None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True,
                        help="git revision whose C sources are the baseline, or amx-off (this build, AMX off)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    current = working_sources()
    amx_off = args.baseline == "amx-off"
    try:
        baseline = current if amx_off else sources_at(args.baseline)
    except ValueError as err:
        print(f"error: --baseline {args.baseline!r}: {err}", file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        mine = build(current, b)
        libs = {"baseline": mine if amx_off else build(baseline, a), "this commit": mine}
        # with amx-off, each timing of the baseline switches the tiles off and each of this commit on
        tiles = {"baseline": False, "this commit": True} if amx_off else {"baseline": None, "this commit": None}
        for kind, shapes in SHAPES.items():
            for out_features, in_features in shapes:
                packed = weight(kind, out_features, in_features)
                bytes_read = packed.numel()
                probe = torch.randn(24, in_features)  # a chunk of 16 rows (AMX where allowed) and 8 more
                independent = {}
                for name, lib in libs.items():
                    with native.using(lib):
                        native.amx(tiles[name])
                        whole = native.mm_blocks(kind, probe, packed, out_features)
                        independent[name] = all(torch.equal(native.mm_blocks(kind, probe[i:i + 1], packed,
                                                                             out_features), whole[i:i + 1])
                                                for i in range(24))
                for m in ROWS:
                    x = torch.randn(m, in_features)
                    reps = max(3, int(4e8 // (m * out_features * in_features)))
                    best = {name: float("inf") for name in libs}
                    for _ in range(args.rounds):
                        for name, lib in libs.items():
                            with native.using(lib):
                                native.amx(tiles[name])
                                native.mm_blocks(kind, x, packed, out_features)
                                start = time.perf_counter()
                                for _ in range(reps):
                                    native.mm_blocks(kind, x, packed, out_features)
                                best[name] = min(best[name], (time.perf_counter() - start) / reps)
                    for name, seconds in best.items():
                        rows.append({"kind": kind, "out": out_features, "in": in_features, "rows": m, "build": name,
                                     "us": seconds * 1e6, "gmac_per_s": m * out_features * in_features / seconds / 1e9,
                                     "weight_gb_per_s": bytes_read / seconds / 1e9,
                                     "rows_independent": independent[name]})
                    ratio = best["baseline"] / best["this commit"]
                    print(f"{kind} {out_features}x{in_features} M={m}: {ratio:.2f}x", file=sys.stderr)
    table = ["Best of the rounds, 1 thread; speedup = baseline time / this commit's time.", "",
             "| weight | rows | baseline us | this commit us | speedup | baseline GMAC/s | this commit GMAC/s | "
             "this commit weight GB/s |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for kind, shapes in SHAPES.items():
        for out_features, in_features in shapes:
            for m in ROWS:
                pick = {r["build"]: r for r in rows if (r["kind"], r["out"], r["in"], r["rows"]) ==
                        (kind, out_features, in_features, m)}
                base, mine = pick["baseline"], pick["this commit"]
                table.append(f"| {kind} {out_features}x{in_features} | {m} | {base['us']:.1f} | {mine['us']:.1f} | "
                             f"{base['us'] / mine['us']:.2f}x | {base['gmac_per_s']:.1f} | {mine['gmac_per_s']:.1f} | "
                             f"{mine['weight_gb_per_s']:.1f} |")
    table += ["", "Rows independent (bit for bit) in both builds: "
              + str(all(r["rows_independent"] for r in rows))]
    meta = {"command": "python bench/kernel_blocks.py " + " ".join(sys.argv[1:]), "commit": git_commit(),
            "baseline": args.baseline, "hardware": f"{platform.machine()}, {os.cpu_count()} CPUs",
            "torch": torch.__version__, "load average": ", ".join(f"{v:.2f}" for v in os.getloadavg()),
            "caveat": "2-core machine shared with other jobs: read the side-by-side ratios"}

    def plot(plt: Any) -> Any:
        fig, ax = plt.subplots(figsize=(7, 4))
        for name in ("baseline", "this commit"):
            sub = [r for r in rows if r["build"] == name and (r["kind"], r["out"]) == ("q4_1", 1536)]
            ax.plot([r["rows"] for r in sub], [r["gmac_per_s"] for r in sub], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("rows (tokens in the pass)")
        ax.set_ylabel("GMAC/s, Q4_1 1536x576, 1 thread")
        ax.legend()
        return fig

    write_results(args.out, "kernel_blocks", "Block-quantised products: this commit against a baseline (1 thread)",
                  meta, rows, table, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
