"""NDE (``--strategy nde:<verifier>``) vs plain decoding vs the best static delayed tree vs Traversal, SmolLM2-135M-Instruct.

    python bench/selector.py            # full: 5 OT verifiers x 4 settings, 4 held-out prompts x 32 tokens
    python bench/selector.py --quick    # specinfer, one setting, one prompt x 16 tokens

Target: the lean float32 forward (spec_fast.lean), the one the selector's dataset was built and priced on;
draft: the draft the committed selector was trained with (its weights' metadata; the ``rnn`` head). For
every sampling setting (T, top-p) in {0.6, 1.0} x {0.9, 1.0} these decoders run on the same held-out
prompts (spec_fast.drafts.prompts.HELDOUT_PROMPTS, never used by the dataset or the training), same seed:

* ``AR``: plain decoding (one target pass per token, no draft) -- the action (K, 0, 0) of eq. (8);
* ``NDE``: ``nde:<verifier>`` with the committed selector (spec_fast/weights/selector.safetensors);
* ``static``: ``delayed:K,L1,L2/<verifier>`` at the setting's best static *tree* (the best action that drafts)
  on the training roots of the selector dataset (SpecInfer targets, so every verifier gets SpecInfer's
  shape); an action with L2 = 0 runs as a chain;
* ``Traversal``: Traversal at the same static tree (no Traversal targets in the dataset).

Configurations run prompt by prompt in the order A B C ... then ... C B A on the next prompt (so drift of
the shared machine's load hits every configuration alike). Block efficiency (generated tokens / target
passes) and tokens per second are summed over prompts per configuration; ratios are taken within this
run. Also recorded: the selector's own cost per step (``selector_ms``) and the histogram of chosen actions.
Writes bench/results/selector.{json,md,png} in the layout of seed 002 (docs/papers.md) tables 4-7.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench._common import write_results  # noqa: E402
from bench._git import git_commit  # noqa: E402
from spec_fast.drafts.heads import load_drafter  # noqa: E402
from spec_fast.drafts.prompts import HELDOUT_PROMPTS  # noqa: E402
from spec_fast.engine import SamplingParams, SpeculativeDecoder  # noqa: E402
from spec_fast.models import chat_prompt_ids, lean_model, load_model  # noqa: E402
from spec_fast.nde import DEFAULT_SELECTOR_WEIGHTS, load_nde_selector  # noqa: E402
from spec_fast.nde.selector_training import best_static_action, load_dataset, load_selector, split_by_prompt  # noqa: E402
from spec_fast.strategies import parse_strategy  # noqa: E402

VERIFIERS = ("specinfer", "spectr", "khisti", "naive_tree", "nss")
SETTINGS = ((0.6, 0.9), (0.6, 1.0), (1.0, 0.9), (1.0, 1.0))
DATASET = os.path.join("bench", "data", "selector_dataset.npz")


def static_trees(path: str) -> tuple[dict[tuple[float, float], tuple[int, int, int]], tuple[int, int, int]]:
    """Per setting, the best action that drafts on the dataset's training roots, and the best action overall."""
    data = load_dataset(path, "specinfer")
    train, _ = split_by_prompt(data)
    settings = data.settings()[train]
    out: dict[tuple[float, float], tuple[int, int, int]] = {}
    for t, p in sorted({(round(float(t), 3), round(float(p), 3)) for t, p in settings.tolist()}):
        rows = train[(settings[:, 0].round(decimals=3) == t) & (settings[:, 1].round(decimals=3) == p)]
        out[(t, p)] = data.actions[best_static_action(data, rows, speculative=True)]
    return out, data.actions[best_static_action(data, train)]


def static_spec(action: tuple[int, int, int]) -> str:
    k, l1, l2 = action
    if l1 + l2 == 0:
        return "ar"
    return f"chain:{l1}" if l2 == 0 else f"delayed:{k},{l1},{l2}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--prompts", type=int, default=None, help="held-out prompts (default 4, --quick 1)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 32, --quick 16")
    parser.add_argument("--verifiers", default=None, help=f"comma-separated (default {','.join(VERIFIERS)})")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dataset", default=DATASET)
    parser.add_argument("--selector", default=DEFAULT_SELECTOR_WEIGHTS)
    parser.add_argument("--out", default=os.path.join("bench", "results"))
    args = parser.parse_args(argv)
    verifiers = tuple(args.verifiers.split(",")) if args.verifiers else (("specinfer",) if args.quick else VERIFIERS)
    settings = SETTINGS[:1] if args.quick else SETTINGS
    n_prompts = args.prompts or (1 if args.quick else 4)
    new_tokens = args.max_new_tokens or (16 if args.quick else 32)
    bad = [v for v in verifiers if v not in VERIFIERS]
    if bad or not os.path.exists(args.dataset):
        print(f"error: unknown verifiers {bad}" if bad else f"error: no dataset at {args.dataset}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    hf_target, tokenizer = load_model()
    target = lean_model(hf_target)
    _, selector_meta = load_selector(args.selector)
    draft_name = json.loads(selector_meta.get("dataset_header", "{}")).get("draft", "rnn").split()[0]
    drafter = load_drafter(draft_name, hf_target)  # trained drafts are built from the HF model's modules
    warm = time.perf_counter()
    selector = load_nde_selector(target, drafter, args.selector, latency_cache=None)
    warmup_s = time.perf_counter() - warm
    trees, best_overall = static_trees(args.dataset)
    prompts = [chat_prompt_ids(tokenizer, text) for text in HELDOUT_PROMPTS[:n_prompts]]
    eos = tokenizer.eos_token_id
    decoders: dict[tuple[str, str, float, float], SpeculativeDecoder] = {}
    for temperature, top_p in settings:
        shape = static_spec(trees[(temperature, top_p)])
        decoders[("ar", "ar", temperature, top_p)] = SpeculativeDecoder(target, None, parse_strategy("ar"))
        for verifier in verifiers:
            decoders[("nde", verifier, temperature, top_p)] = SpeculativeDecoder(
                target, drafter, parse_strategy(f"nde:{verifier}"), selector=selector)
            static_verifier = verifier if shape.startswith("delayed") else "naive"
            decoders[("static", verifier, temperature, top_p)] = SpeculativeDecoder(
                target, drafter, parse_strategy(shape, static_verifier))
        decoders[("traversal", "traversal", temperature, top_p)] = SpeculativeDecoder(
            target, drafter, parse_strategy(shape, "traversal"))
    configs = list(decoders)
    # warm every code path once (first calls pay lazy imports and allocator growth)
    for config in configs[: 2 + len(verifiers) * 2]:
        decoders[config].generate([prompts[0]], 4, SamplingParams(1.0, seed=0))
    totals: dict[tuple[str, str, float, float], dict[str, Any]] = {
        c: {"tokens": 0, "passes": 0, "seconds": 0.0, "selector_s": 0.0, "selector_steps": 0, "actions": {}}
        for c in configs}
    for p_index, prompt in enumerate(prompts):
        order = configs if p_index % 2 == 0 else configs[::-1]
        for config in order:
            kind, verifier, temperature, top_p = config
            sampling = SamplingParams(temperature=temperature, top_p=top_p, seed=1000 + p_index)
            metrics = decoders[config].generate([prompt], new_tokens, sampling, eos_token_id=eos).metrics
            total = totals[config]
            total["tokens"] += metrics.generated_tokens
            total["passes"] += metrics.target_passes
            total["seconds"] += metrics.wall_s
            total["selector_s"] += metrics.selector_s
            total["selector_steps"] += metrics.selector_steps
            for action, count in metrics.nde_actions.items():
                total["actions"][action] = total["actions"].get(action, 0) + count
            print(f"prompt {p_index + 1}/{len(prompts)} {kind}/{verifier} T={temperature} top-p={top_p}: "
                  f"{metrics.generated_tokens} tokens, BE {metrics.block_efficiency:.2f}, "
                  f"{metrics.tokens_per_s:.2f} tok/s ({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
    rows: list[dict[str, Any]] = []
    for config, total in totals.items():
        kind, verifier, temperature, top_p = config
        rows.append({
            "kind": kind, "verifier": verifier, "temperature": temperature, "top_p": top_p,
            "static_tree": list(trees[(temperature, top_p)]), "tokens": total["tokens"], "target_passes": total["passes"],
            "seconds": round(total["seconds"], 3),
            "block_efficiency": total["tokens"] / max(total["passes"], 1),
            "tokens_per_s": total["tokens"] / total["seconds"] if total["seconds"] else 0.0,
            "selector_ms": 1000 * total["selector_s"] / total["selector_steps"] if total["selector_steps"] else 0.0,
            "actions": total["actions"],
        })
    meta = {
        "command": "python bench/selector.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": git_commit(),
        "hardware": f"{platform.processor() or platform.machine()}, cpu, {args.threads} torch thread(s) "
                    "(shared 2-core machine)",
        "models": f"SmolLM2-135M-Instruct (target, lean float32 forward) + {draft_name} draft "
                  f"(spec_fast/weights/{draft_name}.safetensors)",
        "selector": os.path.relpath(args.selector), "dataset": args.dataset,
        "best static action overall (training split)": json.dumps(list(best_overall)),
        "static trees (training split, SpecInfer targets)": json.dumps({f"T={t},top-p={p}": list(a) for (t, p), a in trees.items()}),
        "workload": f"{n_prompts} held-out prompt(s) x {new_tokens} new tokens per configuration, interleaved",
        "latency model of the selector's features": json.dumps(selector.latency.to_json()),
        "latency warm-up seconds": round(warmup_s, 1), "total seconds": round(time.perf_counter() - start, 1),
    }
    table = tables(rows, verifiers, settings)
    write_results(args.out, "selector" if not args.quick else "selector_quick",
                  "NDE selector vs plain decoding vs the best static tree vs Traversal (seed 002 tables 4-7 layout)",
                  meta, rows, table, lambda plt: plot(plt, rows))
    return 0


def _get(rows: list[dict[str, Any]], kind: str, verifier: str, setting: tuple[float, float]) -> dict[str, Any]:
    return next(r for r in rows if r["kind"] == kind and r["verifier"] == verifier
                and (r["temperature"], r["top_p"]) == setting)


def tables(rows: list[dict[str, Any]], verifiers: tuple[str, ...], settings: tuple[tuple[float, float], ...]) -> list[str]:
    heads = [f"T={t}, p={p}" for t, p in settings]
    header = "| Method | " + " | ".join(heads) + " | Average |"
    rule = "|---" * (len(heads) + 2) + "|"
    out: list[str] = []

    def line(label: str, values: list[float], digits: int) -> str:
        return f"| {label} | " + " | ".join(f"{x:.{digits}f}" for x in values) + f" | {sum(values) / len(values):.{digits}f} |"

    def ratio_table(title: str, field: str, reference: str) -> None:
        out.extend([f"## {title}", "", header, rule])
        for v in verifiers:
            kind, name = ("ar", "ar") if reference == "ar" else ("static", v)
            out.append(line(f"{v} NDE", [_get(rows, "nde", v, s)[field] / _get(rows, kind, name, s)[field]
                                         for s in settings], 3))
        out.append("")

    def absolute_table(title: str, field: str) -> None:
        out.extend([f"## {title}", "", header, rule])
        out.append(line("AR (plain decoding)", [_get(rows, "ar", "ar", s)[field] for s in settings], 2))
        out.append(line("Traversal (static tree)", [_get(rows, "traversal", "traversal", s)[field] for s in settings], 2))
        for kind in ("nde", "static"):
            for v in verifiers:
                out.append(line(f"{v} {'NDE' if kind == 'nde' else 'static tree'}",
                                [_get(rows, kind, v, s)[field] for s in settings], 2))
        out.append("")

    ratio_table("Table 4 layout: block efficiency ratio, NDE / best static tree (same verifier)", "block_efficiency", "static")
    ratio_table("Table 5 layout: throughput (tok/s) ratio, NDE / best static tree (same verifier)", "tokens_per_s", "static")
    ratio_table("Throughput (tok/s) ratio, NDE / plain decoding", "tokens_per_s", "ar")
    absolute_table("Table 6 layout: block efficiency", "block_efficiency")
    absolute_table("Table 7 layout: throughput (tokens per second)", "tokens_per_s")
    out.extend(["## NDE vs Traversal (tok/s ratio, NDE / Traversal at the static tree)", "", header, rule])
    for v in verifiers:
        out.append(line(f"{v} NDE", [_get(rows, "nde", v, s)["tokens_per_s"] / _get(rows, "traversal", "traversal", s)["tokens_per_s"]
                                     for s in settings], 3))
    out.extend(["", "## Selector cost and chosen actions", "", "| verifier | setting | selector ms/step | actions (K,L1,L2): steps |",
                "|---|---|---|---|"])
    for v in verifiers:
        for s in settings:
            r = _get(rows, "nde", v, s)
            out.append(f"| {v} | T={s[0]}, p={s[1]} | {r['selector_ms']:.1f} | {json.dumps(r['actions'])} |")
    return out + [""]


def plot(plt: Any, rows: list[dict[str, Any]]) -> Any:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    histogram: dict[str, int] = {}
    for r in rows:
        for action, count in r["actions"].items():
            histogram[action] = histogram.get(action, 0) + count
    names = sorted(histogram, key=lambda a: -histogram[a])
    left.bar(range(len(names)), [histogram[a] for a in names])
    left.set_xticks(range(len(names)), [f"({a})" for a in names], rotation=45)
    left.set_title("NDE: chosen actions (K, L1, L2), all runs")
    left.set_ylabel("steps")
    labels, values = [], []
    for kind, verifier in dict.fromkeys((r["kind"], r["verifier"]) for r in rows):
        picked = [r["tokens_per_s"] for r in rows if r["kind"] == kind and r["verifier"] == verifier]
        labels.append(kind if kind in ("ar", "traversal") else f"{verifier} {kind}")
        values.append(sum(picked) / len(picked))
    right.barh(range(len(labels)), values)
    right.set_yticks(range(len(labels)), labels)
    right.set_xlabel("tokens per second (mean over settings)")
    right.set_title("throughput")
    return fig


if __name__ == "__main__":
    sys.exit(main())
