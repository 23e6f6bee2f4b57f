"""Tables, plots and the NDE selector of bench/study_regimes.py, from its saved rows (``rows.json`` + ``rows.npz``).

Layouts (seed 002, methods as rows, acceptance regimes as columns where the seed has models):

* Table 2 / 3: each method at its best i.i.d. shape (chains for naive and BV; K x L with K <= 4,
  L <= 8 for the others), chosen per (regime, setting) on the mean over roots, by block efficiency (Table 2)
  or by offline throughput E / T_hat (Table 3); the cell averages the settings. Standard errors are over
  roots (each root's value averaged over the settings first). Picking the best of many shapes on the same
  roots biases each cell up a little (the same for every method).
* Tables 4-7: the NDE selector (spec_fast.nde.selector_training, unchanged) per OT method, trained on four
  folds of prompts and scored on the fifth (every root scored out of fold), against the method's best
  static shape (chosen on the training folds per regime and setting) and Traversal's best static shape.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

import numpy as np

from bench.study_regimes import ACTIONS, INDEX, K_MAX, L2_MAX, METHODS, OT, SINGLE

FOLDS = 5


def tiny_model() -> tuple[Any, list[list[int]]]:
    """A seeded random Llama (V = 64, 2 layers) and 5 prompts of token ids, for ``--quick``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = LlamaForCausalLM(config)
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 64, (6,), generator=generator).tolist() for _ in range(5)]
    return model, prompts


# ----------------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------------
class Rows:
    """The saved rows: ``meta``, per-row fields, ``be[method] [N, A]`` (chains: ``[N, 13]`` by length)."""

    def __init__(self, out: str) -> None:
        with open(os.path.join(out, "rows.json")) as fh:
            data = json.load(fh)
        self.meta: dict[str, Any] = data["meta"]
        self.rows: list[dict[str, Any]] = data["rows"]
        arrays = np.load(os.path.join(out, "rows.npz"))
        self.arrays = {k: arrays[k] for k in arrays.files}
        # a chain of L1max + L2max tokens (index 12 of naive/BV, Traversal's (1, 4, 8)) is not evaluated: NaN
        # (runs before this was written stored 0 there)
        self.be = {m: np.where(self.arrays[f"be_{m}"] > 0, self.arrays[f"be_{m}"], np.nan) for m in METHODS}
        self.regimes = sorted({r["regime"] for r in self.rows})
        self.settings = sorted({(r["temperature"], r["top_p"]) for r in self.rows}, key=lambda s: (s[1] < 1, s[0]))
        self.roots = sorted({(r["prompt"], r["root"]) for r in self.rows})
        self.draft_cost = float(self.meta["draft_cost"])

    def mask(self, regime: float | None = None, setting: tuple[float, float] | None = None,
             prompts: set[int] | None = None) -> np.ndarray:
        return np.array([(regime is None or r["regime"] == regime)
                         and (setting is None or (r["temperature"], r["top_p"]) == setting)
                         and (prompts is None or r["prompt"] in prompts) for r in self.rows])

    def root_ids(self) -> np.ndarray:
        index = {root: i for i, root in enumerate(self.roots)}
        return np.array([index[(r["prompt"], r["root"])] for r in self.rows])


def latency(draft_cost: float) -> np.ndarray:
    """T_hat of eq. 11 for every action: t_p = 1 (one target pass), t_q = ``draft_cost`` per draft step."""
    from spec_ref.selector import latency_table

    return np.asarray(latency_table(0, ACTIONS, lambda _: draft_cost, lambda _: 1.0), dtype=np.float64)


def shape_table(rows: Rows, method: str, delayed: bool = False) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """``(E [N, S], T [S], names)`` of the i.i.d. shapes a method runs in Tables 2-3 (chains of 0..8 tokens
    for naive and BV; K x L trees, K = 1..4, L = 0..8, for the others)."""
    lat = latency(rows.draft_cost)
    if method in SINGLE:
        lengths = list(range(L2_MAX + 1))
        return rows.be[method][:, lengths], np.array([1.0 + rows.draft_cost * n for n in lengths]), \
            [f"chain:{n}" for n in lengths]
    if delayed:  # every (K, L1, L2) of the action space
        return rows.be[method], lat, [f"delayed:{k},{l1},{l2}" for k, l1, l2 in ACTIONS]
    picks = [INDEX[(k, 0, n)] for k in range(1, K_MAX + 1) for n in range(L2_MAX + 1)]
    names = [f"iid:{k}x{n}" for k in range(1, K_MAX + 1) for n in range(L2_MAX + 1)]
    return rows.be[method][:, picks], lat[picks], names


def _se(values: np.ndarray) -> float:
    return float(values.std(ddof=1) / math.sqrt(values.size)) if values.size > 1 else math.nan


def best_static(rows: Rows, method: str, regime: float, by: str, delayed: bool = False) -> dict[str, Any]:
    """Best i.i.d. (or any delayed) shape per setting (on all roots) at one regime; per-root values averaged
    over settings."""
    values, lat, names = shape_table(rows, method, delayed)
    root_ids = rows.root_ids()
    per_root = np.zeros(len(rows.roots))
    counts = np.zeros(len(rows.roots))
    shapes = []
    for setting in rows.settings:
        m = rows.mask(regime, setting)
        if not m.any():
            continue
        score = values[m] / lat if by == "tps" else values[m]
        best = int(np.nanargmax(score.mean(axis=0)))
        shapes.append(names[best])
        v = values[m, best] / lat[best] if by == "tps" else values[m, best]
        np.add.at(per_root, root_ids[m], v)
        np.add.at(counts, root_ids[m], 1)
    per_root = per_root[counts > 0] / counts[counts > 0]
    return {"mean": float(per_root.mean()), "se": _se(per_root), "per_root": per_root, "shapes": shapes}


def depth_acceptance(rows: Rows, method: str, regime: float, k: int) -> list[float]:
    """P(accepted >= d) / P(accepted >= d - 1), d = 1..8, on the i.i.d. (k, 0, 8) trees of a regime."""
    if method in SINGLE:
        return []
    mass = rows.arrays[f"depth_mass_{method}"][rows.mask(regime), k - 1].mean(axis=0)
    return [float(mass[d] / mass[d - 1]) if mass[d - 1] > 0 else math.nan for d in range(1, mass.size)]


def fmt(value: float, digits: int = 2) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


# ----------------------------------------------------------------------------------------------------
# NDE (Tables 4-7)
# ----------------------------------------------------------------------------------------------------
def nde(rows: Rows, method: str, steps: int) -> dict[str, Any]:
    """Out-of-fold NDE choices for ``method`` and the static / Traversal baselines chosen on training folds
    (over the whole action space, delayed trees included).

    Returns per-row arrays E and E/T of: ``nde``, ``static_be`` / ``static_tps`` (the method's best action by
    block efficiency / throughput per regime and setting on the training folds), ``traversal_be`` /
    ``traversal_tps`` (Traversal's), and the actions NDE chose."""
    import torch

    from spec_fast.nde.selector_training import SelectorData, TrainSettings, static_baselines, train_selector

    torch.set_num_threads(1)
    lat = latency(rows.draft_cost)
    n = len(rows.rows)
    hidden_prev = torch.from_numpy(rows.arrays["hidden_prev"].astype(np.float32))
    data = SelectorData(hidden_prev, hidden_prev.clone(), torch.from_numpy(rows.arrays["hidden_root"].astype(np.float32)),
                        torch.from_numpy(rows.arrays["scalars"]).float(), torch.from_numpy(rows.be[method]),
                        torch.from_numpy(np.tile(lat, (n, 1))), torch.tensor([r["prompt"] for r in rows.rows]),
                        ACTIONS, {})
    fold_of = np.array([(r["prompt"] // 2) % FOLDS for r in rows.rows])
    out: dict[str, np.ndarray] = {name: np.full(n, math.nan) for name in
                                  ("nde_e", "nde_t", "static_be_e", "static_tps_e", "static_tps_t",
                                   "traversal_be_e", "traversal_tps_e", "traversal_tps_t")}
    chosen = np.zeros(n, dtype=np.int64)
    seconds = 0.0
    for fold in range(FOLDS):
        held = np.flatnonzero(fold_of == fold)
        train = np.flatnonzero(fold_of != fold)
        if held.size == 0 or train.size == 0:
            continue
        train_rows = torch.from_numpy(train)
        start = time.perf_counter()
        baselines = static_baselines(data, train_rows)
        net, _ = train_selector(data, train_rows, baselines, TrainSettings(steps=steps), progress=False)
        seconds += time.perf_counter() - start
        with torch.no_grad():
            picks = net.select(data.features(torch.from_numpy(held))).numpy()
        chosen[held] = picks
        out["nde_e"][held] = rows.be[method][held, picks]
        out["nde_t"][held] = lat[picks]
        in_train = np.zeros(n, dtype=bool)
        in_train[train] = True
        for regime in rows.regimes:
            for setting in rows.settings:
                m = rows.mask(regime, setting)
                fit, score = m & in_train, np.intersect1d(np.flatnonzero(m), held)
                if not fit.any() or score.size == 0:
                    continue
                for who, table in (("static", rows.be[method]), ("traversal", rows.be["traversal"])):
                    by_be = int(np.nanargmax(table[fit].mean(axis=0)))
                    by_tps = int(np.nanargmax((table[fit] / lat).mean(axis=0)))
                    out[f"{who}_be_e"][score] = table[score, by_be]
                    out[f"{who}_tps_e"][score] = table[score, by_tps]
                    out[f"{who}_tps_t"][score] = lat[by_tps]
    return {**out, "chosen": chosen, "train_seconds": round(seconds, 1)}


def _ratio(rows: Rows, regime: float, num: np.ndarray, den: np.ndarray) -> tuple[float, float]:
    """mean(num) / mean(den) over a regime's rows, and the SE of that ratio (delta method over roots)."""
    m = rows.mask(regime) & np.isfinite(num) & np.isfinite(den)  # rows without a baseline (none fitted) drop out
    ids = rows.root_ids()[m]
    a = np.bincount(ids, weights=num[m]) / np.maximum(np.bincount(ids), 1)
    b = np.bincount(ids, weights=den[m]) / np.maximum(np.bincount(ids), 1)
    keep = np.bincount(ids) > 0
    a, b = a[keep], b[keep]
    ratio = a.mean() / b.mean()
    resid = (a - ratio * b) / b.mean()
    return float(ratio), _se(resid)


# ----------------------------------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------------------------------
def report(out: str, args: Any) -> None:
    rows = Rows(out)
    meta = rows.meta
    label = {r: f"{r:g}" for r in rows.regimes}
    achieved = {r: float(np.mean([x["root_acceptance"] for x in rows.rows if x["regime"] == r])) for r in rows.regimes}
    lines = ["# Seed 002's comparison across acceptance regimes (controlled drafts)", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items() if k != "strengths"]
    loads = [x["load_average_1min"] for x in rows.rows if "load_average_1min" in x]
    if loads:
        lines.append(f"- 1-minute load average while the rows ran: {min(loads):.1f}-{max(loads):.1f} (2 cores shared)")
    lines += ["", "The draft is the rank-permuted mixture q = (1 - eps) p + eps r of spec_ref.controlled_draft (r: p's "
              "masses moved between the tokens of its support by a seeded rank permutation), "
              "built from the target's own law at every node: it costs a target pass per drafted token, so "
              "nothing here is a speed claim. Throughput is offline E / T_hat with eq. 11 (t_p = 1 target pass, "
              f"t_q = {rows.draft_cost} per draft step).", "",
              "## Regimes", "",
              "| regime (target root acceptance) | " + " | ".join(f"T={s[0]}, top-p={s[1]}" for s in rows.settings)
              + " | mean root acceptance |", "|---|" + "---|" * (len(rows.settings) + 1)]
    for r in rows.regimes:
        cells = []
        for s in rows.settings:
            sel = [x for x in rows.rows if x["regime"] == r and (x["temperature"], x["top_p"]) == s]
            if sel:
                cells.append(f"eps {sel[0]['eps']:.3f}, acceptance {np.mean([x['root_acceptance'] for x in sel]):.3f}")
            else:
                cells.append("")
        lines.append(f"| {label[r]} | " + " | ".join(cells) + f" | {achieved[r]:.3f} |")
    removed = {s: np.mean([x["removed_mass"] for x in rows.rows if (x["temperature"], x["top_p"]) == s])
               for s in rows.settings}
    lines += ["", "Top-k truncation of the target law (mean mass removed per node): "
              + ", ".join(f"T={s[0]}, top-p={s[1]}: {removed[s]:.4f}" for s in rows.settings) + ".", ""]
    # ---- Tables 2-3
    tables: dict[str, dict[str, dict[float, dict[str, Any]]]] = {}
    for by, title in (("be", "Table 2 layout: block efficiency at the best i.i.d. shape (exact E[tau+1] on the drawn trees)"),
                      ("tps", "Table 3 layout: offline throughput E / T_hat at the best i.i.d. shape (tokens per target-pass time)")):
        tables[by] = {m: {r: best_static(rows, m, r, by) for r in rows.regimes} for m in METHODS}
        lines += [f"## {title}", "", "Mean +- standard error over roots; in brackets the shape chosen at each setting, in the order of the "
                  "regimes table (chains: tokens; trees: K x L).", "",
                  "| method | " + " | ".join(f"acceptance {label[r]}" for r in rows.regimes) + " |",
                  "|---|" + "---|" * len(rows.regimes)]
        order = sorted(METHODS, key=lambda m: np.mean([tables[by][m][r]["mean"] for r in rows.regimes]))
        for m in order:
            cells = []
            for r in rows.regimes:
                cell = tables[by][m][r]
                cells.append(f"{cell['mean']:.3f} +- {cell['se']:.3f} ({', '.join(s.split(':')[1] for s in cell['shapes'])})")
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        lines.append("")
    # ---- Traversal's lead
    lines += ["## Traversal against the best other method (paired over roots)", "",
              "| regime | by | Traversal | best other | other | gain | gain % +- SE |", "|---|---|---|---|---|---|---|"]
    leads: dict[str, dict[float, tuple[str, float, float]]] = {"be": {}, "tps": {}}
    for by in ("be", "tps"):
        for r in rows.regimes:
            others = [m for m in METHODS if m != "traversal"]
            second = max(others, key=lambda m: tables[by][m][r]["mean"])
            t, o = tables[by]["traversal"][r]["per_root"], tables[by][second][r]["per_root"]
            diff = (t - o) / o.mean()
            leads[by][r] = (second, 100 * float(diff.mean()), 100 * _se(diff))
            lines.append(f"| {label[r]} | {by} | {t.mean():.3f} | {second} | {o.mean():.3f} | {t.mean() - o.mean():+.3f} | "
                         f"{100 * diff.mean():+.1f}% +- {100 * _se(diff):.1f}% |")
    lines.append("")
    # ---- delayed expansion
    lines += ["## Delayed expansion (seed 002 section 5): best (K, L1, L2) against best i.i.d. K x L", "",
              "Best static shape per setting over the whole action space (K <= 4, L1 <= 4, L2 <= 8) against the best "
              "i.i.d. tree, same roots; gain in % of the i.i.d. value, paired over roots.", "",
              "| method | by | " + " | ".join(f"acceptance {label[r]}" for r in rows.regimes) + " |",
              "|---|---|" + "---|" * len(rows.regimes)]
    delayed_gain: dict[str, dict[str, dict[float, tuple[float, float]]]] = {}
    for m in OT + ("traversal",):
        for by in ("be", "tps"):
            cells = []
            for r in rows.regimes:
                d = best_static(rows, m, r, by, delayed=True)
                diff = (d["per_root"] - tables[by][m][r]["per_root"]) / tables[by][m][r]["mean"]
                delayed_gain.setdefault(m, {}).setdefault(by, {})[r] = (100 * float(diff.mean()), 100 * _se(diff))
                cells.append(f"{d['mean']:.3f} ({100 * diff.mean():+.1f}% +- {100 * _se(diff):.1f}%; "
                             f"{', '.join(s.split(':')[1] for s in d['shapes'])})")
            lines.append(f"| {m} | {by} | " + " | ".join(cells) + " |")
    lines.append("")
    # ---- acceptance by depth
    lines += ["## Acceptance by depth on the i.i.d. 4 x 8 tree (and K = 1: naive_tree = naive)", "",
              "P(accepted >= d | accepted >= d - 1), pooled over settings and roots, d = 1..8.", "",
              "| regime | method | K | d=1 .. 8 |", "|---|---|---|---|"]
    for r in rows.regimes:
        lines.append(f"| {label[r]} | naive_tree | 1 | " + " ".join(fmt(a) for a in depth_acceptance(rows, "naive_tree", r, 1)) + " |")
        for m in OT + ("traversal",):
            lines.append(f"| {label[r]} | {m} | 4 | " + " ".join(fmt(a) for a in depth_acceptance(rows, m, r, 4)) + " |")
    lines.append("")
    # ---- measured vs exact
    lines += ["## Measured (one Monte Carlo run of spec_ref.verify per tree) against exact", "",
              "| regime | method shape | measured mean tau+1 +- SE | exact mean | rows |", "|---|---|---|---|---|"]
    for r in rows.regimes:
        sel = [(i, x) for i, x in enumerate(rows.rows) if x["regime"] == r]
        for key in sel[0][1]["measured"]:
            method, shape = key.split(" ")
            k, l1, l2 = (int(v) for v in shape.split(","))
            measured = np.array([x["measured"][key] for _, x in sel], dtype=np.float64)
            idx = [i for i, _ in sel]
            exact = rows.be[method][idx, l1 + l2] if method in SINGLE else rows.be[method][idx, INDEX[(k, l1, l2)]]
            lines.append(f"| {label[r]} | {key} | {measured.mean():.3f} +- {_se(measured):.3f} | {exact.mean():.3f} | {len(sel)} |")
    lines.append("")
    # ---- NDE
    steps = int(getattr(args, "nde_steps", meta.get("nde_steps", 400)))
    methods = [m for m in str(getattr(args, "nde_methods", meta.get("nde_methods", ""))).split(",") if m]
    nde_results = {m: nde(rows, m, steps) for m in methods}
    if nde_results:
        cells_of: dict[str, dict[float, dict[str, tuple[float, float]]]] = {}
        for m, res in nde_results.items():
            cells_of[m] = {}
            for r in rows.regimes:
                tps = res["nde_e"] / res["nde_t"]
                cells_of[m][r] = {
                    "be_vs_static": _ratio(rows, r, res["nde_e"], res["static_be_e"]),
                    "tps_vs_static": _ratio(rows, r, tps, res["static_tps_e"] / res["static_tps_t"]),
                    "be_vs_traversal": _ratio(rows, r, res["nde_e"], res["traversal_be_e"]),
                    "tps_vs_traversal": _ratio(rows, r, tps, res["traversal_tps_e"] / res["traversal_tps_t"]),
                    "be": (float(np.nanmean(res["nde_e"][rows.mask(r)])), math.nan),
                    "tps": (float(np.nanmean(tps[rows.mask(r)])), math.nan),
                    "traversal_be": (float(np.nanmean(res["traversal_be_e"][rows.mask(r)])), math.nan),
                    "traversal_tps": (float(np.nanmean((res["traversal_tps_e"] / res["traversal_tps_t"])[rows.mask(r)])), math.nan),
                }
        lines += ["## NDE selector (Tables 4-7 layout)", "",
                  f"spec_fast.nde.selector_training as it is (SelectorNet, eq. 12 loss, TrainSettings() but steps={steps}); "
                  f"{FOLDS}-fold cross-fitting by prompt (fold = prompt // 2 mod 5: every kind keeps a prompt in "
                  "training), so every root is scored by a selector that never saw its prompt. Baselines chosen on "
                  "the training folds per regime and setting. Ratios: mean over held-out rows, +- SE (delta "
                  "method over roots). The draft's own 'hidden states' are the target's (the draft has none); the "
                  "regime reaches the selector through the divergence features.", ""]
        for key, title in (("be_vs_static", "Table 4 layout: block-efficiency ratio, NDE / best static shape"),
                           ("tps_vs_static", "Table 5 layout: throughput ratio, NDE / best static shape"),
                           ("be_vs_traversal", "Table 6 layout: block-efficiency ratio, NDE / Traversal (best static)"),
                           ("tps_vs_traversal", "Table 7 layout: throughput ratio, NDE / Traversal (best static)")):
            lines += [f"### {title}", "", "| method | " + " | ".join(f"acceptance {label[r]}" for r in rows.regimes) + " |",
                      "|---|" + "---|" * len(rows.regimes)]
            for m in methods:
                lines.append(f"| {m} NDE | " + " | ".join(f"{cells_of[m][r][key][0]:.3f} +- {cells_of[m][r][key][1]:.3f}"
                                                         for r in rows.regimes) + " |")
            lines.append("")
        lines += ["### Absolute values (held-out rows)", "", "| method | quantity | " + " | ".join(label[r] for r in rows.regimes) + " |",
                  "|---|---|" + "---|" * len(rows.regimes)]
        first = methods[0]
        lines.append("| traversal (best static) | BE | " + " | ".join(fmt(cells_of[first][r]["traversal_be"][0], 3) for r in rows.regimes) + " |")
        lines.append("| traversal (best static) | E/T | " + " | ".join(fmt(cells_of[first][r]["traversal_tps"][0], 3) for r in rows.regimes) + " |")
        for m in methods:
            lines.append(f"| {m} NDE | BE | " + " | ".join(fmt(cells_of[m][r]["be"][0], 3) for r in rows.regimes) + " |")
            lines.append(f"| {m} NDE | E/T | " + " | ".join(fmt(cells_of[m][r]["tps"][0], 3) for r in rows.regimes) + " |")
        lines += ["", "Training seconds (all folds): " + ", ".join(f"{m} {nde_results[m]['train_seconds']}" for m in methods), ""]
        for m in methods:
            counts: dict[str, int] = {}
            for a in nde_results[m]["chosen"].tolist():
                counts[str(ACTIONS[a])] = counts.get(str(ACTIONS[a]), 0) + 1
            top = sorted(counts.items(), key=lambda kv: -kv[1])[:5]
            lines.append(f"- {m} NDE's most chosen actions (K, L1, L2) over {len(rows.rows)} rows: "
                         + ", ".join(f"{k} x{v}" for k, v in top)
                         + (" (one action everywhere: the policy did not leave its prior, the best static action "
                            "of the training folds)" if len(counts) == 1 else ""))
        lines.append("")
    else:
        cells_of = {}
    summary = {"meta": meta, "achieved_root_acceptance": achieved,
               "tables": {by: {m: {str(r): {k: v for k, v in c.items() if k != "per_root"} for r, c in t.items()}
                               for m, t in tab.items()} for by, tab in tables.items()},
               "traversal_lead": {by: {str(r): v for r, v in d.items()} for by, d in leads.items()},
               "delayed_gain": {m: {by: {str(r): v for r, v in d.items()} for by, d in t.items()} for m, t in delayed_gain.items()},
               "nde": {m: {str(r): c for r, c in d.items()} for m, d in cells_of.items()}}
    with open(os.path.join(out, "study_regimes.json"), "w") as fh:
        json.dump(summary, fh, indent=1, default=float)
    with open(os.path.join(out, "study_regimes.md"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    plot(rows, tables, achieved, out)
    print("\n".join(lines))


def plot(rows: Rows, tables: dict[str, Any], achieved: dict[float, float], out: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    xs = [achieved[r] for r in rows.regimes]
    color = {m: f"C{i}" for i, m in enumerate(METHODS)}  # one colour per method in every panel
    for m in METHODS:
        for ax, by in zip(axes[:2], ("be", "tps")):
            ys = [tables[by][m][r]["mean"] for r in rows.regimes]
            es = [tables[by][m][r]["se"] for r in rows.regimes]
            ax.errorbar(xs, ys, yerr=es, marker="o", capsize=2, label=m, color=color[m])
    axes[0].set(xlabel="single-token acceptance at the root (1 - TV)", ylabel="exact E[tau + 1], best i.i.d. shape",
                title="Block efficiency vs acceptance")
    axes[1].set(xlabel="single-token acceptance at the root (1 - TV)", ylabel="E / T_hat (eq. 11), best i.i.d. shape",
                title="Offline throughput vs acceptance")
    axes[0].legend(fontsize=8)
    top = rows.regimes[-1]
    for m in OT + ("traversal",):
        acc = depth_acceptance(rows, m, top, 4)
        axes[2].plot(range(1, len(acc) + 1), acc, marker="o", label=f"{m} K=4", color=color[m])
    axes[2].plot(range(1, L2_MAX + 1), depth_acceptance(rows, "naive_tree", top, 1), marker="x", ls="--",
                 label="K=1 (naive)", color=color["naive"])
    axes[2].set(xlabel="depth d", ylabel="P(accepted >= d | >= d - 1)", title=f"Acceptance by depth, regime {top:g}")
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "study_regimes.png"), dpi=90)
