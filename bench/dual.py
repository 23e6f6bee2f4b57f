"""Dual drafting on SmolLM2-135M-Instruct: merge, route and route-calibrated for the pairs (rnn, retrieval),
(retrieval, rnn) (head 1 wins ties), (eagle, retrieval) and (rnn, eagle) against each single draft at the same per-head shape and against AR, greedy and
T = 0.7 / top-p 0.9 (fixed seed), on held-out chat prompts and on input-grounded prompts, in one run.

Configurations are interleaved prompt by prompt (slow phases of the shared machine hit all alike). Reports,
per workload and sampling setting, block efficiency (tokens per target pass), draft tokens accepted per
step from each head, route wins / accepted-path supplier counts, tokens/s and its ratio to our AR in the
same run, host reads per step (Tensor.item / tolist / __bool__ ... counted during the run), and (greedy)
whether the output equals AR token for token. Writes ``bench/results/dual.{json,md,png}``.

    python bench/dual.py --quick      # 2 prompts per workload x 16 new tokens (smoke run)
    python bench/dual.py              # 4 prompts per workload x 32 new tokens
    python bench/dual.py --pairs rnn,retrieval eagle,retrieval   # only these pairs (and their singles)
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from typing import Any

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench._git import git_commit  # noqa: E402

from bench._common import write_results  # noqa: E402
from bench.defaults import INPUT_GROUNDED  # noqa: E402
from spec_fast.decoding import SamplingParams  # noqa: E402
from spec_fast.drafts.model import Drafter  # noqa: E402
from spec_fast.drafts.dual import DualDrafter, load_route_prior  # noqa: E402
from spec_fast.engine import SpeculativeDecoder  # noqa: E402
from spec_fast.drafts.heads import load_drafter  # noqa: E402
from spec_fast.models import chat_prompt_ids, lean_model, load_model  # noqa: E402
from spec_fast.strategies import parse_strategy  # noqa: E402
from spec_fast.drafts.prompts import HELDOUT_PROMPTS, TRAIN_PROMPTS, synthetic_prompts  # noqa: E402
from spec_fast.drafts.training import TrainConfig  # noqa: E402

READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")
SINGLES = ("rnn", "eagle", "retrieval")
# (retrieval, rnn): the same pair with the model-free draft as head 1, which wins ties -- a route then skips
# the rnn head entirely on steps where retrieval's chain scores exactly 1
PAIRS = (("rnn", "retrieval"), ("retrieval", "rnn"), ("eagle", "retrieval"), ("rnn", "eagle"))
MODES = ("merge", "route", "route-calibrated")
CAVEAT = ("shared 2-core machine (other helpers' jobs running): ratios are side by side in one run, "
          "configurations interleaved prompt by prompt; absolute tok/s noisy, few prompts and tokens")
SAMPLINGS = {"greedy": SamplingParams(), "T=0.7,top-p=0.9": SamplingParams(temperature=0.7, top_p=0.9, seed=0)}


class _ReadCounter:
    """Counts host reads of tensor values while active (wraps the Tensor methods that sync)."""

    def __init__(self) -> None:
        self.count = 0
        self._originals = {name: getattr(torch.Tensor, name) for name in READS}

    def __enter__(self) -> _ReadCounter:
        for name, original in self._originals.items():
            def counted(tensor: torch.Tensor, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
                self.count += 1
                return _original(tensor, *args, **kwargs)
            setattr(torch.Tensor, name, counted)
        return self

    def __exit__(self, *exc: Any) -> None:
        for name, original in self._originals.items():
            setattr(torch.Tensor, name, original)


def _check_not_in_datastore(prompts: list[str]) -> None:
    """The retrieval datastore holds the target's responses to TRAIN_PROMPTS + synthetic_prompts (see
    scripts/train_drafts.py); an evaluation prompt among them would flatter retrieval."""
    def normal(text: str) -> str:
        return " ".join(text.casefold().split())

    config = TrainConfig()
    trained = {normal(p) for p in TRAIN_PROMPTS + tuple(synthetic_prompts(config.synthetic_prompts, config.seed))}
    leaked = [p[:40] for p in prompts if normal(p) in trained]
    if leaked:
        raise SystemExit(f"error: evaluation prompts in the retrieval datastore's training prompts: {leaked}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--strategy", default="chain:2", help="per-head shape (chain:L or topk:D,K,B)")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per workload")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", default=None, help="semicolon-separated config names (plus ar) to run alone")
    parser.add_argument("--pairs", nargs="+", default=None, metavar="A,B",
                        help="draft pairs to run (default: all of " + " ".join(",".join(p) for p in PAIRS) + ")")
    parser.add_argument("--caveat", default=CAVEAT, help="the caveat line written with the results")
    parser.add_argument("--target", default="lean", choices=["lean", "hf"],
                        help="the target's forward: lean (float32, native products, as the CLI runs SmolLM2) or hf")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    prompts_n, new = (2, 16) if args.quick else (4, 32)
    prompts_n = args.prompts or prompts_n
    new = args.max_new_tokens or new
    workloads = {"chat": list(HELDOUT_PROMPTS[:prompts_n]), "input-grounded": list(INPUT_GROUNDED[:prompts_n])}
    _check_not_in_datastore([p for texts in workloads.values() for p in texts])
    hf_model, tokenizer = load_model(device=args.device)
    # the CLI runs SmolLM2 on the lean forward, where a pass over 2-5 tokens costs about what one over 1 does;
    # trained heads are built from the HF modules either way (spec_fast.api does the same)
    model = lean_model(hf_model, "float32") if args.target == "lean" else hf_model
    pairs = PAIRS if args.pairs is None else tuple(tuple(p.split(",")) for p in args.pairs)
    if any(len(p) != 2 or not set(p) <= set(SINGLES) for p in pairs):
        parser.error(f"--pairs: each pair is two of {','.join(SINGLES)} joined by a comma, got {args.pairs}")
    used = [name for name in SINGLES if any(name in p for p in pairs)]
    singles: dict[str, Drafter] = {name: load_drafter(name, hf_model) for name in used}
    strategy = parse_strategy(args.strategy)
    configs: dict[str, SpeculativeDecoder] = {"ar": SpeculativeDecoder(model, None, parse_strategy("ar"))}
    for name, drafter in singles.items():
        configs[name] = SpeculativeDecoder(model, drafter, strategy)
    # like for like at T > 0: a dual draft verifies deterministic top-1 chains with NSS (routing or merging
    # sampled drafts is lossy), while a single draft's chain:L is sampled from its law and verified with the
    # strategy's verifier (naive), which gains where the draft's law has several tokens; these single-draft
    # configurations draft as the dual heads do (greedy: identical to the plain ones, so not run)
    sampled_only = {f"{name}/nss" for name in singles}
    for name, drafter in singles.items():
        configs[f"{name}/nss"] = SpeculativeDecoder(model, drafter, parse_strategy(args.strategy, "nss"))
    for mode in MODES:
        for first, second in pairs:
            priors = (load_route_prior(first), load_route_prior(second))  # read by route-calibrated only
            configs[f"{mode}({first},{second})"] = SpeculativeDecoder(
                model, DualDrafter(singles[first], singles[second], mode, priors), strategy)
    if args.only:
        keep = {"ar", *args.only.split(";")}
        configs = {k: v for k, v in configs.items() if k in keep}
    totals: dict[tuple[str, str, str], dict[str, Any]] = {}
    encoded = {w: [chat_prompt_ids(tokenizer, t) for t in texts] for w, texts in workloads.items()}
    start_all = time.perf_counter()
    for workload, prompts in encoded.items():
        for sampling_name, sampling in SAMPLINGS.items():
            for index, prompt in enumerate(prompts):
                reference: list[int] | None = None
                for name, decoder in configs.items():
                    if name in sampled_only and sampling.greedy:
                        continue
                    key = (workload, sampling_name, name)
                    row = totals.setdefault(key, {"tokens": 0, "seconds": 0.0, "passes": 0, "reads": 0,
                                                  "accepted": 0, "head_accepted": [0, 0],
                                                  "head_selected": [0, 0], "identical": True})
                    with _ReadCounter() as reads:
                        start = time.perf_counter()
                        result = decoder.generate([prompt], max_new_tokens=new, sampling=sampling,
                                                  eos_token_id=tokenizer.eos_token_id)
                        seconds = time.perf_counter() - start
                    m = result.metrics
                    if reference is None:
                        reference = result.tokens[0]
                    row["identical"] = row["identical"] and result.tokens[0] == reference
                    row["tokens"] += len(result.tokens[0])
                    row["seconds"] += seconds
                    row["passes"] += m.target_passes
                    row["reads"] += reads.count
                    row["accepted"] += sum(t * n for t, n in enumerate(m.accepted_length_histogram))
                    for h in range(len(m.head_accepted_tokens)):
                        row["head_accepted"][h] += m.head_accepted_tokens[h]
                        row["head_selected"][h] += m.head_selected[h]
                print(f"[{time.perf_counter() - start_all:.0f}s] {workload} {sampling_name} prompt {index + 1}"
                      f"/{len(prompts)} done", file=sys.stderr, flush=True)
    rows = []
    for (workload, sampling_name, name), row in totals.items():
        ar = totals[(workload, sampling_name, "ar")]
        ar_rate = ar["tokens"] / ar["seconds"]
        rate = row["tokens"] / row["seconds"]
        steps = max(row["passes"], 1)
        if name in singles or name in sampled_only:
            per_head = [row["accepted"] / steps, 0.0]
        else:
            per_head = [a / steps for a in row["head_accepted"]]
        rows.append({
            "workload": workload, "sampling": sampling_name, "config": name,
            "strategy": configs[name].label(SAMPLINGS[sampling_name]), "tokens": row["tokens"],
            "target_passes": row["passes"], "block_efficiency": row["tokens"] / steps, "tokens_per_s": rate,
            "ratio_to_ar": rate / ar_rate, "host_reads_per_step": row["reads"] / steps,
            "accepted_draft_tokens": row["accepted"],
            "accepted_per_step_per_head": per_head if name != "ar" else [0.0, 0.0],
            "head_accepted_tokens": row["head_accepted"], "head_selected": row["head_selected"],
            "identical_to_ar": row["identical"] if sampling_name == "greedy" else None,
        })
    commit = git_commit()
    meta = {
        "command": "PYTHONPATH=$PWD python bench/dual.py " + " ".join(sys.argv[1:]), "commit": commit,
        "hardware": f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores, torch "
                    f"{torch.__version__}, {args.threads} thread(s), device {args.device}".replace("  ", " "),
        "caveat": args.caveat,
        "prompts": f"{prompts_n} per workload: chat = spec_fast.drafts.prompts.HELDOUT_PROMPTS, input-grounded = "
                   f"bench.defaults.INPUT_GROUNDED (summarise / rewrite / list / copy a given passage; checked "
                   f"absent from the retrieval datastore's training prompts); {new} new tokens",
        "sampling": "greedy; T=0.7, top-p 0.9, seed 0 (same seed for every configuration)",
        "per_head_shape": args.strategy,
        "target": "SmolLM2-135M-Instruct float32 on "
                  + ("the lean forward (spec_fast.lean, native products)" if args.target == "lean"
                     else "transformers' forward"),
        "wall_s": time.perf_counter() - start_all,
    }
    table = ["| workload | sampling | config | block eff. | tok/s | x AR | accepted/step (head 1, 2) "
             "| selected (head 1, 2) | host reads/step | = AR |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        same = "" if r["identical_to_ar"] is None else str(r["identical_to_ar"])
        heads = ", ".join(f"{a:.2f}" for a in r["accepted_per_step_per_head"])
        table.append(f"| {r['workload']} | {r['sampling']} | {r['config']} | {r['block_efficiency']:.2f} "
                     f"| {r['tokens_per_s']:.2f} | {r['ratio_to_ar']:.2f} | {heads} | {r['head_selected']} "
                     f"| {r['host_reads_per_step']:.1f} | {same} |")
    table += ["", "accepted/step: draft tokens accepted per target pass from each head (singles: head 1 only). "
              "Selected: route, route-calibrated = steps whose tree was that head's; merge = steps whose accepted "
              "path came from "
              "that head (steps accepting nothing count for neither). = AR: greedy only (sampled runs are "
              "lossless in distribution, not token for token). X/nss (T > 0 only): the single draft X drafting as a dual "
              "head does (deterministic top-1 chain, NSS), the like-for-like baseline of merge and routes, which "
              "cannot verify sampled drafts. Summary: (vs best single) = a route's block efficiency / the best single "
              "head's, and its tok/s / the fastest single head's, same run. A route step drafts one head's whole "
              "chain (the model-free head, else head 1) plus part or none of the other's, and verifies a chain of "
              "the same length, so it costs at least a step of that head alone: where a route's block efficiency "
              "is below that head's, the route is slower than that head however cheap the other head's drafting.",
              ""]
    summary = ["| workload | sampling | pair | best single (BE) | merge BE >= best single | best single (tok/s) "
               "| route BE (vs best single) | route x AR (vs fastest single) | route-calibrated BE (vs best single) "
               "| route-calibrated x AR (vs best single) | like for like: best single /nss (BE, tok/s) "
               "| route-calibrated vs it (BE, tok/s) |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    by_key = {(r["workload"], r["sampling"], r["config"]): r for r in rows}
    for workload in workloads:
        for sampling_name in SAMPLINGS:
            for first, second in pairs:
                names = (first, second, f"merge({first},{second})", f"route({first},{second})",
                         f"route-calibrated({first},{second})")
                if any((workload, sampling_name, n) not in by_key for n in names):
                    continue
                head_rows = [by_key[(workload, sampling_name, n)] for n in names[:2]]
                merge, route, calibrated = (by_key[(workload, sampling_name, n)] for n in names[2:])
                best_be = max(head_rows, key=lambda r: float(r["block_efficiency"]))
                best_rate = max(head_rows, key=lambda r: float(r["tokens_per_s"]))
                nss_rows = [by_key.get((workload, sampling_name, f"{n}/nss")) for n in names[:2]]

                def like_for_like(routed: dict[str, Any]) -> str:
                    if any(r is None for r in nss_rows):  # greedy: the plain single rows are already alike
                        return "(as best single) | (as best single) |"
                    kept = [r for r in nss_rows if r is not None]
                    be = max(kept, key=lambda r: float(r["block_efficiency"]))
                    rate = max(kept, key=lambda r: float(r["tokens_per_s"]))
                    return (f"{be['config']} {be['block_efficiency']:.2f}, {rate['config']} {rate['ratio_to_ar']:.2f}x "
                            f"| {routed['block_efficiency'] / be['block_efficiency']:.2f}x, "
                            f"{routed['tokens_per_s'] / rate['tokens_per_s']:.2f}x |")

                summary.append(
                    f"| {workload} | {sampling_name} | ({first},{second}) | {best_be['config']} "
                    f"{best_be['block_efficiency']:.2f} | {merge['block_efficiency'] >= best_be['block_efficiency']} "
                    f"| {best_rate['config']} {best_rate['ratio_to_ar']:.2f}x | "
                    f"{route['block_efficiency']:.2f} ({route['block_efficiency'] / best_be['block_efficiency']:.2f}x) "
                    f"| {route['ratio_to_ar']:.2f}x ({route['tokens_per_s'] / best_rate['tokens_per_s']:.2f}x) "
                    f"| {calibrated['block_efficiency']:.2f} "
                    f"({calibrated['block_efficiency'] / best_be['block_efficiency']:.2f}x) "
                    f"| {calibrated['ratio_to_ar']:.2f}x "
                    f"({calibrated['tokens_per_s'] / best_rate['tokens_per_s']:.2f}x) | {like_for_like(calibrated)}")
    table += summary

    def plot(plt: Any) -> Any:
        cells = [(w, s) for w in workloads for s in SAMPLINGS]
        names = list(configs)
        fig, axes = plt.subplots(1, 2, figsize=(12, 5), sharey=True)
        height = 0.8 / len(cells)
        for c, (w, s) in enumerate(cells):
            ys = [i + c * height for i in range(len(names))]
            axes[0].barh(ys, [by_key.get((w, s, n), {}).get("block_efficiency", 0.0) for n in names], height,
                         label=f"{w}, {s}")
            axes[1].barh(ys, [by_key.get((w, s, n), {}).get("ratio_to_ar", 0.0) for n in names], height)
        axes[0].set_yticks([i + 0.4 - height / 2 for i in range(len(names))], names)
        axes[0].set_xlabel("block efficiency (tokens / target pass)")
        axes[0].legend(fontsize=7)
        axes[1].axvline(1.0, color="k", lw=0.8)
        axes[1].set_xlabel("tokens/s relative to AR (same run)")
        fig.tight_layout()
        return fig

    write_results(args.out, "dual", f"Dual drafting: merge / route / route-calibrated for "
                  f"{', '.join('(' + ', '.join(p) + ')' for p in pairs)}, per head {args.strategy}, greedy and "
                  f"T=0.7/top-p 0.9", meta, rows, table, plot)


if __name__ == "__main__":
    main()
