"""Train the NDE selector (seed 002 (docs/papers.md) eq. 10 and 12) on the offline dataset and evaluate it on held-out roots.

    python scripts/train_selector.py                                   # bench/data/selector_dataset.npz
    python scripts/train_selector.py --data bench/data/selector_dataset_quick.npz --steps 100

Split: every 5th prompt of the dataset is held out (spec_fast.nde.selector_training.split_by_prompt). The
baseline of eq. (5) is, per sampling setting, the best static action on the training roots. Training:
spec_fast.nde.selector_training.train_selector (AdamW, cosine schedule, fixed seed; progress on stderr); the same
data and flags give bitwise the same weights on the same thread count.

Writes spec_fast/weights/selector.safetensors (the weights, with the config, the method, the action space,
the baselines and the dataset header as metadata) and bench/results/selector_train.{json,md}: policy
(argmax) vs the best static action vs the per-setting baselines vs the per-root oracle, on training and
held-out roots, as offline throughput estimates (E_hat / T_hat of the dataset; no decoding is timed here).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from spec_fast.drafts.heads import WEIGHTS_DIR  # noqa: E402
from spec_fast.nde.selector_training import (  # noqa: E402
    SelectorData,
    TrainSettings,
    best_static_action,
    cross_validate,
    describe_actions,
    evaluate_policy,
    load_dataset,
    save_selector,
    split_by_prompt,
    static_baselines,
    train_selector,
)

DEFAULT_DATA = os.path.join("bench", "data", "selector_dataset.npz")


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _markdown(meta: dict[str, object], reports: dict[str, dict[str, object]], actions: list[tuple[int, int, int]],
              static_action: int, tree_action: int) -> str:
    header = meta["dataset_header"]
    assert isinstance(header, dict)
    lines = ["# NDE selector: offline training and held-out evaluation", "",
             f"Command: `{meta['command']}` (commit {meta['commit']}, {meta['hardware']}); training took "
             f"{meta['training_seconds']} s.", "",
             f"Dataset: `{header.get('command')}` at commit {header.get('commit')}: {meta['dataset_roots']} roots "
             f"({meta['train_roots']} training, {meta['heldout_roots']} held out by prompt), "
             f"{header.get('trees_per_root')} shared draws per root, Rao-Blackwellised targets, method {meta['method']}, "
             f"draft {header.get('draft')}, built in {header.get('seconds')} s ({header.get('seconds_by_phase')}).", "",
             f"Best static action on the training roots: {describe_actions(actions, static_action)}; best static "
             f"tree (an action that drafts): {describe_actions(actions, tree_action)}.", "",
             "Offline estimates E_hat[tau+1] / T_hat of the dataset (T_hat: eq. 11 priced as the engine runs a step, "
             "spec_fast.nde.latency.LatencyModel.step_time), not timed decoding. `tps_mean` = mean over roots of E/T "
             "(eq. 9, one-hot policy); `tps_pooled` = sum E / sum T; `differs` = share of roots whose action is not "
             "the best static one; interval: 95% prompt bootstrap of the ratio.", "",
             "| split | choice | block efficiency | T_hat (ms) | tps_mean | vs best static (95% CI) | tps_pooled | vs best static | differs |",
             "|---|---|---|---|---|---|---|---|---|"]
    for split, report in reports.items():
        for name in ("best_static", "best_static_tree", "setting_baseline", "policy", "oracle", "oracle_crossfit"):
            row = report.get(name)
            if not isinstance(row, dict):
                continue
            ci = row.get("tps_mean_ci")
            interval = f" ({ci[0]:.3f}-{ci[1]:.3f})" if isinstance(ci, (list, tuple)) else ""
            lines.append(
                f"| {split} ({report['roots']} roots) | {name} | {row['block_efficiency']:.3f} | {1000 * row['latency_s']:.1f} | "
                f"{row['tps_mean']:.2f} | {row.get('tps_mean_vs_best_static', 1.0):.4f}{interval} | {row['tps_pooled']:.2f} | "
                f"{row.get('tps_pooled_vs_best_static', 1.0):.4f} | {row['differs_from_best_static']:.2f} |")
    held = reports["heldout"]
    policy, oracle, cross = held["policy"], held["oracle"], held.get("oracle_crossfit")
    tree = held["best_static_tree"]
    assert isinstance(policy, dict) and isinstance(oracle, dict) and isinstance(tree, dict)
    lines += ["", "## Notes", "",
              f"- Held-out: the policy reaches {policy['tps_mean_vs_best_static']:.4f}x the best static action's mean "
              f"E/T; the in-sample per-root oracle {oracle['tps_mean_vs_best_static']:.4f}x (an upper bound: it also "
              "profits from the luck of the draws it is scored on)"
              + (f", the cross-fitted oracle {cross['tps_mean_vs_best_static']:.4f}x (choice on one half of the draws, "
                 "scored on the other: a lower bound on the exact oracle)" if isinstance(cross, dict) else "")
              + f"; the best static tree {tree['tps_mean_vs_best_static']:.4f}x.",
              f"- Latency model of the dataset (warm-up on the machine that built it): {json.dumps(header.get('latency_model'))}.",
              "- Decoding with the selector (`--strategy nde`) is measured by `python bench/selector.py` in bench/results/selector.md."]
    lines += ["", "Actions the policy chose on held-out roots (K, L1, L2): count", ""]
    policy_actions = held["policy_actions"]
    assert isinstance(policy_actions, dict)
    lines += [f"- {k}: {v}" for k, v in list(policy_actions.items())[:12]]
    return "\n".join(lines) + "\n"


#: the training settings ``--cv`` compares (the defaults first; a tie keeps the earlier one)
CV_CANDIDATES: tuple[dict[str, float], ...] = (
    {},
    {"lr": 3e-4, "steps": 2000},
    {"lr": 3e-4, "steps": 2000, "logit_cap": 6.0},
    {"lr": 3e-4, "steps": 800, "logit_cap": 6.0},
    {"lr": 1e-3, "steps": 300, "logit_cap": 6.0},
    {"lr": 3e-4, "steps": 2000, "logit_cap": 6.0, "dropout": 0.5},
    {"lr": 3e-4, "steps": 2000, "logit_cap": 4.0, "prior_logit": 4.0},
)


def run_cv(data: SelectorData, train_rows: torch.Tensor, results: str, command: str) -> int:
    """``--cv``: 4-fold cross-validation of CV_CANDIDATES over the training prompts (the held-out prompts are
    never read) -> bench/results/selector_cv.{json,md}."""
    start = time.perf_counter()
    candidates = [dataclasses.replace(TrainSettings(), **c) for c in CV_CANDIDATES]  # type: ignore[arg-type]
    rows = cross_validate(data, train_rows, candidates)
    best = max(range(len(rows)), key=lambda i: (round(rows[i]["cv_vs_best_static"], 6), -i))
    meta = {"command": command, "commit": _commit(), "seconds": round(time.perf_counter() - start, 1),
            "dataset": data.header.get("command"), "dataset_commit": data.header.get("commit"),
            "chosen": rows[best]["settings"]}
    with open(os.path.join(results, "selector_cv.json"), "w", encoding="utf-8") as handle:
        json.dump({"meta": meta, "results": rows}, handle, indent=1)
    lines = ["# NDE selector: training settings by 4-fold cross-validation over the training prompts", "",
             f"Command: `{command}` (commit {meta['commit']}, {meta['seconds']} s); dataset `{meta['dataset']}` "
             f"(commit {meta['dataset_commit']}), training split only.", "",
             "`CV` = policy mean E/T over the held folds / best static action's (chosen on the training folds); "
             "`fit` = the same on the training folds themselves; `differs` = share of held roots whose tree is not "
             "the best static one.", "",
             "| settings (changes from TrainSettings()) | CV vs best static | fit vs best static | differs |", "|---|---|---|---|"]
    for i, (candidate, row) in enumerate(zip(CV_CANDIDATES, rows)):
        mark = " (chosen)" if i == best else ""
        lines.append(f"| {json.dumps(candidate)}{mark} | {row['cv_vs_best_static']:.4f} | {row['fit_vs_best_static']:.4f} | "
                     f"{row['cv_differs']:.3f} |")
    with open(os.path.join(results, "selector_cv.md"), "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=DEFAULT_DATA)
    parser.add_argument("--method", default="specinfer")
    parser.add_argument("--out", default=os.path.join(WEIGHTS_DIR, "selector.safetensors"))
    parser.add_argument("--results", default=os.path.join("bench", "results"), help="folder of selector_train.{json,md}")
    parser.add_argument("--steps", type=int, default=TrainSettings.steps)
    parser.add_argument("--batch-size", type=int, default=TrainSettings.batch_size)
    parser.add_argument("--lr", type=float, default=TrainSettings.lr)
    parser.add_argument("--prior-logit", type=float, default=TrainSettings.prior_logit)
    parser.add_argument("--penalty-weight", type=float, default=TrainSettings.penalty_weight)
    parser.add_argument("--worst-fraction", type=float, default=TrainSettings.worst_fraction)
    parser.add_argument("--logit-cap", type=float, default=TrainSettings.logit_cap)
    parser.add_argument("--seed", type=int, default=TrainSettings.seed)
    parser.add_argument("--cv", action="store_true",
                        help="compare training settings by cross-validation over the training prompts (no weights written)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if not os.path.exists(args.data):
        print(f"error: no dataset at {args.data} (run scripts/selector_dataset.py first)", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    try:
        data = load_dataset(args.data, args.method)
        settings = TrainSettings(steps=args.steps, batch_size=args.batch_size, lr=args.lr, prior_logit=args.prior_logit,
                                 penalty_weight=args.penalty_weight, worst_fraction=args.worst_fraction,
                                 logit_cap=args.logit_cap, seed=args.seed)
        train_rows, heldout_rows = split_by_prompt(data)
        if args.cv:
            os.makedirs(args.results, exist_ok=True)
            return run_cv(data, train_rows, args.results,
                          "python scripts/train_selector.py " + " ".join(argv if argv is not None else sys.argv[1:]))
        if heldout_rows.numel() == 0:
            raise ValueError("the dataset has too few prompts for a held-out split (need >= 5)")
        baselines = static_baselines(data, train_rows)
        static_action = best_static_action(data, train_rows)
        tree_action = best_static_action(data, train_rows, speculative=True)
        start = time.perf_counter()
        net, log = train_selector(data, train_rows, baselines, settings)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    seconds = time.perf_counter() - start
    reports = {"train": evaluate_policy(net, data, train_rows, static_action, baselines, tree_action),
               "heldout": evaluate_policy(net, data, heldout_rows, static_action, baselines, tree_action)}
    meta: dict[str, object] = {
        "command": "python scripts/train_selector.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": _commit(), "hardware": f"{platform.processor() or platform.machine()}, {args.threads} torch thread(s), CPU",
        "dataset": args.data, "dataset_roots": data.size,
        # the 324 actions are spec_ref.selector.action_space(); the copy leaves them out
        "dataset_header": {k: v for k, v in data.header.items() if k != "actions"}, "method": args.method,
        "settings": dataclasses.asdict(settings), "training_seconds": round(seconds, 1),
        "baselines": {f"T={t},top_p={p}": describe_actions(data.actions, a) for (t, p), a in baselines.items()},
        "best_static": describe_actions(data.actions, static_action),
        "best_static_tree": describe_actions(data.actions, tree_action), "train_roots": int(train_rows.numel()),
        "heldout_roots": int(heldout_rows.numel()), "loss_log": log,
    }
    metadata = {"method": args.method, "best_static": json.dumps(list(data.actions[static_action])),
                "best_static_tree": json.dumps(list(data.actions[tree_action])),
                "baselines": json.dumps({f"{t},{p}": a for (t, p), a in baselines.items()}),
                "dataset_header": json.dumps(data.header, sort_keys=True), "train_settings": json.dumps(dataclasses.asdict(settings))}
    save_selector(net, args.out, metadata)
    os.makedirs(args.results, exist_ok=True)
    with open(os.path.join(args.results, "selector_train.json"), "w", encoding="utf-8") as handle:
        json.dump({"meta": meta, "results": reports}, handle, indent=1)
    with open(os.path.join(args.results, "selector_train.md"), "w", encoding="utf-8") as handle:
        handle.write(_markdown(meta, reports, list(data.actions), static_action, tree_action))
    held = reports["heldout"]
    print(f"held-out: policy {held['policy']['tps_mean_vs_best_static']:.4f}x best static (mean E/T), oracle "
          f"{held['oracle']['tps_mean_vs_best_static']:.4f}x; wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
