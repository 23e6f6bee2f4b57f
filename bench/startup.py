"""How long a run with a filled model cache takes to print its first token, against the floor set by
importing torch alone, in one run.

Runs, alternately, ``python -m spec_fast generate "Hi" --max-new-tokens 1 -q`` (the default model from the
model cache of ``$SPEC_FAST_CACHE``, filled first if needed) and ``python -c "import torch"`` (the floor of
any torch program), timing each process to its first byte on stdout (generation) or to its exit (the
import). The load average is recorded with every round: the machine is shared, so absolute times move
with it. Writes ``bench/results/startup.{json,md}``.

    python bench/startup.py            # 5 rounds
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench._git import git_commit  # noqa: E402

from bench._common import write_results  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
GENERATE = [sys.executable, "-m", "spec_fast", "generate", "Hi", "--max-new-tokens", "1", "-q"]
IMPORTS = [sys.executable, "-c", "import torch"]


def first_output(command: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    proc.stdout.read(1)
    first = time.perf_counter() - start
    proc.stdout.read()
    if proc.wait() != 0:
        raise SystemExit(f"{command} failed")
    return first


def exit_time(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    args = parser.parse_args(argv)
    exit_time(GENERATE)  # fills the model cache if it is empty
    rows: list[dict[str, Any]] = []
    for round_index in range(args.rounds):
        load = os.getloadavg()[0]
        generate = first_output(GENERATE)
        imports = exit_time(IMPORTS)
        rows.append({"round": round_index, "load_average": load, "first_token_s": generate, "imports_only_s": imports,
                     "beyond_imports_s": generate - imports})
        print(rows[-1], flush=True)
    commit = git_commit()
    med = {k: statistics.median(r[k] for r in rows) for k in ("first_token_s", "imports_only_s", "beyond_imports_s")}
    meta = {
        "command": "python bench/startup.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": commit,
        "hardware": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "model cache": os.environ.get("SPEC_FAST_CACHE", "default (~/.cache/spec-fast)"),
        "median first token": f"{med['first_token_s']:.2f} s (`import torch` alone {med['imports_only_s']:.2f} s, "
                              f"the rest {med['beyond_imports_s']:.2f} s)",
        "caveat": "the machine is shared with other jobs; load average per round",
    }
    table = ["| round | load average | first token (s) | `import torch` alone (s) | the rest (s) |",
             "|---|---|---|---|---|"]
    table += [f"| {r['round']} | {r['load_average']:.2f} | {r['first_token_s']:.2f} | {r['imports_only_s']:.2f} | "
              f"{r['beyond_imports_s']:.2f} |" for r in rows]

    def plot(plt: Any) -> Any:
        fig, ax = plt.subplots(figsize=(5, 3))
        ax.plot([r["load_average"] for r in rows], [r["first_token_s"] for r in rows], "o", label="first token")
        ax.plot([r["load_average"] for r in rows], [r["imports_only_s"] for r in rows], "x", label="import torch alone")
        ax.set_xlabel("load average")
        ax.set_ylabel("seconds")
        ax.legend()
        return fig

    write_results(args.out, "startup", "Time to the first token with a filled model cache", meta, rows, table, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
