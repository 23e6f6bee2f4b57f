"""The conformance run (``python -m conformance``, docs/conformance.md): every shipped acceptance rule gets its
expected verdict from the kit, at the CI budget.

* exact rules (enumerated, alpha 0, power 1): every lossless rule passes every size of the ladder, every lossy
  rule is rejected and reports a counterexample of positive total variation at the smallest size that has one;
* statistical rules (transformers' own ``_speculative_sampling``, torch's RNG; the pre-fix vllm-ascend block
  verify, a product of uniforms): alpha 1e-6 per check, power 0.99 against TV 0.2 per case, and the lossless
  one has a negative control (the shipped ensemble option) rejected at the same settings, whose exact worst-case
  TV on those cases is at least 0.2 (so the stated power applies to it);
* the Gumbel-max reduction used for greedy rules has teeth: a greedy rule committing the draft at a mismatch
  is rejected;
* the CLI writes the report and answers bad arguments with one line and status 2; the committed report in
  bench/results is a full run in which every registered rule got its expected verdict.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from conformance import vllm
from conformance.__main__ import main
from conformance.rules import RULES, Rule, rule_named
from conformance.runner import BUDGETS, RuleResult, check_once, run_rule
from spec_ref.testing import check_chain_verifier

ROOT = Path(__file__).resolve().parents[2]
SMALL = BUDGETS["small"]
_RESULTS: dict[str, RuleResult] = {}


def result_of(rule: Rule) -> RuleResult:
    """The small-budget result of ``rule``, computed once per session."""
    if rule.name not in _RESULTS:
        missing = rule.missing()
        if missing:
            pytest.skip(f"{rule.name} needs {', '.join(missing)}")
        _RESULTS[rule.name] = run_rule(rule, SMALL)
    return _RESULTS[rule.name]


def _params() -> list[Any]:
    return [pytest.param(rule.name, marks=[pytest.mark.statistical] if rule.mode == "statistical" else [],
                         id=rule.name) for rule in RULES]


@pytest.mark.parametrize("name", _params())
def test_every_rule_gets_its_expected_verdict(name: str) -> None:
    rule = rule_named(name)
    result = result_of(rule)
    report = result.report
    assert report is not None and result.as_expected, f"{name}: expected lossless={rule.lossless}\n{report}"
    assert result.sizes_checked[-1] == result.size
    worst = report.worst
    if rule.lossless:
        assert report.mode == rule.mode and all(case.lossless for case in report.cases)
        return
    # a lossy rule: the ladder stopped at the first rejection and the worst case is a real counterexample
    assert result.size == result.sizes_checked[-1]
    if rule.mode == "exact":
        assert worst.violation is not None or worst.total_variation > (0 if rule.arithmetic == "fraction" else 1e-9)
    else:
        assert worst.p_value is not None
        assert worst.violation is not None or worst.p_value < report.alpha / len(report.cases)


@pytest.mark.statistical
def test_the_statistical_pass_states_its_rates_and_its_control_is_rejected_with_certified_power() -> None:
    plain = result_of(rule_named("hf-speculative-sampling"))
    control_rule = rule_named("hf-speculative-sampling-ensemble")
    assert plain.rule.control == control_rule.name
    control = result_of(control_rule)
    assert plain.report is not None and control.report is not None
    for report in (plain.report, control.report):
        assert report.mode == "statistical" and report.alpha == SMALL.alpha and report.tv == SMALL.tv
        assert report.power >= SMALL.power
    assert plain.report.lossless and not control.report.lossless
    assert plain.size == control.size and plain.samples == control.samples
    assert control.certificate_tv is not None and control.certificate_tv >= SMALL.tv


def _greedy_keeping_the_draft(target_logits: Sequence[Sequence[Any]], draft_tokens: Sequence[int]) -> list[int]:
    """Mutant of vLLM's greedy rule: at the first mismatch it commits the draft instead of the argmax."""
    committed = vllm.greedy(target_logits, draft_tokens)
    mismatch = len(committed) - 1
    if mismatch < len(draft_tokens):
        committed[mismatch] = draft_tokens[mismatch]
    return committed


def test_the_greedy_reduction_rejects_a_greedy_rule_that_commits_the_draft_at_a_mismatch() -> None:
    verifier = vllm.on_sampled_argmax(_greedy_keeping_the_draft)
    report = check_chain_verifier(verifier, vocab_size=2, draft_length=1, random_cases=1)
    assert not report.lossless and report.worst.total_variation > 0.1, str(report)
    rule = rule_named("vllm-greedy")
    assert check_once(rule, rule.build(), (2, 1), SMALL).lossless


def test_the_cli_writes_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    names = ["llama-cpp-server", "seed002-bv-as-described"]
    assert main(["--budget", "small", "--only", ",".join(names), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in names)
    data = json.loads((tmp_path / "conformance.json").read_text())
    assert data["budget"] == "small" and data["all_as_expected"] and data["commit"]
    assert [r["rule"] for r in data["rules"]] == names
    lossy = data["rules"][1]
    assert lossy["verdict"] == "lossy" and lossy["worst_case"]["total_variation"] > 0
    assert all("/" in str(x) or x in (0, 1) for row in lossy["worst_case"]["target_probs"] for x in row)
    assert "seed002-bv-as-described" in (tmp_path / "conformance.md").read_text()


@pytest.mark.parametrize("argv", [["--only", "no-such-rule"], ["--budget", "huge"]])
def test_the_cli_answers_a_bad_argument_with_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("conformance: error:") and err.count("\n") == 1


def test_the_committed_report_is_a_full_run_with_every_rule_as_expected() -> None:
    data = json.loads((ROOT / "bench" / "results" / "conformance.json").read_text())
    assert data["budget"] == "full" and data["all_as_expected"]
    assert [r["rule"] for r in data["rules"]] == [rule.name for rule in RULES]
    for entry in data["rules"]:
        rule = rule_named(entry["rule"])
        assert entry["verdict"] == ("lossless" if rule.lossless else "lossy"), entry["rule"]
        if not rule.lossless:
            worst = entry["worst_case"]
            assert worst["violation"] or worst["total_variation"] > 0, entry["rule"]
    assert (ROOT / "bench" / "results" / "conformance.md").read_text().count("| `") == len(RULES)
