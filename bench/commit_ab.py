"""Decoding speed of this checkout against another commit, side by side, in alternating processes.

A change to the Python around the kernels moves a decoding step by a few percent, less than this machine
drifts between two runs (the read bandwidth of one model-sized buffer has measured 26 and 30 GB/s on
different hours): only an A/B inside one run shows it. This bench adds a git worktree of ``--baseline``,
then alternates processes of the two checkouts, the order reversed every round; each process loads the
model from its own checkout (its native library built from its own sources), decodes the same prompts (token
ids computed once, here) and reports decode-only ms per token for each. Per side: the median over the
rounds of each process's median over the prompts; the ratio of the two; whether both gave the same tokens.
The time to the first token (the prompt's prefill and the first step) is reported beside it the same way.

    python bench/commit_ab.py --baseline 61d7606   # writes bench/results/commit_ab.{json,md,png}
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench._common import write_results  # noqa: E402
from bench._git import ROOT, git_commit  # noqa: E402

#: what each process runs, from its checkout's root: load, warm up on the first prompt, decode every prompt
RUNNER = r"""
import json, sys, time
sys.path.insert(0, ".")
import torch
job = json.loads(open(sys.argv[1]).read())
torch.set_num_threads(job["threads"])
from spec_fast.api import load_decoder
from spec_fast.decoding import SamplingParams
from spec_fast.settings import resolve_settings
settings = resolve_settings(**job["settings"])
decoder = load_decoder(settings)[0]
sampling = SamplingParams(temperature=job["temperature"], top_k=job.get("top_k", 0), top_p=job.get("top_p", 1.0),
                          seed=job["seed"])
out = []
with torch.no_grad():
    decoder.generate([job["prompts"][0]], max_new_tokens=8, sampling=sampling)
    for ids in job["prompts"]:
        m = decoder.generate([ids], max_new_tokens=job["max_new_tokens"], sampling=sampling)
        metrics = m.metrics
        decode = (metrics.wall_s - metrics.ttft_s) / max(1, metrics.generated_tokens - 1)
        out.append({"decode_ms": 1e3 * decode, "first_token_ms": 1e3 * metrics.ttft_s, "tokens": list(m.tokens[0]),
                    "passes": metrics.target_passes})
print("RESULT " + json.dumps(out))
"""


def run_side(root: str, job_path: str) -> list[dict[str, Any]]:
    """One process of the checkout at ``root`` over the job; its per-prompt results."""
    done = subprocess.run([sys.executable, "-c", RUNNER, job_path], cwd=root, capture_output=True, text=True,
                          timeout=1800, env={**os.environ, "PYTHONPATH": root})
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the process of {root} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    result: list[dict[str, Any]] = json.loads(lines[-1][len("RESULT "):])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="git revision to compare this checkout against")
    parser.add_argument("--config", choices=("plain", "default"), default="plain",
                        help="plain decoding (--draft none) or the CLI's default")
    parser.add_argument("--workload", default="chat", help="a workload of bench/workloads.py's held-out split")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-k", type=int, default=0, help="sampled: keep the k most likely tokens (0: off)")
    parser.add_argument("--top-p", type=float, default=1.0, help="sampled: nucleus mass (1: off)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    parser.add_argument("--name", default="commit_ab", help="file name of the results under --out")
    args = parser.parse_args()
    if args.prompts < 1 or args.rounds < 1 or args.max_new_tokens < 2 or args.threads < 1:
        print("error: --prompts, --rounds and --threads must be >= 1, --max-new-tokens >= 2", file=sys.stderr)
        return 2
    if args.top_k < 0 or not 0.0 < args.top_p <= 1.0:
        print(f"error: --top-k must be >= 0 and --top-p in (0, 1], got {args.top_k} and {args.top_p}",
              file=sys.stderr)
        return 2
    from bench.workloads import HELDOUT
    from spec_fast.api import load_decoder
    from spec_fast.models import chat_prompt_ids
    from spec_fast.settings import resolve_settings

    if args.workload not in HELDOUT:
        print(f"error: --workload must be one of {', '.join(HELDOUT)}, got {args.workload!r}", file=sys.stderr)
        return 2
    settings: dict[str, Any] = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p}
    if args.config == "plain":
        settings["draft"] = "none"
    tokenizer = load_decoder(resolve_settings(**settings))[1]
    prompts = [chat_prompt_ids(tokenizer, p) for p in HELDOUT[args.workload][:args.prompts]]
    here = git_commit()
    with tempfile.TemporaryDirectory() as scratch:
        base_root = os.path.join(scratch, "baseline")
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", base_root, args.baseline], check=True,
                       capture_output=True)
        try:
            base = git_commit(base_root)
            job_path = os.path.join(scratch, "job.json")
            with open(job_path, "w") as handle:
                json.dump({"threads": args.threads, "settings": settings, "temperature": args.temperature,
                           "top_k": args.top_k, "top_p": args.top_p, "seed": 0,
                           "max_new_tokens": args.max_new_tokens, "prompts": prompts}, handle)
            sides = {"this checkout": ROOT, "baseline": base_root}
            runs: dict[str, list[list[dict[str, Any]]]] = {name: [] for name in sides}
            loads = []
            for round_index in range(args.rounds):
                loads.append(os.getloadavg()[0])
                order = list(sides) if round_index % 2 == 0 else list(sides)[::-1]
                for name in order:
                    runs[name].append(run_side(sides[name], job_path))
                    print(f"round {round_index + 1}/{args.rounds} {name}: "
                          f"{statistics.median(r['decode_ms'] for r in runs[name][-1]):.3f} ms/token",
                          file=sys.stderr)
        finally:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", base_root], capture_output=True)
    medians = {name: [statistics.median(r["decode_ms"] for r in run) for run in runs[name]] for name in sides}
    ms = {name: statistics.median(values) for name, values in medians.items()}
    same = all(a["tokens"] == b["tokens"] for x, y in zip(runs["this checkout"], runs["baseline"])
               for a, b in zip(x, y))
    ratio = ms["baseline"] / ms["this checkout"]
    first = {name: statistics.median(statistics.median(r["first_token_ms"] for r in run) for run in runs[name])
             for name in sides}
    first_ratio = first["baseline"] / first["this checkout"]
    rows = [{"side": name, "commit": here if name == "this checkout" else base, "ms_per_token": ms[name],
             "first_token_ms": first[name], "per_round": medians[name]} for name in sides]
    meta = {
        "command": "python bench/commit_ab.py " + " ".join(sys.argv[1:]),
        "commit": here, "baseline": f"{args.baseline} ({base})",
        "hardware": f"{platform.machine()}, {os.cpu_count()} CPU cores, {args.threads} torch thread(s)",
        "decoding": f"{args.config} ({'greedy' if args.temperature == 0 else f'T={args.temperature}'}"
                    f"{f', top-k {args.top_k}' if args.top_k else ''}"
                    f"{f', top-p {args.top_p}' if args.top_p < 1 else ''}), "
                    f"{args.prompts} prompts of the held-out {args.workload} workload, {args.max_new_tokens} "
                    "new tokens (EOS ends a reply), decode-only (after the first token)",
        "method": f"{args.rounds} rounds, one process per checkout and round, the order reversed every round; "
                  "a side's value = median over rounds of the process's median over prompts",
        "load average (1 min) over the rounds": f"{min(loads):.1f} to {max(loads):.1f}",
        "same tokens on both sides": same,
    }
    table = ["| side | commit | decode ms/token | first token ms | per round (decode) |", "|---|---|---:|---:|---|",
             *(f"| {r['side']} | {r['commit']} | {r['ms_per_token']:.3f} | {r['first_token_ms']:.1f} | "
               f"{', '.join(f'{v:.2f}' for v in r['per_round'])} |" for r in rows),
             "", f"This checkout decodes {ratio:.3f}x as fast as the baseline (baseline ms / this ms); its first "
             f"token comes {first_ratio:.3f}x as fast."]

    def plot(plt: Any) -> Any:
        fig, ax = plt.subplots(figsize=(5, 3))
        for name in sides:
            ax.plot(range(1, args.rounds + 1), medians[name], marker="o", label=f"{name}")
        ax.set_xlabel("round")
        ax.set_ylabel("decode ms/token")
        ax.legend()
        return fig

    write_results(args.out, args.name, "Decoding speed of this checkout against a baseline commit",
                  {**meta, "speedup": round(ratio, 4), "first_token_speedup": round(first_ratio, 4)}, rows, table,
                  plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
