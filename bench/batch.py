"""Continuous batching on the default model: aggregate tokens/s and per-request latency with 1, 2, 4 and 8
concurrent requests arriving staggered, plain and default speculative decoding, 1 and 2 threads.

Each cell runs ``concurrency`` greedy requests (held-out chat prompts, ``bench.workloads.HELDOUT``), each
ending at the end-of-sequence token or after ``--max-new-tokens`` tokens, through
one :class:`spec_fast.BatchEngine` with ``max_batch_size = concurrency``; request i arrives before engine
step ``i * stagger``. Three configurations (and a fourth, below): plain decoding, the default draft and strategy at its fixed depth,
and the default as BatchEngine runs it (``depth_policy="cost"``: each step's depth from the batch's size and
the measured cost of a step, spec_fast/engine/batch_depth.py). Aggregate tokens/s = generated tokens of all requests / seconds from the first
arrival to the last finish. Right after each run, the same requests with the same arrivals run one at a time
(``max_batch_size=1``): "x one at a time" is the run's tok/s over theirs (the median over the runs), the
speedup of batching on the same work. Engines reuse the cache entries of shared prompt prefixes (their
default), the one-at-a-time runs alike; a fourth configuration, plain decoding with prefix caching off, shows
what that reuse gives. TTFT = seconds from a request's arrival to its first token, TPOT = seconds per
output token after the first (p50/p95 over the cell's requests). The configurations of one thread count
run interleaved cell by cell, so their ratios are measured side by side; with ``--repeats R`` each cell runs R
times, the configurations in a rotated order each time, and reports the run of median throughput (every
run's tokens/s is in the JSON: one run of a cell lasts a second or two, about as long as this machine's
swings in speed); "x plain" pairs run i of a configuration with plain's run i of the same round and reports
the median of those ratios; every greedy request's tokens are
checked against plain decoding of it alone. The machine may be shared: the 1-minute load average before
every cell is recorded. Writes ``bench/results/batch.{json,md,png}``.

    python bench/batch.py                   # 48 new tokens per request, a few minutes on 2 cores
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
from bench._git import git_commit  # noqa: E402

from bench._common import write_results  # noqa: E402
from spec_fast.api import load_decoder  # noqa: E402
from spec_fast.engine.batch_depth import measure_pass_cost  # noqa: E402
from spec_fast.engine.batch_engine import BatchEngine  # noqa: E402
from spec_fast.decoding import SamplingParams  # noqa: E402
from bench.workloads import HELDOUT  # noqa: E402
from spec_fast.engine import SpeculativeDecoder  # noqa: E402
from spec_fast.models import chat_prompt_ids  # noqa: E402
from spec_fast.settings import resolve_settings  # noqa: E402

CONCURRENCY = (1, 2, 4, 8)
#: plain decoding on engines without prefix caching: what reusing the prompts' shared opening gives
NO_PREFIX_CACHE = "plain, prefix caching off"


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def run_cell(decoder: SpeculativeDecoder, prompts: list[list[int]], new_tokens: int, stagger: int,
             eos_token_id: int | None = None, max_batch_size: int | None = None, **engine_options: Any
             ) -> dict[str, Any]:
    """One cell: ``len(prompts)`` requests, request i added before step ``i * stagger``, at most
    ``max_batch_size`` (default: all) decoded together; a request ends at ``eos_token_id`` or after
    ``new_tokens`` tokens."""
    engine = BatchEngine(decoder, max_batch_size=max_batch_size or len(prompts), eos_token_id=eos_token_id,
                         **engine_options)
    tokens: dict[int, list[int]] = {}
    stats: dict[int, Any] = {}
    order: list[int] = []
    step = 0
    # where the time goes: admissions (prefill and joining the batch), departures (freeing rows), and decoding
    # steps by the rows they decode (instance attributes, removed again below)
    spent = {"admit": 0.0, "depart": 0.0}
    by_rows: dict[int, list[float]] = {}

    def timed(name: str, function: Any) -> Any:
        def call(*args: Any) -> Any:
            begin = time.perf_counter()
            try:
                return function(*args)
            finally:
                spent[name] += time.perf_counter() - begin
        return call

    def timed_step(state: Any) -> Any:
        rows, begin = sum(state.active), time.perf_counter()
        try:
            return decode_step(state)
        finally:
            by_rows.setdefault(rows, []).append(time.perf_counter() - begin)

    decode_step = decoder.step
    engine._admit = timed("admit", engine._admit)  # type: ignore[method-assign]
    engine._keep_rows = timed("depart", engine._keep_rows)  # type: ignore[method-assign]
    decoder.step = timed_step  # type: ignore[method-assign]
    start = time.perf_counter()
    try:
        while len(order) < len(prompts) or engine.has_unfinished():
            while len(order) < len(prompts) and len(order) * stagger <= step:
                rid = engine.add_request(prompts[len(order)], SamplingParams(), new_tokens)
                order.append(rid)
                tokens[rid] = []
            for out in engine.step():
                tokens[out.request_id].extend(out.new_tokens)
                if out.finished:
                    stats[out.request_id] = out.stats
            step += 1
        seconds = time.perf_counter() - start
    finally:
        del decoder.step
    generated = sum(len(t) for t in tokens.values())
    ttft = [stats[r].ttft_s for r in order]
    tpot = [stats[r].tpot_s for r in order]
    return {"tokens_per_s": generated / seconds, "seconds": seconds, "generated_tokens": generated,
            "steps": step, "ttft_p50_s": percentile(ttft, 0.5), "ttft_p95_s": percentile(ttft, 0.95),
            "tpot_p50_s": percentile(tpot, 0.5), "tpot_p95_s": percentile(tpot, 0.95),
            "mean_accepted_length": statistics.mean(stats[r].mean_accepted_length for r in order),
            "prefix_reused_tokens": engine.prefix_cache.reused_tokens if engine.prefix_cache is not None else 0,
            "admit_s": spent["admit"], "depart_s": spent["depart"],
            "decode_steps_by_rows": {rows: {"steps": len(t), "seconds": sum(t)} for rows, t in sorted(by_rows.items())},
            "tokens": [tokens[r] for r in order]}


def ceiling(batched: dict[str, Any], alone: dict[str, Any]) -> float:
    """The "x one at a time" the batched run would reach if each of its decoding steps cost what a one-row
    step cost in the one-at-a-time run: its admissions as measured, nothing else. What the arrival schedule,
    the requests' lengths and their prefills leave to batching at best."""
    one_row = alone["decode_steps_by_rows"].get(1)
    if not one_row or not one_row["steps"]:
        return float("nan")
    per_step = one_row["seconds"] / one_row["steps"]
    steps = sum(cell["steps"] for cell in batched["decode_steps_by_rows"].values())
    best = batched["admit_s"] + steps * per_step
    return float(batched["generated_tokens"] / best / alone["tokens_per_s"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--stagger", type=int, default=2, help="engine steps between two arrivals")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCY))
    parser.add_argument("--repeats", type=int, default=5, help="runs of each cell (the median one is reported)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = parser.parse_args(argv)
    default = resolve_settings()
    configurations: dict[str, SpeculativeDecoder] = {}
    plain_decoder, tokenizer = load_decoder(resolve_settings(strategy="ar"))
    speculative = load_decoder(default)[0]
    label = f"{default.draft}, {default.strategy.label()}"
    configurations["plain"] = plain_decoder
    configurations[f"fixed depth ({label})"] = speculative
    configurations[f"default: depth by batch ({label})"] = speculative
    configurations[NO_PREFIX_CACHE] = plain_decoder
    engine_options: dict[str, dict[str, Any]] = {
        name: {"depth_policy": "cost" if name.startswith("default") else "fixed",
               **({"prefix_cache_tokens": 0} if name == NO_PREFIX_CACHE else {})} for name in configurations}
    prompts = [chat_prompt_ids(tokenizer, p) for p in HELDOUT["chat"][: max(args.concurrency)]]
    alone: dict[int, list[int]] = {}
    pass_costs: dict[int, dict[str, float]] = {}
    step_costs: dict[int, dict[str, float]] = {}
    rows: list[dict[str, Any]] = []
    identical = True
    for threads in args.threads:
        torch.set_num_threads(threads)
        run_cell(plain_decoder, prompts[:2], 4, 1)  # warm-up
        # measured once per thread count, before the timed cells: the target pass (what sets the batching
        # ceiling) and the whole step by depth (the table the batch-aware default reads)
        costs = measure_pass_cost(speculative.target, speculative.device).seconds
        pass_costs[threads] = {f"{r}x{t}": costs[(r, t)] / costs[(1, 1)] for r, t in sorted(costs)}
        pass_costs[threads]["one row, one token (ms)"] = 1000 * costs[(1, 1)]
        steps = speculative.step_cost().seconds
        step_costs[threads] = {f"{r} rows, depth {t - 1}": 1000 * steps[(r, t)] for r, t in sorted(steps)}
        for concurrency in args.concurrency:
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in configurations}
            names = list(configurations)
            for repeat in range(max(1, args.repeats)):
                for name in names[repeat % len(names):] + names[: repeat % len(names)]:
                    load = os.getloadavg()[0]
                    cell = run_cell(configurations[name], prompts[:concurrency], args.max_new_tokens, args.stagger,
                                    tokenizer.eos_token_id, **engine_options[name])
                    # the same requests one at a time (queued together, decoded one after another), right
                    # after: the baseline of "x one at a time", measured side by side
                    alone_cell = cell if concurrency == 1 else run_cell(
                        configurations[name], prompts[:concurrency], args.max_new_tokens, args.stagger,
                        tokenizer.eos_token_id, max_batch_size=1, **engine_options[name])
                    cell["one_at_a_time_tokens_per_s"] = alone_cell["tokens_per_s"]
                    cell["speedup_over_one_at_a_time"] = cell["tokens_per_s"] / alone_cell["tokens_per_s"]
                    cell["ceiling_over_one_at_a_time"] = ceiling(cell, alone_cell)
                    cell["one_at_a_time_decode_steps_by_rows"] = alone_cell["decode_steps_by_rows"]
                    if alone_cell is not cell:
                        identical &= alone_cell.pop("tokens") == cell["tokens"]
                    for i, got in enumerate(cell.pop("tokens")):
                        if i not in alone:
                            alone[i] = plain_decoder.generate([prompts[i]], max_new_tokens=args.max_new_tokens,
                                                              eos_token_id=tokenizer.eos_token_id).tokens[0]
                        identical &= got == alone[i]
                    runs[name].append({"load_average_before": load, **cell})
            for name, done in runs.items():
                middle = sorted(done, key=lambda run: run["tokens_per_s"])[(len(done) - 1) // 2]
                rows.append({"threads": threads, "concurrency": concurrency, "configuration": name, **middle,
                             "tokens_per_s_of_every_run": [run["tokens_per_s"] for run in done],
                             "speedup_over_one_at_a_time": statistics.median(
                                 run["speedup_over_one_at_a_time"] for run in done),
                             "speedup_over_one_at_a_time_of_every_run": [
                                 run["speedup_over_one_at_a_time"] for run in done],
                             "ceiling_over_one_at_a_time": statistics.median(
                                 run["ceiling_over_one_at_a_time"] for run in done)})
                every = ", ".join(f"{run['tokens_per_s']:.0f}" for run in done)
                print(f"{threads} thr, {concurrency} requests, {name}: {middle['tokens_per_s']:.1f} tok/s "
                      f"(runs {every})", flush=True)
    for row in rows:
        one = next(r for r in rows if r["threads"] == row["threads"] and r["concurrency"] == 1
                   and r["configuration"] == row["configuration"])
        plain = next(r for r in rows if r["threads"] == row["threads"] and r["concurrency"] == row["concurrency"]
                     and r["configuration"] == "plain")
        row["speedup_over_one_request_cell"] = row["tokens_per_s"] / one["tokens_per_s"]
        # paired: run i of a configuration over run i of plain, the two a few seconds apart in the same round
        # of the rotation, so that a slow phase of the shared machine counts against both
        paired = [mine / theirs for mine, theirs in zip(row["tokens_per_s_of_every_run"],
                                                        plain["tokens_per_s_of_every_run"])]
        row["ratio_to_plain_of_every_run"] = paired
        row["ratio_to_plain"] = statistics.median(paired)
    meta = {
        "command": "python bench/batch.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": git_commit(), "hardware": f"{platform.machine()}, {os.cpu_count()} CPU cores",
        "model": f"{default.model.describe()}, quantize {default.quantize}",
        "prompts": f"the first {max(args.concurrency)} chat prompts of bench.workloads.HELDOUT, greedy, up to {args.max_new_tokens} new "
                   f"tokens (or the end-of-sequence token), request i arrives before engine step {args.stagger}i",
        "x one at a time": "median over the runs of each run's tok/s over the tok/s of the same requests decoded one "
                           "at a time (the same arrivals, max_batch_size=1) right after it; x 1-request cell: the "
                           "median run's tok/s over that of the cell of the first request alone",
        "prefix caching": "on except in the configuration '" + NO_PREFIX_CACHE + "' (BatchEngine's default: a "
                          "request reuses the cache entries of a prompt prefix an earlier request of its engine "
                          "computed; the chat template's system message is 24 tokens)",
        "x plain": "median over the runs of run i's tok/s over plain's run i (the runs of one round a few seconds "
                   "apart, the configurations' order rotated from round to round)",
        "every request's tokens equal plain decoding of it alone": identical,
        "load average (1 min) before the cells": f"{min(r['load_average_before'] for r in rows):.1f} to "
                                                   f"{max(r['load_average_before'] for r in rows):.1f}",
        "target pass cost, rows x tokens per row, relative to one row of one token "
        "(spec_fast.engine.batch_depth.measure_pass_cost)":
            "; ".join(f"{threads} thread(s): " + ", ".join(f"{k} {v:.2f}" for k, v in table.items())
                      for threads, table in pass_costs.items()),
        "ms of one decoding step of the default by rows and draft depth "
        "(spec_fast.engine.batch_depth.measure_step_cost, the table the batch-aware default reads)":
            "; ".join(f"{threads} thread(s): " + ", ".join(f"{k} {v:.1f}" for k, v in table.items())
                      for threads, table in step_costs.items()),
    }
    table = ["| threads | requests | configuration | tok/s (median run) | every run | x one at a time (every run) | "
             "x 1-request cell | x plain (every run) | TTFT p50 / p95 (s) | TPOT p50 / p95 (ms) | accepted/step | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        every = ", ".join(f"{v:.0f}" for v in r["tokens_per_s_of_every_run"])
        table.append(f"| {r['threads']} | {r['concurrency']} | {r['configuration']} | {r['tokens_per_s']:.1f} | {every} | "
                     f"{r['speedup_over_one_at_a_time']:.2f} ("
                     f"{', '.join(f'{v:.2f}' for v in r['speedup_over_one_at_a_time_of_every_run'])}) | "
                     f"{r['speedup_over_one_request_cell']:.2f} | {r['ratio_to_plain']:.2f} ("
                     f"{', '.join(f'{v:.2f}' for v in r['ratio_to_plain_of_every_run'])}) | "
                     f"{r['ttft_p50_s']:.2f} / {r['ttft_p95_s']:.2f} | "
                     f"{1000 * r['tpot_p50_s']:.0f} / {1000 * r['tpot_p95_s']:.0f} | "
                     f"{r['mean_accepted_length']:.2f} | {r['load_average_before']:.1f} |")

    table += ["", "Where the median run of each configuration spends its time (seconds from the first arrival to the last "
              "finish): admissions (prefill, joining the batch), departures (freeing rows), decoding steps by the "
              "rows they decode (count x mean ms), and the one-at-a-time run's one-row steps. Ceiling: the x one "
              "at a time of the run if each of its steps cost a one-row step of the one-at-a-time run, its "
              "admissions as measured (median over the runs).", "",
              "| threads | requests | configuration | run (ms) | admissions (ms) | departures (ms) | steps by rows | "
              "one at a time: one-row steps | x one at a time | ceiling |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        steps = ", ".join(f"{rows_}: {c['steps']} x {1000 * c['seconds'] / c['steps']:.2f}"
                          for rows_, c in r["decode_steps_by_rows"].items())
        one = r["one_at_a_time_decode_steps_by_rows"].get(1, {"steps": 0, "seconds": 0.0})
        alone_steps = f"{one['steps']} x {1000 * one['seconds'] / max(one['steps'], 1):.2f}"
        table.append(f"| {r['threads']} | {r['concurrency']} | {r['configuration']} | {1000 * r['seconds']:.0f} | "
                     f"{1000 * r['admit_s']:.0f} | "
                     f"{1000 * r['depart_s']:.1f} | {steps} | {alone_steps} | {r['speedup_over_one_at_a_time']:.2f} | "
                     f"{r['ceiling_over_one_at_a_time']:.2f} |")

    def plot(plt: Any) -> Any:
        fig, axes = plt.subplots(1, len(args.threads), figsize=(5 * len(args.threads), 3.6), squeeze=False)
        for ax, threads in zip(axes[0], args.threads):
            for name in configurations:
                points = [r for r in rows if r["threads"] == threads and r["configuration"] == name]
                ax.plot([r["concurrency"] for r in points], [r["tokens_per_s"] for r in points], marker="o",
                        label=name)
            ax.set_xscale("log", base=2)
            ax.set_xticks(list(args.concurrency), [str(c) for c in args.concurrency])
            ax.set_xlabel("concurrent requests")
            ax.set_ylabel("aggregate tokens/s")
            ax.set_title(f"{threads} thread{'s' if threads > 1 else ''}")
            ax.legend(fontsize=7)
        return fig

    write_results(args.out, "batch", "Continuous batching: aggregate throughput and latency", meta, rows, table, plot)
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
