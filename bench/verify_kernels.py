"""Benchmark: time per verification call of ``spec_fast.verify_tree`` against ``spec_ref.verify`` and HF.

For every method, batch size B, vocabulary size V and tree size N it times one batched ``verify_tree`` call
(median of ``--repeats`` calls after one warm-up) and compares it with

* ``spec_ref.verify`` on the *same inputs* (same trees, probabilities and per-node uniforms), row by row.
  spec_ref's cost per row does not depend on B, so it is measured on the first ``--ref-rows`` rows of the
  largest batch (default 2) and scaled by B (``ref_rows_timed`` in the JSON says how many rows were timed);
* HF transformers' ``_speculative_sampling`` for the single-path case (the chain tree, method ``naive``):
  one call per row (it has no batch dimension), fed log-probabilities (it applies its own softmax).

Trees (``K`` i.i.d. paths of length ``L`` drafted from the per-node draft distributions, merged by token,
ancestors first): N = 8 -> K = 1, L = 7 (a chain); N = 32 -> K = 4, L = 7; N = 64 -> K = 8, L = 7 (slots
beyond the merged tree are padding). Distributions: ``softmax(3 * z)`` target logits with z ~ N(0, 1) and the
draft ``softmax(3 * z + noise)``, one pair per slot shared by all rows (a ``[B, N, V]`` stride-0 view, so
memory stays O(N V)); drafted tokens are sampled from the draft.

Writes ``bench/results/verify_kernels.{json,md,png}``. ``--quick`` runs a smaller grid.
Usage: ``python bench/verify_kernels.py [--quick] [--threads T] [--device cpu|cuda]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

import numpy as np
import torch
from tqdm import tqdm

import spec_ref
from bench._git import git_commit
from spec_fast import FlatTree, counter_uniforms, uniforms_per_node, verify_tree

RESULTS = Path(__file__).resolve().parent / "results"
TREE_SHAPES = {8: (1, 7), 32: (4, 7), 64: (8, 7)}
METHOD_CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("naive_tree", {}), ("nss", {}), ("spectr", {}), ("specinfer", {}), ("khisti", {}),
    ("naive", {}), ("bv", {}), ("tree_mc", {}), ("traversal", {}), ("traversal", {"sibling_model": "wr"}),
    ("greedy", {}),
]


def label(method: str, options: dict[str, Any]) -> str:
    return method + "".join(f"-{v}" for v in options.values())


class Workload:
    """One (V, N) setting: per-slot distributions, B_max sampled trees, FlatTree tensors."""

    def __init__(self, vocab: int, slots: int, batch: int, seed: int, device: torch.device) -> None:
        num_paths, length = TREE_SHAPES[slots]
        gen = torch.Generator().manual_seed(seed)
        z = torch.randn(slots, vocab, generator=gen)
        z = z.to(torch.float64)  # softmax in float64, then float32: row sums stay within 1e-7 of 1
        noise = torch.randn(slots, vocab, generator=gen).to(torch.float64)
        self.target = torch.softmax(3 * z, dim=-1).to(torch.float32)  # [N, V]
        self.draft = torch.softmax(3 * z + noise, dim=-1).to(torch.float32)
        self.target64 = self.target.to(torch.float64).numpy()
        self.draft64 = self.draft.to(torch.float64).numpy()
        cumulative = np.cumsum(self.draft64, axis=1)
        rng = np.random.default_rng(seed)
        self.trees: list[spec_ref.DraftTree] = []
        tokens = torch.full((batch, slots), -1, dtype=torch.long)
        parents = torch.full((batch, slots), -1, dtype=torch.long)
        depths = torch.full((batch, slots), -1, dtype=torch.long)
        draws = torch.full((batch, slots, num_paths), -1, dtype=torch.long)
        valid = torch.zeros(batch, slots, dtype=torch.bool)
        for b in range(batch):
            index: dict[tuple[int, ...], int] = {(): 0}
            order: list[tuple[int, ...]] = [()]
            node_draws: list[list[int]] = [[]]
            for _ in range(num_paths):
                prefix: tuple[int, ...] = ()
                for _ in range(length):
                    slot = index[prefix]
                    u = rng.random() * cumulative[slot, -1]
                    token = min(int(np.searchsorted(cumulative[slot], u, side="right")), vocab - 1)
                    node_draws[slot].append(token)
                    prefix = prefix + (token,)
                    if prefix not in index:
                        index[prefix] = len(order)
                        order.append(prefix)
                        node_draws.append([])
            n = len(order)
            tree = spec_ref.DraftTree(
                tokens=tuple(-1 if not pre else pre[-1] for pre in order),
                parents=tuple(-1 if not pre else index[pre[:-1]] for pre in order),
                draws=tuple(tuple(d) for d in node_draws),
                draft_probs=tuple(self.draft64[u] if node_draws[u] else None for u in range(n)),
            )
            self.trees.append(tree)
            tokens[b, :n] = torch.tensor(tree.tokens)
            parents[b, :n] = torch.tensor(tree.parents)
            depths[b, :n] = torch.tensor(tree.depths)
            valid[b, :n] = True
            for u in range(n):
                draws[b, u, : len(tree.draws[u])] = torch.tensor(tree.draws[u])
        self.flat = FlatTree(tokens, parents, depths, draws, valid).to(device)
        self.target_dev = self.target.to(device)
        self.draft_dev = self.draft.to(device)
        self.device = device
        self.max_depth = length

    def batch_tensors(self, batch: int) -> tuple[FlatTree, torch.Tensor, torch.Tensor]:
        f = self.flat
        flat = FlatTree(f.tokens[:batch], f.parents[:batch], f.depths[:batch], f.draws[:batch], f.valid[:batch])
        shape = (batch, *self.target_dev.shape)
        return flat, self.target_dev.unsqueeze(0).expand(shape), self.draft_dev.unsqueeze(0).expand(shape)

    def target_model(self, b: int) -> Any:
        tree = self.trees[b]
        table = {tree.path_tokens(u): self.target64[u] for u in range(tree.num_nodes)}
        return lambda prefix: table[tuple(prefix)]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_fast(work: Workload, method: str, options: dict[str, Any], batch: int, repeats: int) -> tuple[float, torch.Tensor]:
    flat, target, draft = work.batch_tensors(batch)
    m = uniforms_per_node(method, flat.max_draws, **options)
    uniforms = counter_uniforms(torch.arange(batch), 0, (batch, flat.num_slots, m), work.device)
    verify_tree(method, flat, target, draft, uniforms, max_depth=work.max_depth, **options)  # warm-up, validated
    times = []
    for _ in range(repeats):
        sync(work.device)
        start = time.perf_counter()
        # timed as the engine calls it: inputs already checked, no validation syncs
        out = verify_tree(method, flat, target, draft, uniforms, max_depth=work.max_depth, validate=False, **options)
        sync(work.device)
        times.append(time.perf_counter() - start)
    return statistics.median(times), out.accepted_depth.float().mean().cpu()


def time_reference(work: Workload, method: str, options: dict[str, Any], rows: int) -> float:
    """Mean seconds per row of spec_ref.verify with the same per-node uniforms (rows 0..rows-1)."""
    flat = work.flat
    m = uniforms_per_node(method, flat.max_draws, **options)
    uniforms = counter_uniforms(torch.arange(flat.batch_size), 0, (flat.batch_size, flat.num_slots, m)).to(torch.float64).numpy()
    total = 0.0
    for b in range(rows):
        tree = work.trees[b]
        source = spec_ref.NodeReplaySource(uniforms[b, : tree.num_nodes]) if m else None
        model = work.target_model(b)
        start = time.perf_counter()
        spec_ref.verify(tree, model, method, source, **options)
        total += time.perf_counter() - start
    return total / rows


def time_hf(work: Workload, batch: int, repeats: int) -> float | None:
    """HF _speculative_sampling on path 0 of each row (the chain case), one call per row."""
    try:
        from transformers.generation.utils import _speculative_sampling
    except ImportError:  # pragma: no cover - transformers is installed in this project
        return None
    calls = []
    for b in range(batch):
        tree = work.trees[b]
        nodes = [0]
        while tree.draws[nodes[-1]]:
            child = tree.child(nodes[-1], tree.draws[nodes[-1]][0])
            assert child is not None
            nodes.append(child)
        gamma = len(nodes) - 1
        ids = torch.tensor([[tree.tokens[u] for u in nodes[1:]]], device=work.device)
        index = torch.tensor(nodes, device=work.device)
        candidate_logits = work.draft_dev[index[:-1]].log().unsqueeze(0)  # [1, gamma, V]
        new_logits = work.target_dev[index].log().unsqueeze(0)  # [1, gamma + 1, V]
        calls.append((ids, candidate_logits, gamma, new_logits))
    for args in calls[:1]:
        _speculative_sampling(*args)  # warm-up
    times = []
    for _ in range(repeats):
        sync(work.device)
        start = time.perf_counter()
        for args in calls:
            _speculative_sampling(*args)
        sync(work.device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise SystemExit(f"verify_kernels: {flag} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise SystemExit(f"verify_kernels: {flag} values must be >= 1, got {text!r}")
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller grid: V=49152, B in {1, 64}, N in {8, 32}")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ref-rows", type=int, default=2, help="rows of spec_ref timed per (method, V, N)")
    parser.add_argument("--vocab", default=None,
                        help="comma-separated vocabulary sizes (default 49152,151936; 49152 with --quick), e.g. "
                             "262144 for Gemma 3")
    parser.add_argument("--batch", default=None, help="comma-separated batch sizes (default 1,16,64; 1,64 with --quick)")
    parser.add_argument("--slots", default=None, help="comma-separated tree sizes N in {8,32,64} (default all; 8,32 with --quick)")
    parser.add_argument("--out", default=str(RESULTS / "verify_kernels"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    vocabs = _ints(args.vocab, "--vocab") if args.vocab else ([49152] if args.quick else [49152, 151936])
    batches = _ints(args.batch, "--batch") if args.batch else ([1, 64] if args.quick else [1, 16, 64])
    slot_counts = _ints(args.slots, "--slots") if args.slots else ([8, 32] if args.quick else [8, 32, 64])
    if not set(slot_counts) <= {8, 32, 64}:
        parser.error(f"--slots must be among 8, 32, 64, got {slot_counts}")
    rows: list[dict[str, Any]] = []
    grid = [(v, n) for v in vocabs for n in slot_counts]
    progress = tqdm(total=len(grid) * len(METHOD_CONFIGS), desc="verify_kernels")
    for vocab, slots in grid:
        work = Workload(vocab, slots, max(batches), seed=vocab + slots, device=device)
        for method, options in METHOD_CONFIGS:
            ref_rows = min(args.ref_rows, max(batches))
            ref_per_row = time_reference(work, method, options, ref_rows)
            for batch in batches:
                fast, mean_tau = time_fast(work, method, options, batch, args.repeats)
                hf = time_hf(work, batch, args.repeats) if (method == "naive" and slots == 8) else None
                rows.append({
                    "method": label(method, options), "V": vocab, "N": slots, "B": batch,
                    "fast_s": fast, "ref_s": ref_per_row * batch, "ref_rows_timed": ref_rows,
                    "speedup_vs_ref": ref_per_row * batch / fast,
                    "hf_s": hf, "speedup_vs_hf": (hf / fast) if hf else None, "mean_tau": float(mean_tau),
                })
            progress.update(1)
    progress.close()
    meta = {
        "device": str(device), "torch": torch.__version__, "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
        "load_average_at_end": os.getloadavg(),
        "quick": args.quick, "repeats": args.repeats,
        "command": "python bench/verify_kernels.py " + " ".join(sys.argv[1:]), "commit": git_commit(),
        "note": "spec_ref timed on ref_rows_timed rows per (method, V, N) and scaled by B; HF looped per row",
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    out.with_suffix(".md").write_text(markdown(meta, rows))
    plot(rows, out.with_suffix(".png"))
    print(markdown(meta, rows))


def markdown(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    lines = [
        "# verify_kernels benchmark", "",
        f"device {meta['device']} ({meta['cpu_count']} cores, load average at the end {meta['load_average_at_end']}), "
        f"torch {meta['torch']}, {meta['threads']} thread(s), median of {meta['repeats']}; "
        f"{meta['note']}.", "",
        "| method | V | N | B | spec_fast ms | spec_ref ms | x vs spec_ref | HF ms | x vs HF | mean tau |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        hf = f"{r['hf_s'] * 1e3:.2f}" if r["hf_s"] else ""
        xhf = f"{r['speedup_vs_hf']:.2f}" if r["speedup_vs_hf"] else ""
        lines.append(
            f"| {r['method']} | {r['V']} | {r['N']} | {r['B']} | {r['fast_s'] * 1e3:.2f} | {r['ref_s'] * 1e3:.1f} | "
            f"{r['speedup_vs_ref']:.1f} | {hf} | {xhf} | {r['mean_tau']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    vocabs = sorted({r["V"] for r in rows})
    methods = list(dict.fromkeys(r["method"] for r in rows))
    batch = max(r["B"] for r in rows)
    fig, axes = plt.subplots(1, len(vocabs), figsize=(7 * len(vocabs), 4.5), squeeze=False)
    for ax, vocab in zip(axes[0], vocabs):
        slot_counts = sorted({r["N"] for r in rows if r["V"] == vocab})
        width = 0.8 / len(slot_counts)
        for i, slots in enumerate(slot_counts):
            values = [
                next((r["speedup_vs_ref"] for r in rows if r["method"] == m and r["V"] == vocab and r["N"] == slots and r["B"] == batch), 0.0)
                for m in methods
            ]
            ax.bar(np.arange(len(methods)) + i * width, values, width, label=f"N={slots}")
        ax.axhline(10, color="k", linestyle="--", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_xticks(np.arange(len(methods)) + 0.4 - width / 2)
        ax.set_xticklabels(methods, rotation=45, ha="right")
        ax.set_ylabel(f"speed-up vs spec_ref at B={batch}")
        ax.set_title(f"V={vocab}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
