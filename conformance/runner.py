"""Run the kit (spec_ref.testing) on one rule at a budget, and find a minimal counterexample for lossy rules.

Each rule is checked on a ladder of problem sizes, smallest first (the budget's, or the rule's own). A rule
expected to be lossless must pass at every size; the first size at which the kit rejects a rule stops its
ladder, so the reported worst case is a counterexample of the smallest size that has one (and, within that
size, the kit's worst case: the largest total variation in exact mode, the smallest p-value in statistical
mode).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from spec_ref.testing import VerifierReport, check_chain_verifier, check_token_verifier, check_tree_verifier

from conformance.rules import Check, Rule

__all__ = ["BUDGETS", "Budget", "RuleResult", "check_once", "run_rule", "size_names"]

BudgetName = Literal["small", "full"]


@dataclass(frozen=True)
class Budget:
    """How hard each rule is checked: the size ladders, the kit's random cases, and the statistical settings."""

    name: BudgetName
    ladders: dict[Check, tuple[tuple[int, ...], ...]]
    random_cases: int
    statistical_random_cases: int
    tv: float
    alpha: float = 1e-6
    power: float = 0.99
    seed: int = 0


BUDGETS: dict[str, Budget] = {
    "small": Budget(
        "small",
        {"token": ((2, 1), (2, 2), (3, 2)), "chain": ((2, 1), (2, 2), (3, 2)), "tree": ((2, 1, 1), (2, 2, 1), (2, 2, 2))},
        random_cases=1, statistical_random_cases=1, tv=0.2,
    ),
    "full": Budget(
        "full",
        {
            "token": ((2, 1), (2, 2), (3, 2), (4, 2), (4, 3)),
            "chain": ((2, 1), (2, 2), (3, 2), (2, 3), (3, 3)),
            "tree": ((2, 1, 1), (2, 2, 1), (3, 2, 1), (2, 2, 2), (3, 2, 2), (2, 3, 2)),
        },
        random_cases=4, statistical_random_cases=2, tv=0.1,
    ),
}

_CHECKS: dict[Check, tuple[Callable[..., VerifierReport], tuple[str, ...]]] = {
    "token": (check_token_verifier, ("vocab_size", "num_drafts")),
    "chain": (check_chain_verifier, ("vocab_size", "draft_length")),
    "tree": (check_tree_verifier, ("vocab_size", "num_paths", "depth")),
}


def size_names(check: Check, size: tuple[int, ...]) -> dict[str, int]:
    """The kit's keyword arguments for a size tuple of ``check``."""
    return dict(zip(_CHECKS[check][1], size))


@dataclass(frozen=True)
class RuleResult:
    """The outcome for one rule: the deciding report (the first rejection, or the largest size checked)."""

    rule: Rule
    budget: Budget
    report: VerifierReport | None
    size: dict[str, int]
    sizes_checked: tuple[dict[str, int], ...]
    samples: int
    seconds: float
    skipped: str | None = None
    certificate_tv: float | None = None  # exact worst-case TV of a statistical lossy rule's transcription

    @property
    def lossless(self) -> bool | None:
        return None if self.report is None else self.report.lossless

    @property
    def as_expected(self) -> bool | None:
        return None if self.report is None else self.report.lossless == self.rule.lossless


def check_once(
    rule: Rule, verifier: Callable[..., Any], size: tuple[int, ...], budget: Budget, *, mode: str | None = None,
    arithmetic: str | None = None, random_cases: int | None = None,
) -> VerifierReport:
    """One kit check of ``verifier`` at ``size`` with the budget's settings (the rule's mode by default)."""
    check, _ = _CHECKS[rule.check]
    mode = mode or rule.mode
    options: dict[str, Any] = {"mode": mode, "seed": budget.seed}
    if mode == "statistical":
        options.update(alpha=budget.alpha, power=budget.power, tv=budget.tv,
                       random_cases=budget.statistical_random_cases)
        if rule.seed_external is not None:
            rule.seed_external(budget.seed)
    else:
        options.update(arithmetic=arithmetic or rule.arithmetic,
                       random_cases=budget.random_cases if random_cases is None else random_cases)
    return check(verifier, **size_names(rule.check, size), **options)


def run_rule(rule: Rule, budget: Budget) -> RuleResult:
    """Check ``rule`` up its size ladder; stop at the first rejection."""
    start = time.perf_counter()
    missing = rule.missing()
    if missing:
        return RuleResult(rule, budget, None, {}, (), 0, 0.0, skipped=f"needs {', '.join(missing)} (not installed)")
    verifier = rule.build()
    ladder = rule.sizes or budget.ladders[rule.check]
    checked: list[dict[str, int]] = []
    samples = 0
    report: VerifierReport | None = None
    size: tuple[int, ...] = ladder[-1]
    for size in ladder:
        report = check_once(rule, verifier, size, budget)
        checked.append(size_names(rule.check, size))
        samples += report.samples
        if not report.lossless:
            break
    assert report is not None
    certificate_tv = None
    if rule.certificate is not None:
        # the same cases as the statistical check (same seed and random cases), enumerated exactly
        exact = check_once(rule, rule.certificate(), size, budget, mode="exact", arithmetic="fraction",
                           random_cases=budget.statistical_random_cases)
        certificate_tv = exact.worst.total_variation
    return RuleResult(rule, budget, report, size_names(rule.check, size), tuple(checked), samples,
                      time.perf_counter() - start, certificate_tv=certificate_tv)
