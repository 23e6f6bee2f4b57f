"""Is the CLI's default strategy ever slower than plain decoding? SmolLM2 greedy, three workloads, one run.

Workloads (3 prompts each by default), ``bench.workloads.TUNING``: ``chat`` (the first held-out chat prompts
of ``spec_fast.drafts.prompts``, never in the retrieval datastore), ``input-grounded`` (summarise, rewrite,
extract or continue a passage given in the prompt), ``long`` (a ~600-token document followed by a question
about it); bench/workloads.py holds them and the held-out prompts that report the chosen defaults.
Configurations: plain decoding (``ar``) and the default ``retrieval`` draft with ``chain:1`` to ``chain:4``,
``chain:2+adaptive`` and ``chain:3+adaptive``, on the target as ``spec-fast generate`` runs it (the lean
forward on the GGUF file's own blocks; ``--quantize none`` for the float32 weights).
Each prompt gets fresh decoders, as one ``spec-fast generate`` process does (so ``+adaptive`` learns within
the reply only). The configurations run prompt by prompt in the order A B C ... C B A, so that a slow
phase of the shared machine hits all of them alike; a configuration's speedup on a prompt is its tokens/s
over both runs divided by that of ``ar`` on the same prompt, and a workload's speedup is the median over
its prompts (the pooled ratio, total tokens / total seconds, is also recorded). Greedy outputs are checked
token for token against ``ar``. Writes ``bench/results/defaults.{json,md}``.

``--temperature T`` (> 0) runs the chat and input-grounded workloads sampled instead (every configuration with
the same seed per prompt; lossless in distribution, so outputs are not compared) and writes
``bench/results/defaults_sampled.{json,md}``: the CLI's default strategy when sampling
(``spec_fast.strategies.DEFAULT_SAMPLED_STRATEGY``) is chosen from that file as the greedy one is from
``defaults.json``.

``--first-acceptance V,...`` adds, for ``chain:4`` and ``chain:8``, the retrieval draft with another first-level
gate than the default's (``spec_fast.drafts.retrieval.FIRST_ACCEPTANCE``; ``none``: every row drafts its first
level), labelled ``chain:4 first=V``: the default's gate is chosen from the same run as its strategy
(tests/engine/test_api.py: a ``first=`` row chosen by the rule fails it).

    python bench/defaults.py          # 3 prompts per workload x 48 new tokens, each configuration twice
    python bench/defaults.py --temperature 0.7
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from typing import Any

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench._git import git_commit  # noqa: E402

from bench._common import write_results  # noqa: E402
from spec_fast.decoding import SamplingParams  # noqa: E402
from spec_fast.engine import SpeculativeDecoder  # noqa: E402
from spec_fast.drafts.heads import load_drafter  # noqa: E402
from spec_fast.drafts.retrieval import load_retrieval_drafter  # noqa: E402
from spec_fast.models import chat_prompt_ids, lean_model, load_cached_lean, load_model  # noqa: E402
from spec_fast.strategies import parse_strategy  # noqa: E402
# the workloads live in bench/workloads.py (the tuning / held-out split); bench/peers.py and bench/dual.py
# still import the tuning passages from here
from bench.workloads import TUNING  # noqa: E402
from bench.workloads import INPUT_GROUNDED as INPUT_GROUNDED, LONG as LONG  # noqa: E402,F401
from bench.workloads import LONG_DOCUMENT as LONG_DOCUMENT, PASSAGE as PASSAGE  # noqa: E402,F401

#: greedy: the retrieval draft loaded by name goes past a chain's first token only where its earlier drafts
#: behind such matches were mostly accepted (spec_fast.drafts.retrieval.PATH_ACCEPTANCE), so the deeper chains
#: differ from chain:1 mostly where a span is copied
CONFIGURATIONS = ("ar", "chain:1", "chain:2", "chain:4", "chain:8", "chain:3+adaptive")
#: sampled: a retrieval draft's deterministic proposals are accepted with the target's probability of them,
#: so shorter chains and the fallback get a closer look
SAMPLED_CONFIGURATIONS = ("ar", "chain:1", "chain:2", "chain:3", "chain:1+adaptive", "chain:2+adaptive",
                          "chain:3+adaptive")
#: the configurations ``--first-acceptance`` runs with other first-level gates
GATE_VARIANTS_OF = ("chain:4", "chain:8")
GATE_LABEL = " first="


def gate_value(text: str) -> float | None:
    """A ``--first-acceptance`` entry: ``none`` or a number in (0, 1)."""
    return None if text == "none" else float(text)


def cli_target(quantize: str) -> tuple[Any, Any]:
    """The default model as ``spec-fast generate`` runs it with a retrieval draft: the lean forward (float32
    from the model cache, or the GGUF file's own blocks with ``quantize="gguf"``)."""
    if quantize == "gguf":
        return load_model(quantize="gguf")
    cached = load_cached_lean(None)
    if cached is not None:
        return cached
    hf_model, tokenizer = load_model()
    return lean_model(hf_model), tokenizer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=3, help="prompts per workload (at most 4)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--draft", default="retrieval")
    parser.add_argument("--quantize", default="gguf", choices=["none", "gguf"],
                        help="the target's weights as spec-fast generate --quantize takes them (default gguf: "
                             "what --quantize auto runs for the default model)")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="> 0: sampled chat and input-grounded workloads -> defaults_sampled.{json,md}")
    parser.add_argument("--first-acceptance", default="",
                        help="comma-separated first-level gates (none or a number in (0, 1)) to run chain:4 and "
                             "chain:8 with besides the default's")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = parser.parse_args(argv)
    if args.prompts > len(TUNING["chat"]):  # more would tune on the prompts held out for reporting
        parser.error(f"--prompts must be at most {len(TUNING['chat'])}, got {args.prompts}")
    torch.set_num_threads(args.threads)
    model, tokenizer = cli_target(args.quantize)
    eos = tokenizer.eos_token_id
    sampled = args.temperature > 0
    configurations: tuple[str, ...] = SAMPLED_CONFIGURATIONS if sampled else CONFIGURATIONS
    gates = [g for g in args.first_acceptance.split(",") if g]
    if gates and args.draft != "retrieval":
        parser.error("--first-acceptance needs --draft retrieval")
    try:
        gate_values = {g: gate_value(g) for g in gates}
    except ValueError:
        parser.error(f"--first-acceptance takes none or numbers, got {args.first_acceptance!r}")
    if any(v is not None and not 0.0 < v < 1.0 for v in gate_values.values()):
        parser.error(f"--first-acceptance values must lie in (0, 1), got {args.first_acceptance!r}")
    configurations += tuple(f"{c}{GATE_LABEL}{g}" for c in GATE_VARIANTS_OF for g in gates)
    workloads = {workload: prompts[: args.prompts] for workload, prompts in TUNING.items()}
    if sampled:  # the long workload's time is its prefill, the same for every configuration
        del workloads["long"]
    # trained drafts are built from the HF model (as the CLI builds them), their LM head on the target's blocks
    drafter = (load_drafter(args.draft, model) if args.draft == "retrieval"
               else load_drafter(args.draft, load_model()[0], target_lm_head=model.get_output_embeddings()))
    strategies = {name: parse_strategy(name.split(GATE_LABEL)[0]) for name in configurations}
    vocab_size = int(model.get_output_embeddings().weight.shape[0])
    # one drafter per gate (a drafter keeps its per-call state in the decoder, so configurations share it)
    gated = {g: load_retrieval_drafter(vocab_size, first_acceptance=v) for g, v in gate_values.items()}
    drafters = {name: gated[name.split(GATE_LABEL)[1]] if GATE_LABEL in name else drafter for name in configurations}
    SpeculativeDecoder(model, None, strategies["ar"]).generate([chat_prompt_ids(tokenizer, "Hi")], max_new_tokens=4)

    rows: list[dict[str, Any]] = []
    loads: list[float] = []  # the machine is shared: its 1-minute load average at the start of every prompt
    identical = True
    for workload, prompts in workloads.items():
        totals = {name: [0, 0.0, 0, 0] for name in configurations}  # tokens, seconds, target passes, prompt tokens
        ratios: dict[str, list[float]] = {name: [] for name in configurations}
        for prompt_index, text in enumerate(prompts):
            sampling = SamplingParams(temperature=args.temperature, seed=prompt_index) if sampled else None
            loads.append(os.getloadavg()[0])
            ids = chat_prompt_ids(tokenizer, text)
            reference: list[int] | None = None
            per_prompt = {name: [0, 0.0] for name in configurations}
            for name in [*configurations, *reversed(configurations)]:
                decoder = SpeculativeDecoder(model, drafters[name] if strategies[name].drafts else None,
                                             strategies[name])
                result = decoder.generate([ids], max_new_tokens=args.max_new_tokens, sampling=sampling,
                                          eos_token_id=eos)
                m = result.metrics
                for acc in (totals[name], per_prompt[name]):
                    acc[0] += m.generated_tokens
                    acc[1] += m.wall_s
                totals[name][2] += m.target_passes
                totals[name][3] += len(ids)
                if not sampled:  # sampled runs are lossless in distribution only: their texts differ
                    if reference is None:
                        reference = result.tokens[0]
                    elif result.tokens[0] != reference:
                        identical = False
                print(f"{workload} {name}: {m.generated_tokens} tokens {m.tokens_per_s:.2f} tok/s", flush=True)
            ar_prompt = per_prompt["ar"][0] / per_prompt["ar"][1]
            for name in configurations:
                ratios[name].append(per_prompt[name][0] / per_prompt[name][1] / ar_prompt)
        ar_rate = totals["ar"][0] / totals["ar"][1]
        for name in configurations:
            tokens, seconds, passes, prompt_tokens = totals[name]
            rows.append({"workload": workload, "configuration": name, "tokens": tokens, "seconds": seconds,
                         "tokens_per_s": tokens / seconds, "speedup_vs_ar": statistics.median(ratios[name]),
                         "speedup_per_prompt": ratios[name], "pooled_speedup_vs_ar": tokens / seconds / ar_rate,
                         "block_efficiency": tokens / max(passes, 1),
                         "mean_prompt_tokens": prompt_tokens / (2 * len(prompts))})

    worst = {name: min(r["speedup_vs_ar"] for r in rows if r["configuration"] == name) for name in configurations}
    meta = {
        "command": "python bench/defaults.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": git_commit(),
        "hardware": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "torch": f"{torch.__version__}, {args.threads} thread(s)",
        "workload": f"SmolLM2-135M-Instruct ({'the GGUF blocks' if args.quantize == 'gguf' else 'float32'}, "
                    f"lean forward as the CLI runs it), "
                    f"{f'sampled at T={args.temperature} (seed = prompt index)' if sampled else 'greedy'}, "
                    f"draft {args.draft}, {args.prompts} prompts per workload x {args.max_new_tokens} new tokens "
                    f"(EOS ends a reply early)",
        "greedy outputs identical to ar": identical if not sampled else "n/a (sampled)",
        "load average": f"{min(loads):.1f}-{max(loads):.1f} (1-minute, at the start of each prompt, {os.cpu_count()} CPUs)",
        "worst median speedup over the workloads": ", ".join(f"{k} {v:.2f}x" for k, v in worst.items()),
        "caveat": "short run on a 2-core machine shared with other jobs: absolute rates are noisy, read the "
                  "ratios (configurations interleaved A B C ... C B A on every prompt)",
    }
    table = ["| workload | configuration | tokens/s | speedup vs ar (median of prompts) | per prompt | pooled | "
             "block efficiency | prompt tokens (mean) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        table.append(f"| {r['workload']} | {r['configuration']} | {r['tokens_per_s']:.2f} | {r['speedup_vs_ar']:.2f}x | "
                     f"{' '.join(f'{x:.2f}' for x in r['speedup_per_prompt'])} | {r['pooled_speedup_vs_ar']:.2f}x | "
                     f"{r['block_efficiency']:.2f} | {r['mean_prompt_tokens']:.0f} |")

    def plot(plt: Any) -> Any:
        fig, ax = plt.subplots(figsize=(max(7.0, 0.9 * len(configurations)), 4))
        names = [n for n in configurations if n != "ar"]
        for i, workload in enumerate(workloads):
            sub = {r["configuration"]: r for r in rows if r["workload"] == workload}
            ax.bar([j + 0.27 * i for j in range(len(names))], [sub[n]["speedup_vs_ar"] for n in names], width=0.27,
                   label=workload)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([j + 0.27 for j in range(len(names))], names, rotation=30, ha="right")
        ax.set_ylabel(f"speedup vs ar ({f'T={args.temperature}' if sampled else 'greedy'})")
        ax.legend()
        return fig

    name, title = ("defaults_sampled", f"Default sampled strategy vs plain decoding by workload (T={args.temperature})") \
        if sampled else ("defaults", "Default strategy vs plain decoding by workload")
    write_results(args.out, name, title, meta, rows, table, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
