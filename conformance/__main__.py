"""``python -m conformance``: run the kit on every registered acceptance rule and write the report.

    python -m conformance [--budget small|full] [--out DIR] [--only NAME[,NAME...]] [--list]

Writes ``DIR/conformance.json`` and ``DIR/conformance.md`` (default ``bench/results``), prints one line per rule
on stdout and progress on stderr. Exit status 0 when every verdict is the expected one, 1 when some is not,
2 for a bad argument (one line on stderr).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from conformance.report import ROOT, environment, summary_lines, to_json, write
from conformance.rules import RULES
from conformance.runner import BUDGETS, run_rule


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"conformance: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m conformance", description="Run spec_ref's conformance kit on the acceptance "
                     "rules that serving engines ship, and write bench/results/conformance.{json,md}.")
    parser.add_argument("--budget", choices=sorted(BUDGETS), default="full",
                        help="small: CI sizes (a few seconds); full: the committed report (default)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results",
                        help="directory for conformance.json and conformance.md (default bench/results)")
    parser.add_argument("--only", default="", help="comma-separated rule names (default: every rule)")
    parser.add_argument("--list", action="store_true", help="list the rules and exit")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.list:
        for rule in RULES:
            print(f"{rule.name:<38} {rule.check:<6} {rule.mode:<11} {'lossless' if rule.lossless else 'lossy':<8} "
                  f"{rule.title}")
        return 0
    names = [n for n in args.only.split(",") if n]
    known = {rule.name for rule in RULES}
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"--only: unknown rule {unknown[0]!r}; see python -m conformance --list")
    selected = [rule for rule in RULES if not names or rule.name in names]
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out: {args.out} exists and is not a directory")
    budget = BUDGETS[args.budget]
    start = time.perf_counter()
    results = []
    for rule in selected:
        result = run_rule(rule, budget)
        results.append(result)
        print(f"conformance: {rule.name}: {result.skipped or ('lossless' if result.lossless else 'lossy')} "
              f"({result.seconds:.2f} s)", file=sys.stderr)
    data = to_json(results, budget, environment(), time.perf_counter() - start)
    json_path, md_path = write(data, args.out)
    print("\n".join(summary_lines(data)))
    print(f"wrote {json_path} and {md_path} ({data['seconds']:.1f} s)")
    if not data["all_as_expected"]:
        wrong = [r["rule"] for r in data["rules"] if r["as_expected"] is False]
        print(f"conformance: error: verdicts not as expected: {', '.join(wrong)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
