"""The engine statistical tests at full power, outside CI: every configuration of
tests/engine/statistical_setup.py at ``FULL_POWER_ROWS`` (power 0.99 at TV 0.02, alpha ``ALPHA_CONFIG``),
with its own negative control at the same rows and seed. CI runs the tree, retrieval and dual
configurations at fewer rows (docs/testing.md section 4.4); this script is the full-power run, its result
committed to bench/results/engine_power.{json,md}.

    PYTHONPATH=$PWD python scripts/engine_power.py                 # every configuration
    PYTHONPATH=$PWD python scripts/engine_power.py --tier tree     # only one tier (full | tree | small)
    PYTHONPATH=$PWD python scripts/engine_power.py --only "NAME;NAME" --out engine_power_subset
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import torch

from bench._git import git_commit
from tests.engine.statistical_setup import (
    ALPHA_CONFIG, DUAL_CONFIGS, FULL_POWER_ROWS, SINGLE_CONFIGS, TARGET_TV, ar_law, decoder_for, detectable_tv,
    power_at_target, sample_counts,
)
from tests.stats import chi2_gof

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench", "results")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tier", choices=["full", "tree", "small"], default=None)
    parser.add_argument("--rows", type=int, default=FULL_POWER_ROWS)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", default="", help="configuration names separated by ;")
    parser.add_argument("--out", default="", help="result file stem under bench/results")
    args = parser.parse_args()
    # the commit the run starts from (HEAD may move while it runs; a dirty tree is marked as such)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                           cwd=os.path.dirname(RESULTS)).stdout.strip()
    at_commit = git_commit() + ("+dirty" if dirty else "")
    print(f"engine_power: running at commit {at_commit}", file=sys.stderr, flush=True)
    torch.set_num_threads(args.threads)
    law = ar_law()
    records = []
    for config in SINGLE_CONFIGS + DUAL_CONFIGS:
        if args.tier is not None and config.tier != args.tier:
            continue
        if args.only and config.name not in args.only.split(";"):
            continue
        start = time.perf_counter()
        law_test = chi2_gof(sample_counts(decoder_for(config), config.name, args.rows), law, ALPHA_CONFIG)
        middle = time.perf_counter()
        control = chi2_gof(sample_counts(decoder_for(config, config.control), config.name, args.rows), law,
                           ALPHA_CONFIG)
        end = time.perf_counter()
        record = {
            "config": config.name, "rows": args.rows, "df": law_test.df, "critical": law_test.critical,
            "statistic": law_test.statistic, "passed": not law_test.rejected, "control": config.control,
            "control_statistic": control.statistic,
            "control_support_violations": len(control.support_violations),
            "control_rejected": control.rejected, "seconds": middle - start, "control_seconds": end - middle,
        }
        records.append(record)
        print(json.dumps(record), file=sys.stderr, flush=True)
    out = {
        "command": "PYTHONPATH=$PWD python scripts/engine_power.py " + " ".join(sys.argv[1:]),
        "commit": at_commit, "hardware": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "torch": torch.__version__, "threads": args.threads, "alpha_per_config": ALPHA_CONFIG, "tv": TARGET_TV,
        "power_at_tv": power_at_target(args.rows), "detectable_tv": detectable_tv(args.rows), "records": records,
    }
    stem = args.out or ("engine_power" + (f"_{args.tier}" if args.tier else ""))
    with open(os.path.join(RESULTS, f"{stem}.json"), "w") as f:
        json.dump(out, f, indent=1)
    lines = [
        "# Engine statistical tests at full power", "",
        f"`{out['command']}` at commit {out['commit']}; {out['hardware']}; torch {out['torch']}, "
        f"{args.threads} thread(s).", "",
        f"{args.rows} rows per configuration, alpha {ALPHA_CONFIG:.3g} per configuration, power at TV "
        f"{TARGET_TV}: {out['power_at_tv']:.3f} (TV detected with power 0.99: {out['detectable_tv']:.4f}).", "",
        "| configuration | chi2 (df) | critical | passed | control | control chi2 | control rejected | seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        lines.append(f"| `{r['config']}` | {r['statistic']:.1f} ({r['df']}) | {r['critical']:.1f} | {r['passed']} | "
                     f"{r['control']} | {r['control_statistic']:.1f} | {r['control_rejected']} | "
                     f"{r['seconds'] + r['control_seconds']:.1f} |")
    with open(os.path.join(RESULTS, f"{stem}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    failed = [r["config"] for r in records if not r["passed"] or not r["control_rejected"]]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
