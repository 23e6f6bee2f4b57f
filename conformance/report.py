"""The conformance report: ``conformance.json`` (everything, exact values) and ``conformance.md`` (for people).

Exact probabilities are written as fraction strings (``"1/3"``) in the JSON, so a counterexample can be pasted
into a test as ``Fraction("1/3")``; the Markdown shows them shortened.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
from collections.abc import Mapping, Sequence
from fractions import Fraction
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from spec_ref.testing import CaseReport

from conformance.runner import Budget, RuleResult

__all__ = ["environment", "to_json", "to_markdown", "summary_lines", "write"]

ROOT = Path(__file__).resolve().parent.parent


def _plain(value: Any) -> Any:
    """JSON-ready: Fractions as exact strings, arrays as lists, tree tables as {"(prefix)": row}."""
    if isinstance(value, Mapping):
        return {str(tuple(k)) if isinstance(k, tuple) else str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Fraction):
        return str(value) if value.denominator != 1 else int(value)
    if isinstance(value, (np.floating, float)):
        return float(value)
    if isinstance(value, (np.integer, int)):
        return int(value)
    return value


def _short(value: Any) -> str:
    """A compact rendering for Markdown: small fractions exact, others as 6-digit floats."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_short(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (np.ndarray, list, tuple)):
        return "[" + ", ".join(_short(v) for v in (value.tolist() if isinstance(value, np.ndarray) else value)) + "]"
    if isinstance(value, Fraction):
        return str(value) if value.denominator < 10**6 else f"{float(value):.6g}"
    if isinstance(value, (float, np.floating)):
        nearby = Fraction(float(value)).limit_denominator(10**4)
        return str(nearby) if float(nearby) == float(value) and nearby.denominator > 1 else f"{float(value):.6g}"
    return str(value)


def _number(value: float | None) -> float | None:
    """A float for JSON; NaN (no distance: a contract violation) becomes null."""
    return None if value is None or math.isnan(value) else float(value)


def _case(case: CaseReport) -> dict[str, Any]:
    return {
        "case": case.name,
        "target_probs": _plain(case.target_probs),
        "draft_probs": _plain(case.draft_probs),
        "drafts": case.drafts,
        "total_variation": _number(case.total_variation),
        "p_value": _number(case.p_value),
        "samples": case.samples,
        "worst_outcome": _plain(case.worst_outcome),
        "output_probability": _number(case.output_probability),
        "target_probability": _number(case.target_probability),
        "violation": case.violation,
    }


def _verdict(result: RuleResult) -> str:
    if result.lossless is None:
        return "skipped"
    return "lossless" if result.lossless else "lossy"


def _rule_json(result: RuleResult, by_name: Mapping[str, RuleResult]) -> dict[str, Any]:
    rule, report = result.rule, result.report
    out: dict[str, Any] = {
        "rule": rule.name, "title": rule.title, "source": rule.source, "check": rule.check, "mode": rule.mode,
        "arithmetic": "float" if rule.mode == "statistical" else rule.arithmetic,
        "expected": "lossless" if rule.lossless else "lossy", "verdict": _verdict(result),
        "as_expected": result.as_expected, "why": rule.why, "size": result.size,
        "sizes_checked": list(result.sizes_checked), "samples": result.samples, "seconds": round(result.seconds, 3),
    }
    if result.skipped:
        out["skipped"] = result.skipped
    if report is not None:
        out.update(alpha=report.alpha, power=report.power, tv=report.tv, cases=len(report.cases),
                   failed_cases=[c.name for c in report.cases if not c.lossless], worst_case=_case(report.worst))
    if result.certificate_tv is not None:
        out["certificate_exact_tv"] = result.certificate_tv
    if rule.control is not None:
        control = by_name.get(rule.control)
        out["control"] = None if control is None or control.report is None else {
            "rule": rule.control, "rejected": not control.report.lossless,
            "p_value": control.report.worst.p_value, "exact_tv": control.certificate_tv,
        }
    return out


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment() -> dict[str, Any]:
    """The commit and machine a run is on."""
    versions = {"python": platform.python_version()}
    for name in ("numpy", "scipy", "torch", "transformers"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return {
        "commit": _git("rev-parse", "HEAD") or "unknown",
        "uncommitted_changes": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "machine": {"platform": platform.platform(), "cpu": _cpu(), "cpu_count": os.cpu_count()},
        "versions": versions,
    }


def to_json(results: Sequence[RuleResult], budget: Budget, env: Mapping[str, Any], seconds: float) -> dict[str, Any]:
    by_name = {r.rule.name: r for r in results}
    return {
        "command": f"python -m conformance --budget {budget.name}",
        "budget": budget.name,
        "settings": {
            "alpha": budget.alpha, "power": budget.power, "tv": budget.tv, "seed": budget.seed,
            "random_cases": budget.random_cases, "statistical_random_cases": budget.statistical_random_cases,
            "ladders": {k: [list(s) for s in v] for k, v in budget.ladders.items()},
        },
        **env,
        "seconds": round(seconds, 2),
        "all_as_expected": all(r.as_expected is not False for r in results),
        "rules": [_rule_json(r, by_name) for r in results],
    }


def _size(size: Mapping[str, int]) -> str:
    short = {"vocab_size": "V", "num_drafts": "K", "draft_length": "L", "num_paths": "K", "depth": "depth"}
    return " ".join(f"{short.get(k, k)}={v}" for k, v in size.items())


def _worst(rule: Mapping[str, Any]) -> str:
    worst = rule.get("worst_case")
    if worst is None:
        return "-"
    if worst["total_variation"] is None:
        return f"violation (`{worst['case']}`)"
    text = f"TV {worst['total_variation']:.3g}"
    if worst["p_value"] is not None:
        text += f", p {worst['p_value']:.3g}"
    return text + f" (`{worst['case']}`)"


def summary_lines(data: Mapping[str, Any]) -> list[str]:
    """One line per rule for stdout."""
    lines = []
    for rule in data["rules"]:
        mark = {True: "ok  ", False: "FAIL", None: "skip"}[rule["as_expected"]]
        lines.append(
            f"{mark} {rule['rule']:<38} expected {rule['expected']:<8} verdict {rule['verdict']:<8} "
            f"{rule['mode']:<11} {_size(rule['size']):<18} {_worst(rule).replace('`', '')}  {rule['seconds']:.2f} s"
        )
    return lines


def to_markdown(data: Mapping[str, Any]) -> str:
    settings = data["settings"]
    out = [
        "# Conformance: the kit run on the acceptance rules that engines ship",
        "",
        f"`{data['command']}` at commit `{data['commit'][:12]}`"
        + (" (with uncommitted changes)" if data["uncommitted_changes"] else "")
        + f", {data['machine']['cpu']} ({data['machine']['cpu_count']} cores), {data['machine']['platform']}; "
        + ", ".join(f"{k} {v}" for k, v in data["versions"].items())
        + f". Whole run: {data['seconds']:.1f} s. Every verdict as expected: **{data['all_as_expected']}**.",
        "",
        "Exact mode enumerates every random branch of the rule (and every draft) in rational arithmetic: "
        "alpha 0, power 1, and the total variation (TV) shown is the exact distance of the rule's output law from "
        f"the target law. Statistical mode: chi-square per case at alpha {settings['alpha']:g} for the whole check, "
        f"samples for power {settings['power']} against any output law at TV >= {settings['tv']} per case; the TV "
        "shown is empirical. Sizes: V vocabulary, L draft length, K drafts or paths. Each rule is checked "
        "on a ladder of sizes, smallest first; a lossy rule's ladder stops at the first rejection, so its worst "
        "case is a counterexample of the smallest size that has one (docs/conformance.md).",
        "",
        "| rule | check | mode | expected | verdict | worst case | size | samples | seconds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for rule in data["rules"]:
        verdict = rule["verdict"] + ("" if rule["as_expected"] is not False else " (NOT as expected)")
        out.append(
            f"| `{rule['rule']}` | {rule['check']} | {rule['mode']} | {rule['expected']} | {verdict} | "
            f"{_worst(rule)} | {_size(rule['size'])} | {rule['samples']} | {rule['seconds']:.2f} |"
        )
    out += ["", "## Rules", ""]
    for rule in data["rules"]:
        out += [f"### `{rule['rule']}`: {rule['title']}", "", f"- source: {rule['source']}", f"- rule: {rule['why']}"]
        if rule.get("skipped"):
            out += [f"- skipped: {rule['skipped']}", ""]
            continue
        out.append(f"- sizes checked: {'; '.join(_size(s) for s in rule['sizes_checked'])}")
        if rule["mode"] == "statistical":
            out.append(f"- alpha {rule['alpha']:g} for the check, power >= {rule['power']:.4f} per case against TV >= "
                       f"{rule['tv']:g}, {rule['samples']} samples")
        if rule.get("control"):
            control = rule["control"]
            out.append(f"- negative control `{control['rule']}` at the same settings: "
                       f"{'rejected' if control['rejected'] else 'NOT rejected'} (p {control['p_value']:.3g}); "
                       f"its exact worst-case TV {control['exact_tv']:.3g} on these cases "
                       f"({'>=' if control['exact_tv'] >= rule['tv'] else '<'} the TV the power is stated at)")
        if "certificate_exact_tv" in rule:
            out.append(f"- exact worst-case TV of its transcription on the same cases: {rule['certificate_exact_tv']:.4g}")
        worst = rule["worst_case"]
        if rule["verdict"] == "lossy":
            out += [
                f"- counterexample (`{worst['case']}`, {_size(rule['size'])}): TV {worst['total_variation'] or 0:.6g}"
                + (f", p-value {worst['p_value']:.3g} over {worst['samples']} samples" if worst["p_value"] is not None
                   else " (exact)"),
                f"  - target_probs = `{_short(worst['target_probs'])}`",
                f"  - draft_probs = `{_short(worst['draft_probs'])}`",
                f"  - drafts: {worst['drafts']}",
            ]
            if worst["violation"]:
                out.append(f"  - violation: {worst['violation']}")
            else:
                out.append(f"  - largest gap at outcome `{_short(worst['worst_outcome'])}`: rule "
                           f"{worst['output_probability']:.6g}, target {worst['target_probability']:.6g}")
        out.append("")
    return "\n".join(out)


def write(data: Mapping[str, Any], directory: Path) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    json_path, md_path = directory / "conformance.json", directory / "conformance.md"
    json_path.write_text(json.dumps(data, indent=1) + "\n")
    md_path.write_text(to_markdown(data))
    return json_path, md_path
