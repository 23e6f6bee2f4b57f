"""Systematic comparison of the verifiers (seed 002 section 4, Tables 2-3 and 8-15) on our engine.

For every sampling setting, verifier and tree shape it decodes the same held-out prompts of five task kinds
(``bench/data/study_prompts.json``) with SmolLM2-135M-Instruct and the trained ``distilled`` draft, and
reports side by side:

* **measured** block efficiency (tokens per target pass) and tokens/s of the real decoding;
* **exact expected** block efficiency: for every recorded step, E[tau + 1 | drafted tree] computed by
  ``spec_ref.expected_block_efficiency`` from the target and draft laws the engine used at each node
  (eq. 3 for the OT methods, the closed forms for naive and BV; docs/algorithms.md sections 4-5), averaged
  over the steps. It removes the verifier's own randomness from the comparison, so rankings are not Monte
  Carlo noise of the acceptance draws. Traversal has no closed form; at K = 1 it equals BV in law (the test
  suite checks it by enumeration), so its chain value is BV's closed form, and on K >= 2 trees it is left
  out (enumerating its draws over V = 49152 is out of reach);
* acceptance by tree depth (why OT methods win near the root and lose deeper);
* for chains, BV's and naive's expectations on the *same* recorded trees (BV >= naive step by step);
* for multi-path trees, every OT method's exact expectation on the *same* recorded trees (those of the
  SpecInfer run of each setting and shape: i.i.d. and delayed trees are drawn the same way whatever the
  verifier), a paired comparison without trajectory noise, with the standard error of each difference.

The recording hook's own time (moving the laws to float64 NumPy) is subtracted from the measured time.

    python bench/study.py --quick   # 4 settings, one shape per method (about 6 minutes here)
    python bench/study.py           # 8 settings, 3-5 shapes per method (about an hour here)
    python bench/study.py --deep    # 4 settings, paths of 4 and 8 tokens (K = 2, 4)
    python bench/study.py --tables-from full/study.json deep/study.json   # one report of both runs

Both decode 1 prompt per task kind x 16 new tokens (``--prompts``, ``--max-new-tokens`` for more).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from bench._git import git_commit  # noqa: E402
from spec_fast.decoding import sampling_probs  # noqa: E402
from spec_fast.engine import DecodeState, SamplingParams, SpeculativeDecoder  # noqa: E402
from spec_fast.strategies import parse_strategy  # noqa: E402
from spec_ref.efficiency import expected_block_efficiency  # noqa: E402
from spec_ref.tree import DraftTree  # noqa: E402

PROMPTS_PATH = os.path.join(ROOT, "bench", "data", "study_prompts.json")
OT = ("nss", "naive_tree", "spectr", "specinfer", "khisti")
SINGLE = ("naive", "bv")
ALL_METHODS = SINGLE + OT + ("traversal",)
#: (temperature, top_p) of seed 002 section 4: T in 0.2..1.2 without nucleus, T = 1 with top-p 0.9, 0.99
SETTINGS = [(0.2, 1.0), (0.4, 1.0), (0.6, 1.0), (0.8, 1.0), (1.0, 1.0), (1.2, 1.0), (1.0, 0.9), (1.0, 0.99)]
QUICK_SETTINGS = [(0.2, 1.0), (0.6, 1.0), (1.0, 1.0), (1.0, 0.9)]


def load_prompts(path: str = PROMPTS_PATH) -> dict[str, list[str]]:
    with open(path) as fh:
        kinds: dict[str, list[str]] = json.load(fh)["kinds"]
    return kinds


@dataclass(frozen=True)
class StepRecord:
    """One row's verified tree at one step: the spec_ref tree (draft laws attached), the target law at
    each node ``[N, V]`` float64, the accepted depth the engine drew, and the context up to the root."""

    tree: DraftTree
    target: np.ndarray
    accepted_depth: int
    context: tuple[int, ...]


def row_tree(tokens: list[int], parents: list[int], draws: list[list[int]], valid: list[bool],
             draft_rows: np.ndarray | None, process: str) -> tuple[DraftTree, list[int]]:
    """The valid slots of one row of a FlatTree as a :class:`spec_ref.tree.DraftTree`; returns it and the
    slot of each of its nodes. ``draft_rows [N, V]`` are renormalised in float64 (the engine's are float32)."""
    slots = [s for s in range(len(tokens)) if valid[s]]
    index = {s: i for i, s in enumerate(slots)}
    laws: list[Any] = []
    for s in slots:
        row_draws = [t for t in draws[s] if t >= 0]
        if row_draws and draft_rows is not None and process != "deterministic":
            q = draft_rows[s].astype(np.float64)
            laws.append(q / q.sum())
        else:
            laws.append(None)
    tree = DraftTree(
        tokens=tuple(-1 if i == 0 else tokens[s] for i, s in enumerate(slots)),
        parents=tuple(-1 if i == 0 else index[parents[s]] for i, s in enumerate(slots)),
        draws=tuple(tuple(t for t in draws[s] if t >= 0) for s in slots),
        draft_probs=tuple(laws),
        process=process,
    )
    return tree, slots


def target_model(tree: DraftTree, target: np.ndarray) -> Any:
    """``prefix -> p`` over the nodes of ``tree`` (``target [N, V]`` in node order)."""
    by_prefix = {tree.path_tokens(i): target[i] for i in range(tree.num_nodes)}
    return lambda prefix: by_prefix[tuple(prefix)]


def expected_be(record: StepRecord, method: str) -> float:
    """E[tau + 1 | tree] of ``method`` on a recorded step (traversal on a chain: BV's, equal in law)."""
    if method == "traversal":
        if any(len(d) > 1 for d in record.tree.draws):
            return math.nan
        method = "bv"
    return float(expected_block_efficiency(record.tree, target_model(record.tree, record.target), method))


class RecordingDecoder(SpeculativeDecoder):
    """The engine unchanged, plus a record of every sampled verification step (:class:`StepRecord` per
    active row) and of the time the recording took (``record_s``), to subtract from the measured time."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.records: list[StepRecord] = []
        self.record_s = 0.0

    def _verify_phase(self, st: DecodeState, draft: Any, dual: Any, target_logits: torch.Tensor,
                      best: torch.Tensor | None = None) -> Any:
        verified = super()._verify_phase(st, draft, dual, target_logits, best)
        tree = draft.tree
        if st.sampling.greedy or tree.num_slots == 1:
            return verified
        start = time.perf_counter()
        p = sampling_probs(target_logits, st.sampling).double().cpu().numpy()
        q = draft.draft_probs.cpu().numpy() if draft.draft_probs is not None else None
        tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
        draws, valid = tree.draws.tolist(), tree.valid.tolist()
        depth = verified.accepted_depth.tolist()
        for b in range(tree.batch_size):
            if not st.active[b]:
                continue
            ref, slots = row_tree(tokens[b], parents[b], draws[b], valid[b], None if q is None else q[b],
                                  tree.process)
            target = p[b, slots]
            self.records.append(StepRecord(ref, target / target.sum(axis=1, keepdims=True), int(depth[b]),
                                           tuple(st.committed[b])))
        self.record_s += time.perf_counter() - start
        return verified


def depth_acceptance(records: list[StepRecord]) -> list[float]:
    """P(accepted depth >= d | the tree reaches depth d), d = 1, 2, ... (measured)."""
    out = []
    for d in range(1, max((r.tree.max_depth for r in records), default=0) + 1):
        reached = [r for r in records if r.tree.max_depth >= d]
        out.append(sum(r.accepted_depth >= d for r in reached) / len(reached) if reached else math.nan)
    return out


#: the run whose recorded multi-path trees every OT method is evaluated on (any OT run would do: the tree
#: drawing does not depend on the verifier)
PAIRED_HOST = "specinfer"


def paired_expectations(records: list[StepRecord]) -> dict[str, Any]:
    """Every OT method's exact E[tau + 1 | tree] on the same recorded trees: means, and the mean and standard
    error of each method's difference from SpecInfer's (paired over the trees)."""
    values = {m: np.array([expected_be(r, m) for r in records]) for m in OT}
    base = values[PAIRED_HOST]
    out: dict[str, Any] = {"trees": len(records), "mean": {m: float(v.mean()) for m, v in values.items()},
                           "minus_specinfer": {}, "se_minus_specinfer": {}}
    for m, v in values.items():
        diff = v - base
        out["minus_specinfer"][m] = float(diff.mean())
        out["se_minus_specinfer"][m] = float(diff.std(ddof=1) / math.sqrt(len(diff))) if len(diff) > 1 else math.nan
    return out


def run_config(target: Any, drafter: Any, prompts: list[list[int]], strategy: str, method: str,
               temperature: float, top_p: float, new_tokens: int, seed: int) -> dict[str, Any]:
    decoder = RecordingDecoder(target, drafter, parse_strategy(strategy, method))
    tokens = passes = 0
    elapsed = 0.0
    for i, prompt in enumerate(prompts):
        sampling = SamplingParams(temperature=temperature, top_p=top_p, seed=seed + i)
        start = time.perf_counter()
        result = decoder.generate([prompt], max_new_tokens=new_tokens, sampling=sampling)
        elapsed += time.perf_counter() - start
        tokens += result.metrics.generated_tokens
        passes += result.metrics.target_passes
    records = decoder.records
    chain = all(len(d) <= 1 for r in records for d in r.tree.draws)
    row: dict[str, Any] = {
        "strategy": strategy, "method": method, "temperature": temperature, "top_p": top_p,
        "tokens": tokens, "target_passes": passes, "steps_recorded": len(records),
        "measured_block_efficiency": tokens / max(passes, 1),
        "tokens_per_s": tokens / max(elapsed - decoder.record_s, 1e-9),
        "expected_block_efficiency": float(np.mean([expected_be(r, method) for r in records])) if records else math.nan,
        "mean_accepted_plus_one": float(np.mean([r.accepted_depth + 1 for r in records])) if records else math.nan,
        "sd_accepted": float(np.std([r.accepted_depth for r in records])) if records else math.nan,
        "depth_acceptance": depth_acceptance(records),
        "load_average_1min": round(os.getloadavg()[0], 2),  # tok/s of rows run under other load are not comparable
    }
    if not chain and records and method == PAIRED_HOST:
        row["paired"] = paired_expectations(records)
    if chain and records:  # BV vs naive on the same recorded trees (BV >= naive holds in expectation over
        # the drafted chain, not for every drafted chain: tests/study checks the former exactly)
        bv = [expected_be(r, "bv") for r in records]
        naive = [expected_be(r, "naive") for r in records]
        row["expected_bv_same_trees"] = float(np.mean(bv))
        row["expected_naive_same_trees"] = float(np.mean(naive))
        row["bv_ge_naive_share_of_trees"] = float(np.mean([b >= n - 1e-12 for b, n in zip(bv, naive)]))
    return row


def shapes(method: str, grid: str) -> list[str]:
    """The shapes each method runs. ``quick``: one per method. ``full``: chains of 1-3 tokens for the
    single-path methods, i.i.d. trees of K = 2-4 paths of 1-2 tokens (K = 1 is naive for every OT method)
    plus one delayed tree for the OT methods, sized so it takes about an hour on a 2-core CPU. ``deep``: the
    paths of 4 and 8 tokens the full grid leaves out (chains 4 and 8; K = 2 and 4 paths of 4 and 8 tokens)."""
    if grid == "deep":
        return ["chain:4", "chain:8"] if method in SINGLE else ["iid:2x4", "iid:4x4", "iid:2x8", "iid:4x8"]
    if method in SINGLE:
        return ["chain:2"] if grid == "quick" else ["chain:1", "chain:2", "chain:3"]
    if grid == "quick":
        return ["iid:2x2"]
    out = ["iid:2x1", "iid:2x2", "iid:3x2", "iid:4x2"]
    return out + (["delayed:2,1,1"] if method in OT else [])


def _fmt(value: float, digits: int = 2) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def tables(rows: list[dict[str, Any]], settings: list[tuple[float, float]]) -> list[str]:
    label = {s: (f"T={s[0]}" if s[1] >= 1.0 else f"T={s[0]}, p={s[1]}") for s in settings}
    lines = ["## Best shape per method (layout of seed 002 Tables 2-3)", "",
             "Each cell: measured block efficiency / exact expected block efficiency at the shape with the "
             "highest measured block efficiency (shape in brackets); then tokens/s at the fastest shape.", ""]
    lines += ["| method | " + " | ".join(label[s] for s in settings) + " |", "|---|" + "---|" * len(settings)]
    for method in ALL_METHODS:
        be_cells, tps_cells = [], []
        for s in settings:
            cands = [r for r in rows if r["method"] == method and (r["temperature"], r["top_p"]) == s]
            if not cands:
                be_cells.append("")
                tps_cells.append("")
                continue
            best = max(cands, key=lambda r: r["measured_block_efficiency"])
            fast = max(cands, key=lambda r: r["tokens_per_s"])
            be_cells.append(f"{best['measured_block_efficiency']:.2f} / {_fmt(best['expected_block_efficiency'])} "
                            f"({best['strategy']})")
            tps_cells.append(f"{fast['tokens_per_s']:.1f} ({fast['strategy']})")
        lines.append(f"| {method} BE | " + " | ".join(be_cells) + " |")
        lines.append(f"| {method} tok/s | " + " | ".join(tps_cells) + " |")
    lines += ["", "## Every configuration (layout of Tables 8-15, one block per setting)", ""]
    for s in settings:
        lines += [f"### {label[s]}", "", "| method | shape | measured BE | exact expected BE | mean tau+1 of the "
                  "recorded steps | tok/s | acceptance by depth | steps | load |", "|---|---|---:|---:|---:|---:|---|---:|---:|"]
        for r in rows:
            if (r["temperature"], r["top_p"]) != s:
                continue
            depth = " ".join(_fmt(a) for a in r["depth_acceptance"])
            lines.append(f"| {r['method']} | {r['strategy']} | {r['measured_block_efficiency']:.3f} | "
                         f"{_fmt(r['expected_block_efficiency'], 3)} | {_fmt(r['mean_accepted_plus_one'], 3)} | "
                         f"{r['tokens_per_s']:.2f} | {depth} | {r['steps_recorded']} | {r.get('load_average_1min', 'n/a')} |")
        lines.append("")
    paired = [r for r in rows if "paired" in r]
    if paired:
        lines += ["## Every OT method on the same recorded trees (exact, paired)", "",
                  "Exact E[tau + 1 | tree] of each OT method on the trees the SpecInfer run of that setting and "
                  "shape drafted (the drafting does not depend on the verifier, so these are the trees any OT "
                  "run would see). Each cell: the mean over the trees, then the mean difference from SpecInfer "
                  "on the same trees with its standard error. Pairing removes the trajectory noise that the "
                  "per-run columns above carry.", "",
                  "| setting | shape | trees | " + " | ".join(OT) + " | best |",
                  "|---|---|---:|" + "---|" * len(OT) + "---|"]
        for r in paired:
            pr = r["paired"]
            cells = []
            for m in OT:
                diff = "" if m == PAIRED_HOST else (f" ({pr['minus_specinfer'][m]:+.3f} ± "
                                                     f"{pr['se_minus_specinfer'][m]:.3f})")
                cells.append(f"{pr['mean'][m]:.3f}{diff}")
            best = max(OT, key=lambda m: pr["mean"][m])
            lines.append(f"| T={r['temperature']}, p={r['top_p']} | {r['strategy']} | {pr['trees']} | "
                         + " | ".join(cells) + f" | {best} |")
        lines.append("")
    chains = [r for r in rows if "expected_bv_same_trees" in r]
    lines += ["## BV vs naive on the same recorded chains", "",
              "E[tau + 1 | drafted chain] of BV and of naive on the trees one run drafted (BV's optimality holds "
              "in expectation over the drafted chain, so single trees can favour naive; the mean over the "
              "steps estimates the expectation).", "",
              "| setting | run | steps | BV | naive | BV - naive | share of trees with BV >= naive |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for r in chains:
        lines.append(f"| T={r['temperature']}, p={r['top_p']} | {r['method']} {r['strategy']} | {r['steps_recorded']} | "
                     f"{r['expected_bv_same_trees']:.3f} | {r['expected_naive_same_trees']:.3f} | "
                     f"{r['expected_bv_same_trees'] - r['expected_naive_same_trees']:+.3f} | "
                     f"{r['bv_ge_naive_share_of_trees']:.2f} |")
    lines.append("")
    return lines


def plot(rows: list[dict[str, Any]], settings: list[tuple[float, float]], out: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    plain = [s for s in settings if s[1] >= 1.0]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for method in ALL_METHODS:
        xs, ys = [], []
        for s in plain:
            cands = [r for r in rows if r["method"] == method and (r["temperature"], r["top_p"]) == s
                     and not math.isnan(r["expected_block_efficiency"])]
            if cands:
                xs.append(s[0])
                ys.append(max(r["expected_block_efficiency"] for r in cands))
        if xs:
            axes[0].plot(xs, ys, marker="o", label=method)
    axes[0].set(xlabel="temperature", ylabel="exact expected block efficiency (best shape)",
                title="Block efficiency vs temperature")
    axes[0].legend(fontsize=8)
    tree_rows = [r for r in rows if r["strategy"] == "iid:2x2" and (r["temperature"], r["top_p"]) == (1.0, 1.0)]
    for r in tree_rows or [r for r in rows if r["strategy"].startswith("iid")][:8]:
        axes[1].plot(range(1, len(r["depth_acceptance"]) + 1), r["depth_acceptance"], marker="o",
                     label=f"{r['method']} {r['strategy']} T={r['temperature']}")
    axes[1].set(xlabel="tree depth d", ylabel="P(accepted >= d | reached d)", title="Acceptance by depth")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "study.png"), dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4 settings, one shape per method")
    parser.add_argument("--deep", action="store_true", help="4 settings, paths of 4 and 8 tokens")
    parser.add_argument("--tables-from", nargs="+", default=None, metavar="JSON",
                        help="decode nothing: write study.md and study.png of these runs' study.json together")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per task kind")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--methods", default=",".join(ALL_METHODS))
    parser.add_argument("--draft", default="distilled", help="the draft (any --draft name of spec-fast generate)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "study"))
    parser.add_argument("--resume", action="store_true",
                        help="keep the configurations of a killed run's study.partial.json under --out, run the rest")
    args = parser.parse_args()
    if args.tables_from:
        runs = []
        for path in args.tables_from:
            with open(path) as fh:
                runs.append(json.load(fh))
        rows = [row for run in runs for row in run["results"]]
        present = {(r["temperature"], r["top_p"]) for r in rows}
        write_report(args.out, [run["meta"] for run in runs], rows, [s for s in SETTINGS if s in present])
        return
    torch.set_num_threads(args.threads)
    from spec_fast.drafts.heads import load_drafter
    from spec_fast.models import chat_prompt_ids, load_model

    per_kind = args.prompts or 1
    new_tokens = args.max_new_tokens or 16
    settings = QUICK_SETTINGS if args.quick or args.deep else SETTINGS
    grid = "quick" if args.quick else "deep" if args.deep else "full"
    methods = [m for m in args.methods.split(",") if m]
    target, tokenizer = load_model(device=args.device)
    drafter = load_drafter(args.draft, target)
    kinds = load_prompts()
    prompts = [chat_prompt_ids(tokenizer, p) for texts in kinds.values() for p in texts[:per_kind]]
    started = time.time()
    rows: list[dict[str, Any]] = []
    os.makedirs(args.out, exist_ok=True)
    partial = os.path.join(args.out, "study.partial.json")
    if args.resume and os.path.exists(partial):
        with open(partial) as fh:
            rows = json.load(fh)
    done = {(r["temperature"], r["top_p"], r["method"], r["strategy"]) for r in rows}
    resumed = len(rows)
    for temperature, top_p in settings:
        for method in methods:
            for strategy in shapes(method, grid):
                if (temperature, top_p, method, strategy) in done:
                    continue
                row = run_config(target, drafter, prompts, strategy, method, temperature, top_p, new_tokens,
                                 args.seed)
                rows.append(row)
                with open(partial, "w") as fh:  # a killed run keeps the configurations it finished
                    json.dump(rows, fh)
                print(f"T={temperature} p={top_p} {method} {strategy}: BE {row['measured_block_efficiency']:.3f} "
                      f"exact {row['expected_block_efficiency']:.3f} {row['tokens_per_s']:.2f} tok/s",
                      file=sys.stderr, flush=True)
    meta = {
        "command": "python bench/study.py " + " ".join(sys.argv[1:]),
        "commit": git_commit(),
        "hardware": f"{platform.machine()}, {os.cpu_count()} CPUs, device {args.device}",
        "torch": f"{torch.__version__}, {args.threads} thread(s)",
        "models": f"SmolLM2-135M-Instruct float32 (target) + the {args.draft} draft",
        "prompts": f"{per_kind} per kind x {len(kinds)} kinds ({', '.join(kinds)}), {new_tokens} new tokens, batch 1",
        "load average": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "wall seconds": round(time.time() - started, 1),
    }
    if resumed:
        meta["resumed"] = (f"{resumed} configurations kept from a killed run's study.partial.json; "
                           "wall seconds count this run only")
    with open(os.path.join(args.out, "study.json"), "w") as fh:
        json.dump({"meta": meta, "results": rows}, fh, indent=2)
    os.remove(partial)
    write_report(args.out, [meta], rows, settings)


def write_report(out: str, metas: list[dict[str, Any]], rows: list[dict[str, Any]],
                 settings: list[tuple[float, float]]) -> None:
    """``study.md`` (one metadata block per run that produced ``rows``) and ``study.png`` under ``out``."""
    lines = ["# Systematic comparison of the verifiers (seed 002 section 4) on SmolLM2-135M-Instruct", ""]
    for i, meta in enumerate(metas):
        if len(metas) > 1:
            lines += [f"Run {i + 1} of {len(metas)}:", ""]
        lines += [*(f"- {k}: {v}" for k, v in meta.items()), ""]
    lines += tables(rows, settings)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "study.md"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    plot(rows, settings, out)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
