"""How many tokens one target pass commits, per draft and strategy, on held-out prompts, and the speedup over
plain decoding that count allows if drafting, verification and the commit cost nothing.

The speculative default's speedup is ``tokens per pass x t(1) / t(pass)``, less what drafting and the steps'
bookkeeping cost (``bench/step_phases.py``). This benchmark measures the first factor for every committed draft
(and the retrieval draft over parts of its datastore) under chains and top-k trees, greedy and sampled, and the
second from pass costs timed in the same run, so that it can say for each goal of plain-decoding multiples
which draft could reach it at all:

* **tokens per pass**: tokens generated / target passes (the prefill's pass included, as the engine counts);
* **mean width**: the tokens a pass runs, root included (1 for a plain step), over the recorded steps;
* **ceiling**: tokens per pass x t(1) / mean over the steps of t(width): the decode speedup over plain
  decoding with free drafting; t(Q) = a pass over Q chained tokens on the default target (the GGUF blocks on
  the lean forward, 1 thread) behind the workload's mean context, timed here;
* **needed**: the tokens per pass the workload's goal needs at that width profile, also with free drafting.

Every configuration decodes the same prompts (the held-out split of ``bench/workloads.py``, chat templated),
``--max-new-tokens`` each, EOS ending a reply; sampled rows use one seed per prompt. Greedy outputs are
checked against plain decoding's.

    python bench/acceptance.py --out bench/results/acceptance
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from typing import Any

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench._common import write_results  # noqa: E402
from bench._git import git_commit  # noqa: E402
from bench._native import bandwidth_floor  # noqa: E402
from bench.defaults import cli_target  # noqa: E402
from bench.workloads import HELDOUT  # noqa: E402
from spec_fast.decoding import SamplingParams  # noqa: E402
from spec_fast.drafts.heads import DRAFTER_NAMES, load_drafter  # noqa: E402
from spec_fast.drafts.retrieval import load_datastore, load_retrieval_drafter, save_datastore  # noqa: E402
from spec_fast.engine.decoder import SpeculativeDecoder  # noqa: E402
from spec_fast.kv_cache import TreeKVCache  # noqa: E402
from spec_fast.models import DEFAULT_GGUF, chat_prompt_ids, default_model_dir, load_model  # noqa: E402
from spec_fast.strategies import parse_strategy  # noqa: E402

#: the goals of plain-decoding multiples the report weighs (greedy chat, greedy input-grounded, sampled)
GOALS = {("chat", 0.0): 1.5, ("input-grounded", 0.0): 2.0, ("chat", 0.7): 1.3, ("input-grounded", 0.7): 1.3}
DRAFTS = "retrieval,retrieval@0.5,retrieval@0.25,retrieval@0,rnn,rnn+retrieval,eagle+retrieval,distilled"
STRATEGIES = "chain:1;chain:2;chain:4;chain:8;topk:2,2,4;topk:3,2,6;topk:4,3,10"
SAMPLED_DRAFTS = "retrieval,rnn,rnn+retrieval,eagle+retrieval"
SAMPLED_STRATEGIES = "chain:1;chain:2;chain:4"
TITLE = "Tokens per target pass by draft and strategy, and the speedup they allow"


def datastore_part(fraction: float, folder: str) -> str:
    """A datastore file of a seeded random ``fraction`` of the committed datastore's sequences (0: one
    two-token sequence, so only the row's own text matches)."""
    sequences, _ = load_datastore()
    kept = random.Random(0).sample(sequences, round(fraction * len(sequences))) if fraction > 0 else [[0, 1]]
    path = os.path.join(folder, f"datastore_{fraction}.npz")
    save_datastore(path, kept, {"fraction": str(fraction)})
    return path


def datastore_fraction(name: str) -> float | None:
    """F of a draft named ``retrieval@F`` (0 <= F <= 1), None for a name ``load_drafter`` takes; ``ValueError``
    for any other name."""
    if "@" not in name:
        if name not in DRAFTER_NAMES:
            raise ValueError(f"draft must be one of {DRAFTER_NAMES} or retrieval@F, got {name!r}")
        return None
    base, _, fraction = name.partition("@")
    try:
        value = float(fraction)
    except ValueError:
        value = -1.0
    if base != "retrieval" or not 0.0 <= value <= 1.0:
        raise ValueError(f"a datastore fraction is retrieval@F with 0 <= F <= 1, got {name!r}")
    return value


def make_drafter(name: str, target: Any, hf_target: Any, folder: str) -> Any:
    """``name`` as ``load_drafter`` takes it, or ``retrieval@F``: retrieval over a fraction F of the datastore."""
    fraction = datastore_fraction(name)
    if fraction is not None:
        vocab = int(target.get_output_embeddings().weight.shape[0])
        return load_retrieval_drafter(vocab, datastore_part(fraction, folder))
    return load_drafter(name, hf_target, target_lm_head=target.get_output_embeddings())


def pass_ms(target: Any, context: int, widths: list[int], rounds: int) -> dict[int, float]:
    """Median ms of a pass over ``q`` chained random tokens behind ``context`` random cached tokens, each
    pass rolled back, widths taking turns within every round (the first round dropped)."""
    gen = torch.Generator().manual_seed(context)
    cache = TreeKVCache(target, 1, torch.device("cpu"))
    prompt = torch.randint(100, 40000, (1, context), generator=gen)
    cache.forward(prompt, torch.arange(-1, context - 1).unsqueeze(0), logits_to_keep=1)
    cache.commit(torch.arange(context).unsqueeze(0), torch.tensor([context]), True)
    times: dict[int, list[float]] = {q: [] for q in widths}
    empty, none = torch.zeros(1, 0, dtype=torch.long), torch.tensor([0])
    with torch.no_grad():
        for round_index in range(rounds + 1):
            for q in widths if round_index % 2 else widths[::-1]:
                tokens = torch.randint(100, 40000, (1, q), generator=gen)
                start = time.perf_counter()
                cache.forward(tokens, torch.arange(-1, q - 1).unsqueeze(0))
                elapsed = time.perf_counter() - start
                cache.commit(empty, none)
                if round_index:
                    times[q].append(1000 * elapsed)
    return {q: statistics.median(v) for q, v in times.items()}


def decode(decoder: SpeculativeDecoder, prompts: list[list[int]], new: int, temperature: float, eos: int | None
           ) -> dict[str, Any]:
    """Tokens, passes, per-step pass widths and outputs of ``decoder`` over ``prompts``."""
    tokens = passes = 0
    widths: list[int] = []
    outputs = []
    for index, prompt in enumerate(prompts):
        sampling = SamplingParams(temperature=temperature, seed=index) if temperature > 0 else None
        result = decoder.generate([prompt], max_new_tokens=new, sampling=sampling, eos_token_id=eos,
                                  record_trees=True)
        tokens += len(result.tokens[0])
        passes += result.metrics.target_passes
        widths += [int(tree.valid[0].sum()) for tree in result.trees]
        outputs.append(result.tokens[0])
    return {"tokens": tokens, "passes": passes, "widths": widths, "outputs": outputs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafts", default=DRAFTS, help=f"comma-separated drafts, greedy (default {DRAFTS})")
    parser.add_argument("--strategies", default=STRATEGIES, help="semicolon-separated strategies, greedy")
    parser.add_argument("--sampled-drafts", default=SAMPLED_DRAFTS, help="drafts at --temperature ('' = none)")
    parser.add_argument("--sampled-strategies", default=SAMPLED_STRATEGIES)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--workloads", default="chat,input-grounded")
    parser.add_argument("--prompts", type=int, default=12, help="held-out prompts per workload (first N)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=9, help="rounds of the pass-cost timing")
    parser.add_argument("--out", default=os.path.join("bench", "results", "acceptance"))
    parser.add_argument("--report-from", default="",
                        help="re-render the Markdown and plot of a JSON this script wrote (no decoding)")
    args = parser.parse_args(argv)
    if args.report_from:
        try:
            with open(args.report_from) as handle:
                saved = json.load(handle)
            if not {"pass_ms", "bandwidth_floor"} <= set(saved["meta"]) or not isinstance(saved["results"], list):
                raise ValueError("its meta lacks pass_ms or bandwidth_floor, or it has no results")
        except (OSError, ValueError, KeyError, TypeError) as error:
            print(f"error: --report-from {args.report_from!r} is not a saved run of this script ({error})",
                  file=sys.stderr)
            return 2
        saved_costs = {w: {int(q): ms for q, ms in c.items()} for w, c in saved["meta"]["pass_ms"].items()}
        meta = {**saved["meta"], "report": f"re-rendered from {args.report_from} at {git_commit()} (no decoding)"}
        write_results(args.out, "acceptance", TITLE, meta, saved["results"],
                      table(saved["results"], saved_costs, saved["meta"]["bandwidth_floor"]),
                      lambda plt: plot(plt, saved["results"]))
        return 0
    workloads = [w for w in args.workloads.split(",") if w]
    if any(w not in HELDOUT for w in workloads) or args.prompts < 1 or args.max_new_tokens < 1:
        print(f"error: --workloads must name {sorted(HELDOUT)}, --prompts and --max-new-tokens >= 1",
              file=sys.stderr)
        return 2
    try:
        runs = [(d, s, 0.0) for d in args.drafts.split(",") if d for s in args.strategies.split(";") if s]
        if args.temperature > 0:
            runs += [(d, s, args.temperature) for d in args.sampled_drafts.split(",") if d
                     for s in args.sampled_strategies.split(";") if s]
        for draft, strategy, _ in runs:
            datastore_fraction(draft)
            parse_strategy(strategy)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    target, tokenizer = cli_target("gguf")
    hf_target = load_model()[0]
    eos = tokenizer.eos_token_id
    rows: list[dict[str, Any]] = []
    costs: dict[str, dict[int, float]] = {}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        drafters = {name: make_drafter(name, target, hf_target, folder) for name in {d for d, _, _ in runs}}
        for workload in workloads:
            prompts = [chat_prompt_ids(tokenizer, p) for p in HELDOUT[workload][: args.prompts]]
            plain = decode(SpeculativeDecoder(target, None, parse_strategy("ar")), prompts, args.max_new_tokens,
                           0.0, eos)
            found: dict[tuple[str, str, float], dict[str, Any]] = {}
            for draft, strategy, temperature in runs:
                run = decode(SpeculativeDecoder(target, drafters[draft], parse_strategy(strategy)), prompts,
                             args.max_new_tokens, temperature, eos)
                found[(draft, strategy, temperature)] = run
                print(f"{workload} {draft} {strategy} T={temperature}: {run['tokens'] / run['passes']:.3f} "
                      f"tokens/pass ({time.perf_counter() - start:.0f}s)", file=sys.stderr, flush=True)
            widest = max([w for r in found.values() for w in r["widths"]] + [1])
            context = round(statistics.mean(len(p) for p in prompts) + args.max_new_tokens / 2)
            cost = pass_ms(target, context, list(range(1, widest + 1)), args.rounds)
            costs[workload] = cost
            for (draft, strategy, temperature), r in found.items():
                per_pass = r["tokens"] / r["passes"]
                relative = statistics.mean(cost[w] for w in r["widths"]) / cost[1] if r["widths"] else 1.0
                goal = GOALS.get((workload, temperature))
                rows.append({
                    "workload": workload, "temperature": temperature, "draft": draft, "strategy": strategy,
                    "prompts": len(prompts), "tokens": r["tokens"], "passes": r["passes"],
                    "tokens_per_pass": per_pass, "mean_width": statistics.mean(r["widths"]) if r["widths"] else 1.0,
                    "relative_pass_cost": relative, "ceiling": per_pass / relative, "goal": goal,
                    "needed_tokens_per_pass": goal * relative if goal else None,
                    "greedy_equal_to_plain": r["outputs"] == plain["outputs"] if temperature == 0 else None,
                })
    floor = bandwidth_floor(os.path.join(default_model_dir(), DEFAULT_GGUF), 1)
    meta = {
        "command": "python bench/acceptance.py" + (" " + " ".join(sys.argv[1:]) if argv is None and sys.argv[1:] else ""),
        "commit": git_commit(), "hardware": f"{platform.machine()}, {os.cpu_count()} CPUs, 1 torch thread",
        "torch": torch.__version__, "prompts": f"held-out split of bench/workloads.py, first {args.prompts} per workload",
        "max_new_tokens": args.max_new_tokens, "seconds": round(time.perf_counter() - start),
        "pass_ms": {w: {str(q): round(ms, 3) for q, ms in c.items()} for w, c in costs.items()},
        "bandwidth_floor": floor,
        "greedy outputs equal to plain decoding's": all(r["greedy_equal_to_plain"] in (True, None) for r in rows),
    }
    write_results(args.out, "acceptance", TITLE, meta, rows, table(rows, costs, floor), lambda plt: plot(plt, rows))
    return 0


def table(rows: list[dict[str, Any]], costs: dict[str, dict[int, float]], floor: dict[str, Any]) -> list[str]:
    lines = ["Ceiling = tokens per pass x t(1) / mean t(width): the decode speedup over plain decoding if drafting, "
             "verification and the commit cost nothing. Needed = the tokens per pass the goal asks at that "
             "width profile (also with free drafting).", "",
             "| workload | T | draft | strategy | tokens/pass | mean width | pass cost / t(1) | ceiling | goal | "
             "needed tokens/pass |", "|---|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        goal = f"{r['goal']:.1f}x" if r["goal"] else ""
        needed = f"{r['needed_tokens_per_pass']:.2f}" if r["needed_tokens_per_pass"] else ""
        lines.append(f"| {r['workload']} | {r['temperature']:g} | {r['draft']} | {r['strategy']} | "
                     f"{r['tokens_per_pass']:.3f} | {r['mean_width']:.2f} | {r['relative_pass_cost']:.3f} | "
                     f"{r['ceiling']:.2f}x | {goal} | {needed} |")
    lines += ["", "Best ceiling per workload and temperature (against its goal):", ""]
    for key in sorted({(r["workload"], r["temperature"]) for r in rows}):
        best = max((r for r in rows if (r["workload"], r["temperature"]) == key), key=lambda r: r["ceiling"])
        verdict = ("reachable with free drafting" if best["goal"] and best["ceiling"] >= best["goal"]
                   else "out of reach even with free drafting" if best["goal"] else "")
        lines.append(f"- {key[0]}, T = {key[1]:g}: {best['draft']} {best['strategy']} {best['ceiling']:.2f}x "
                     f"({best['tokens_per_pass']:.2f} tokens per pass)"
                     + (f"; goal {best['goal']:.1f}x: {verdict}" if best["goal"] else ""))
    lines += ["", "Where a pass over any of these widths costs what a one-token pass costs (about so on a GPU at this "
              "model size: bench/results/gpu/h200/gpu_check.md), the ceiling is the tokens per pass itself; the "
              "most per workload and temperature:", ""]
    for key in sorted({(r["workload"], r["temperature"]) for r in rows}):
        most = max((r for r in rows if (r["workload"], r["temperature"]) == key), key=lambda r: r["tokens_per_pass"])
        lines.append(f"- {key[0]}, T = {key[1]:g}: {most['draft']} {most['strategy']} {most['tokens_per_pass']:.2f} tokens per pass"
                     + (f" (goal {most['goal']:.1f}x: {'reached' if most['tokens_per_pass'] >= most['goal'] else 'missed'})"
                        if most["goal"] else ""))
    widths = sorted({q for c in costs.values() for q in c})
    lines += ["", "Pass cost t(Q), ms, Q chained tokens behind the workload's mean context (median of the rounds):", "",
              "| workload | " + " | ".join(f"Q={q}" for q in widths) + " |", "|---|" + "---:|" * len(widths)]
    for workload, cost in costs.items():
        lines.append(f"| {workload} | " + " | ".join(f"{cost[q]:.2f}" if q in cost else "" for q in widths) + " |")
    lines += ["", f"Memory-bandwidth floor of plain decoding (1 thread): {floor['bytes_per_token'] / 1e6:.1f} MB of "
              f"weights per token / {floor['read_bytes_per_s'] / 1e9:.1f} GB/s measured = "
              f"{floor['floor_ms_per_token']:.2f} ms per token ({floor['floor_tokens_per_s']:.0f} tokens/s)."]
    return lines


def plot(plt: Any, rows: list[dict[str, Any]]) -> Any:
    keys = sorted({(r["workload"], r["temperature"]) for r in rows})
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4), squeeze=False)
    for ax, key in zip(axes[0], keys):
        group = [r for r in rows if (r["workload"], r["temperature"]) == key]
        ax.scatter([r["relative_pass_cost"] for r in group], [r["tokens_per_pass"] for r in group], s=12)
        cost = [1.0, max(r["relative_pass_cost"] for r in group)]
        if group[0]["goal"]:
            ax.plot(cost, [group[0]["goal"] * c for c in cost], "r--", label=f"goal {group[0]['goal']:.1f}x")
        ax.plot(cost, cost, "k:", label="1.0x")
        ax.set_title(f"{key[0]}, T = {key[1]:g}")
        ax.set_xlabel("mean pass cost / t(1)")
        ax.set_ylabel("tokens per pass")
        ax.legend()
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    raise SystemExit(main())
