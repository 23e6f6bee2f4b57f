"""A conformance kit: is *your* speculative-decoding verifier lossless? (docs/testing.md sections 1, 4, 6)

Three checks, one per verifier shape. Each builds a fixed set of adversarial (target, draft) cases (disjoint
supports, equal laws, one-hot target, one-hot draft, ties, tiny probabilities, nested supports; see
:mod:`spec_ref._cases`) plus ``random_cases`` seeded random ones, draws the drafts itself from the draft
law, runs ``fn`` and compares the law of what ``fn`` commits with the target law:

* :func:`check_token_verifier` for multi-draft token-level verifiers (OTLP solvers):
  ``fn(target_probs [V], draft_probs [V], drafts, rng) -> token``, drafts = ``num_drafts`` i.i.d. draws
  from ``draft_probs`` (draw order). Lossless means ``P(token = y) = target_probs[y]``.
* :func:`check_chain_verifier` for single-path verifiers:
  ``fn(target_probs [L+1, V], draft_probs [L, V], draft_tokens, rng) -> committed tokens``, with
  ``draft_tokens[i] ~ draft_probs[i]`` and ``target_probs[i]`` the target law after the first ``i`` drafted
  tokens (the rows differ, so a verifier reading the wrong row is caught; they do not depend on the token
  values). The committed tokens must be a prefix of the drafts followed by one token; the check extends
  them with target samples to length L + 1 and compares with ``prod_i target_probs[i][y_i]``.
* :func:`check_tree_verifier` for tree verifiers over :class:`spec_ref.DraftTree`:
  ``fn(tree, target_model, rng) -> committed tokens`` (or anything with a ``.tokens`` attribute, such as a
  :class:`spec_ref.VerifyResult`). The tree merges ``num_paths`` i.i.d. paths of length ``depth`` drawn from
  context-dependent draft tables; ``target_model(prefix)`` is the target law after ``prefix``, a different
  table per prefix. The committed tokens minus the last must be a root path of the tree.

Two modes:

* ``mode="exact"`` (default): ``fn`` must draw all its randomness from ``rng``, a
  :class:`spec_ref.rng.RandomSource` (``uniform()``, ``bernoulli(a)``, ``categorical(w)``,
  ``integers(n)``, ``substream(i)``), and only *compare* uniforms (``u < t``, ``u * c < t``). The check
  enumerates every random branch with :func:`spec_ref.exact_law` and compares the exact output law with the
  target law: with ``arithmetic="fraction"`` (default) ``fn`` receives ``object`` arrays of
  :class:`fractions.Fraction` and the laws must be equal (``==``); with ``arithmetic="float"`` it receives
  ``float64`` arrays and the total variation must be at most ``tolerance``. On the cases checked there are
  no false alarms and no misses.
* ``mode="statistical"``: ``fn`` receives a ``numpy.random.Generator`` (seeded from ``seed``) and ``float64``
  arrays. Each case is a Pearson chi-square test (cells pooled to expected count >= 20, plus the exact
  support check) at level ``alpha / number of cases``, so a lossless verifier fails the whole check with
  probability at most ``alpha`` (default 1e-6). The number of samples per case comes from a power analysis:
  the test has power at least ``power`` (default 0.99) against every output law at total variation >= ``tv``
  (default 0.05) from the target on the pooled cells (:func:`spec_ref.goodness_of_fit.samples_for_power`).

The arrays handed to ``fn`` are read-only (a verifier that writes into its inputs fails loudly), and an
exception escaping from ``fn`` carries a note naming the case and its inputs.

Each check returns a frozen :class:`VerifierReport` (``lossless``, the ``worst`` case with its p, q, drafts,
total variation, p-value and samples, and ``alpha``, ``power``, ``tv``); each has an ``assert_*`` twin that
raises ``AssertionError`` with the report's text when the verifier is not lossless. Bad arguments raise
``ValueError`` naming the argument and its value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, TypeVar, cast

import numpy as np
import numpy.typing as npt

from spec_ref import _cases
from spec_ref.goodness_of_fit import chi2_gof, power_at, samples_for_power
from spec_ref.rng import RandomSource, exact_law
from spec_ref.tree import DraftTree

__all__ = [
    "CaseReport",
    "VerifierReport",
    "check_token_verifier",
    "check_chain_verifier",
    "check_tree_verifier",
    "assert_token_verifier",
    "assert_chain_verifier",
    "assert_tree_verifier",
]

Mode = Literal["exact", "statistical"]
Arithmetic = Literal["fraction", "float"]
Outcome = Hashable
Array = npt.NDArray[Any]

#: ``rng.integers(n)`` is refused above this ``n`` in exact mode (each value is a branch).
MAX_INTEGERS_BRANCHES = 10_000


# ========================================================================================================
# Reports
# ========================================================================================================
@dataclass(frozen=True)
class CaseReport:
    """The result on one case.

    ``target_probs``/``draft_probs``: the case's inputs (``[V]``, ``[L+1, V]``/``[L, V]``, or for trees a
    dict prefix -> ``[V]``); ``drafts``: how the drafts were drawn; ``total_variation``: exact TV of the output
    law from the target law (exact mode) or of the empirical law (statistical mode, includes sampling noise);
    ``p_value`` and ``samples``: the chi-square p-value and the sample size (statistical mode; None in exact
    mode); ``worst_outcome``: the outcome with the largest |output - target| probability, with both
    probabilities; ``violation``: a contract violation (token out of range, committed tokens not a draft
    prefix...) or, in statistical mode, an outcome of target probability 0 that was committed; either fails
    the case on its own.
    """

    name: str
    target_probs: Any
    draft_probs: Any
    drafts: str
    lossless: bool
    total_variation: float
    p_value: float | None
    samples: int | None
    worst_outcome: Outcome | None
    output_probability: float
    target_probability: float
    violation: str | None = None

    def describe(self) -> str:
        lines = [
            f"case {self.name!r}: {'lossless' if self.lossless else 'NOT lossless'}, total variation "
            f"{self.total_variation:.6g}"
            + (f", p-value {self.p_value:.3g} over {self.samples} samples" if self.samples is not None else ""),
            f"  target_probs = {_show(self.target_probs)}",
            f"  draft_probs  = {_show(self.draft_probs)}",
            f"  drafts: {self.drafts}",
        ]
        if self.violation is not None:
            lines.append(f"  violation: {self.violation}")
        elif self.worst_outcome is not None:
            lines.append(
                f"  largest gap at outcome {self.worst_outcome}: verifier {self.output_probability:.6g}, "
                f"target {self.target_probability:.6g}"
            )
        return "\n".join(lines)


@dataclass(frozen=True)
class VerifierReport:
    """The result of one check: ``lossless`` and the ``worst`` case (largest TV in exact mode, smallest
    p-value in statistical mode; a contract violation first), all ``cases``, and the error rates.

    ``alpha``: probability that a lossless verifier fails the check (0 in exact mode); ``power``: the smallest
    per-case power against an output law at total variation ``tv`` from the target (1 in exact mode);
    ``tv``: the total variation the power is stated at (exact mode: 0 with Fractions, ``tolerance`` with
    floats); ``samples``: total calls of ``fn`` in statistical mode (0 in exact mode).
    """

    check: str
    verifier: str
    mode: Mode
    arithmetic: Arithmetic
    lossless: bool
    worst: CaseReport
    cases: tuple[CaseReport, ...]
    alpha: float
    power: float
    tv: float
    samples: int

    def __str__(self) -> str:
        failed = [c.name for c in self.cases if not c.lossless]
        head = (
            f"{self.check}({self.verifier}): {'lossless' if self.lossless else 'NOT lossless'} "
            f"({self.mode} mode, {self.arithmetic} arithmetic, {len(self.cases)} cases"
            + (f", failed: {', '.join(failed)}" if failed else "")
            + ")"
        )
        if self.mode == "exact":
            rates = "exact enumeration: alpha 0, power 1" + (
                f" (total variation tolerance {self.tv:g})"
                if self.arithmetic == "float"
                else " (laws compared with ==)"
            )
        else:
            rates = (
                f"alpha {self.alpha:g} for the whole check ({self.alpha / len(self.cases):.3g} per case), power >= "
                f"{self.power:.4f} per case against total variation >= {self.tv:g}, {self.samples} samples"
            )
        return f"{head}\n{rates}\nworst {self.worst.describe()}"


def _show(value: Any) -> str:
    if isinstance(value, Mapping):
        items = list(value.items())
        shown = ", ".join(f"{k}: {_show(v)}" for k, v in items[:4])
        return "{" + shown + (f", ... ({len(items)} prefixes)" if len(items) > 4 else "") + "}"
    array = np.asarray(value)
    if array.dtype == object:
        if array.size <= 32:
            return str(np.vectorize(str, otypes=[object])(array).tolist()).replace("'", "")
        flat = [str(x) for x in array.reshape(-1)[:16]]
        shown = ", ".join(flat) + (f", ... ({array.size} entries)" if array.size > 16 else "")
        return f"[{shown}]" if array.ndim == 1 else f"{array.shape} array [{shown}]"
    return np.array2string(array, precision=6, separator=", ", threshold=32, edgeitems=8)


# ========================================================================================================
# Argument checks
# ========================================================================================================
def _int_argument(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {name}={value!r}")
    return int(value)


def _probability_argument(name: str, value: Any, *, closed_right: bool = False) -> float:
    ok = isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool)
    number = float(value) if ok else math.nan
    if not (0.0 < number < 1.0 or (closed_right and number == 1.0)):
        interval = "(0, 1]" if closed_right else "(0, 1)"
        raise ValueError(f"{name} must be a number in {interval}, got {name}={value!r}")
    return number


@dataclass(frozen=True)
class _Settings:
    mode: Mode
    arithmetic: Arithmetic
    alpha: float
    power: float
    tv: float
    samples: int | None
    random_cases: int
    seed: int
    tolerance: float
    max_paths: int

    @property
    def cases(self) -> _cases.CaseSettings:
        return _cases.CaseSettings(self.seed, self.arithmetic == "fraction", self.random_cases)


def _settings(
    fn: Any, mode: Any, arithmetic: Any, alpha: Any, power: Any, tv: Any, samples: Any, random_cases: Any,
    seed: Any, tolerance: Any, max_paths: Any,
) -> _Settings:
    if not callable(fn):
        raise ValueError(f"fn must be callable, got fn={fn!r}")
    if mode not in ("exact", "statistical"):
        raise ValueError(f"mode must be 'exact' or 'statistical', got mode={mode!r}")
    if arithmetic not in ("fraction", "float"):
        raise ValueError(f"arithmetic must be 'fraction' or 'float', got arithmetic={arithmetic!r}")
    if samples is not None:
        samples = _int_argument("samples", samples, 1)
    tol_ok = isinstance(tolerance, (int, float)) and not isinstance(tolerance, bool) and 0 <= tolerance < 1
    if not tol_ok:
        raise ValueError(f"tolerance must be a number in [0, 1), got tolerance={tolerance!r}")
    return _Settings(
        mode=mode,
        arithmetic="float" if mode == "statistical" else arithmetic,
        alpha=_probability_argument("alpha", alpha),
        power=_probability_argument("power", power),
        tv=_probability_argument("tv", tv, closed_right=True),
        samples=samples,
        random_cases=_int_argument("random_cases", random_cases, 0),
        seed=_int_argument("seed", seed, 0),
        tolerance=float(tolerance),
        max_paths=_int_argument("max_paths", max_paths, 1),
    )


# ========================================================================================================
# The enumerating source handed to fn in exact mode
# ========================================================================================================
class _NotInProtocol(AttributeError):
    pass


class _ProtocolOnlySource:
    """Forwards the RNG protocol to the enumerator and refuses anything else with a helpful message."""

    def __init__(self, source: RandomSource) -> None:
        self._source = source

    def uniform(self) -> Any:
        return self._source.uniform()

    def bernoulli(self, probability: Any) -> bool:
        return self._source.bernoulli(probability)

    def categorical(self, weights: Any) -> int:
        return self._source.categorical(weights)

    def integers(self, n: int) -> int:
        if n > MAX_INTEGERS_BRANCHES:
            raise _NotInProtocol(
                f"rng.integers({n}) would enumerate {n} branches (more than {MAX_INTEGERS_BRANCHES})"
            )
        return self._source.integers(n)

    def substream(self, index: int) -> _ProtocolOnlySource:
        return _ProtocolOnlySource(self._source.substream(index))

    def __getattr__(self, name: str) -> Any:
        raise _NotInProtocol(f"rng.{name} is not part of the spec_ref RNG protocol")


# ========================================================================================================
# The two modes
# ========================================================================================================
def _gap(law: Mapping[Outcome, Any], target: Mapping[Outcome, Any]) -> tuple[Any, Outcome | None]:
    """(TV, the outcome with the largest gap) between two laws given as outcome -> probability."""
    total: Any = 0
    worst, worst_gap = None, -1.0
    for outcome in set(law) | set(target):
        gap = abs(law.get(outcome, 0) - target.get(outcome, 0))
        total += gap
        if gap > worst_gap:
            worst, worst_gap = outcome, gap
    return total / 2, worst


def _decode(outcome: Outcome | None, case: _cases.Case, vocab_size: int) -> Outcome | None:
    """A cell index back to its outcome: the token, or the extended block as a tuple."""
    if outcome is None or case.length is None:
        return outcome
    index, tokens = cast(int, outcome), []
    for _ in range(case.length):
        index, t = divmod(index, vocab_size)
        tokens.append(t)
    return tuple(reversed(tokens))


#: how many times exact mode recomputes the first case's law to catch randomness drawn outside ``rng``
_RECOMPUTATIONS = 4


def _exact_case(case: _cases.Case, fn: Any, settings: _Settings, vocab_size: int, first: bool) -> CaseReport:
    def outcome(source: RandomSource) -> Outcome:
        return case.run(fn, _ProtocolOnlySource(source))

    try:
        law = exact_law(outcome, max_paths=settings.max_paths)
        # hidden randomness shows as a different law on a recomputation, but any one recomputation can
        # repeat the first by chance (4.5% of the time for a uniform draw over 3 tokens): recompute a few times
        if first and any(exact_law(outcome, max_paths=settings.max_paths) != law
                         for _ in range(_RECOMPUTATIONS)):
            raise ValueError(
                f"fn={_name(fn)} gave two different output laws for the same case {case.name!r}: it draws "
                "randomness outside rng; exact mode needs all of it from rng (else use mode='statistical')"
            )
    except _cases.ContractViolation as error:
        return CaseReport(case.name, case.target_probs, case.draft_probs, case.drafts, False, math.nan, None, None,
                          None, math.nan, math.nan, str(error))
    except _NotInProtocol as error:
        raise ValueError(
            f"fn={_name(fn)} is not enumerable in exact mode: {error}. Exact mode hands fn a spec_ref RNG source "
            "(uniform, bernoulli, categorical, integers, substream); for a numpy.random.Generator pass "
            "mode='statistical'"
        ) from error
    except TypeError as error:
        hint = " or arithmetic='float'" if settings.arithmetic == "fraction" else ""
        raise ValueError(
            f"fn={_name(fn)} raised TypeError under exact enumeration ({error}) on case {case.name!r}: exact mode "
            "needs fn to only compare uniforms (u < t)"
            + (", and with arithmetic='fraction' fn receives object arrays of Fractions" if hint else "")
            + f"; try mode='statistical'{hint}"
        ) from error
    except RuntimeError as error:
        if "max_paths" not in str(error):
            raise
        raise ValueError(
            f"max_paths={settings.max_paths} is too small to enumerate case {case.name!r}: use a smaller "
            "vocabulary or fewer drafts, a larger max_paths, or mode='statistical'"
        ) from error
    tv, worst = _gap(law, case.target_law)
    lossless = law == case.target_law if settings.arithmetic == "fraction" else float(tv) <= settings.tolerance
    return CaseReport(
        case.name, case.target_probs, case.draft_probs, case.drafts, bool(lossless), float(tv), None, None,
        _decode(worst, case, vocab_size), float(law.get(worst, 0)), float(case.target_law.get(worst, 0)),
    )


def _statistical_case(
    case: _cases.Case, fn: Any, settings: _Settings, vocab_size: int, alpha_case: float, index: int
) -> tuple[CaseReport, float]:
    expected = np.zeros(case.cells)
    for cell, mass in case.target_law.items():
        # An outcome of positive but float-underflowing probability (products of 2^-1000) is not a support
        # violation: keep it positive, the pooling merges it with other small cells.
        expected[cast(int, cell)] = max(float(mass), float(np.finfo(np.float64).smallest_subnormal))
    df_bound = max(int(np.count_nonzero(expected)) - 1, 1)
    samples = settings.samples or samples_for_power(df_bound, settings.tv, alpha_case, settings.power)
    kit = _cases.GeneratorDraws(np.random.default_rng([settings.seed, index, 0]))
    generator = np.random.default_rng([settings.seed, index, 1])
    counts = np.zeros(case.cells)

    def fn_with_generator(*args: Any) -> Any:
        try:
            return fn(*args[:-1], generator)
        except AttributeError as error:
            if getattr(error, "obj", None) is generator and hasattr(error, "add_note"):
                error.add_note(
                    f"statistical mode hands fn a numpy.random.Generator; fn={_name(fn)} uses the spec_ref RNG "
                    "protocol: use mode='exact', or wrap the generator in spec_ref.GeneratorSource inside fn"
                )
            raise

    try:
        for _ in range(samples):
            counts[cast(int, case.run(fn_with_generator, kit))] += 1
    except _cases.ContractViolation as error:
        report = CaseReport(case.name, case.target_probs, case.draft_probs, case.drafts, False, math.nan, 0.0,
                            samples, None, math.nan, math.nan, str(error))
        return report, 0.0
    result = chi2_gof(counts, expected, alpha_case)
    empirical = counts / samples
    law: dict[Outcome, float] = {int(i): float(empirical[i]) for i in np.flatnonzero(empirical)}
    target: dict[Outcome, float] = {int(i): float(expected[i]) for i in np.flatnonzero(expected)}
    tv, worst = _gap(law, target)
    violation = None
    if result.support_violations:
        cells = [_decode(c, case, vocab_size) for c in result.support_violations[:3]]
        violation = f"outcomes of target probability 0 were committed: {cells}"
    report = CaseReport(
        case.name, case.target_probs, case.draft_probs, case.drafts, not result.rejected, float(tv),
        result.p_value, samples, _decode(worst, case, vocab_size), law.get(worst, 0.0), target.get(worst, 0.0),
        violation,
    )
    return report, power_at(samples, result.df, settings.tv, alpha_case)


def _name(fn: Any) -> str:
    owner = getattr(fn, "__self__", None)
    if owner is not None and not isinstance(owner, type(np)):
        return f"{type(owner).__name__}.{getattr(fn, '__name__', '?')}"
    return str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn))


_Result = TypeVar("_Result")


def _noting_case(case: _cases.Case, run: Callable[[], _Result]) -> _Result:
    """Run one case; an exception escaping from fn gets a note naming the case and its inputs."""
    try:
        return run()
    except Exception as error:
        if hasattr(error, "add_note"):  # Python >= 3.11
            error.add_note(
                f"while checking case {case.name!r}: target_probs = {_show(case.target_probs)}, "
                f"draft_probs = {_show(case.draft_probs)}"
            )
        raise


def _check(check: str, fn: Any, cases: list[_cases.Case], settings: _Settings, vocab_size: int) -> VerifierReport:
    if settings.mode == "exact":
        reports = [
            _noting_case(case, partial(_exact_case, case, fn, settings, vocab_size, i == 0))
            for i, case in enumerate(cases)
        ]
        worst = max(reports, key=lambda r: (r.violation is not None, r.total_variation))
        tv = 0.0 if settings.arithmetic == "fraction" else settings.tolerance
        return VerifierReport(check, _name(fn), "exact", settings.arithmetic, all(r.lossless for r in reports),
                              worst, tuple(reports), 0.0, 1.0, tv, 0)
    alpha_case = settings.alpha / len(cases)
    results = [
        _noting_case(c, partial(_statistical_case, c, fn, settings, vocab_size, alpha_case, i))
        for i, c in enumerate(cases)
    ]
    reports = [r for r, _ in results]
    worst = min(reports, key=lambda r: (r.violation is None, r.p_value if r.p_value is not None else 1.0))
    return VerifierReport(
        check, _name(fn), "statistical", "float", all(r.lossless for r in reports), worst, tuple(reports),
        settings.alpha, min(p for _, p in results), settings.tv, sum(r.samples or 0 for r in reports),
    )


# ========================================================================================================
# Public checks
# ========================================================================================================
def check_token_verifier(
    fn: Callable[[Array, Array, tuple[int, ...], Any], Any],
    *,
    vocab_size: int,
    num_drafts: int,
    mode: Mode = "exact",
    arithmetic: Arithmetic = "fraction",
    alpha: float = 1e-6,
    power: float = 0.99,
    tv: float = 0.05,
    samples: int | None = None,
    random_cases: int = 4,
    seed: int = 0,
    tolerance: float = 1e-12,
    max_paths: int = 200_000,
) -> VerifierReport:
    """Check a multi-draft token-level verifier ``fn(target_probs [V], draft_probs [V], drafts, rng) -> token``.

    ``drafts`` is a tuple of ``num_drafts`` i.i.d. draws from ``draft_probs``; ``rng`` is a spec_ref RNG
    source (``mode="exact"``) or a ``numpy.random.Generator`` (``mode="statistical"``). Lossless means the
    returned token has law ``target_probs``. Options: see the module docstring (``samples`` overrides the
    power analysis; ``max_paths`` bounds the exact enumeration of one case).
    """
    settings = _settings(fn, mode, arithmetic, alpha, power, tv, samples, random_cases, seed, tolerance, max_paths)
    vocab = _int_argument("vocab_size", vocab_size, 1)
    k = _int_argument("num_drafts", num_drafts, 1)
    return _check("check_token_verifier", fn, _cases.token_cases(vocab, k, settings.cases), settings, vocab)


def check_chain_verifier(
    fn: Callable[[Array, Array, tuple[int, ...], Any], Any],
    *,
    vocab_size: int,
    draft_length: int,
    mode: Mode = "exact",
    arithmetic: Arithmetic = "fraction",
    alpha: float = 1e-6,
    power: float = 0.99,
    tv: float = 0.05,
    samples: int | None = None,
    random_cases: int = 4,
    seed: int = 0,
    tolerance: float = 1e-12,
    max_paths: int = 200_000,
) -> VerifierReport:
    """Check a single-path verifier ``fn(target_probs [L+1, V], draft_probs [L, V], draft_tokens, rng)``.

    ``fn`` returns the committed tokens: the accepted prefix of ``draft_tokens`` followed by one correction or
    bonus token (a sequence, array or tensor of ints; or an object with ``.tokens``). ``L = draft_length``.
    """
    settings = _settings(fn, mode, arithmetic, alpha, power, tv, samples, random_cases, seed, tolerance, max_paths)
    vocab = _int_argument("vocab_size", vocab_size, 1)
    length = _int_argument("draft_length", draft_length, 1)
    _cases.block_cells(vocab, length, "draft_length")
    return _check("check_chain_verifier", fn, _cases.chain_cases(vocab, length, settings.cases), settings, vocab)


def check_tree_verifier(
    fn: Callable[[DraftTree, Callable[[tuple[int, ...]], Array], Any], Any],
    *,
    vocab_size: int,
    num_paths: int,
    depth: int,
    mode: Mode = "exact",
    arithmetic: Arithmetic = "fraction",
    alpha: float = 1e-6,
    power: float = 0.99,
    tv: float = 0.05,
    samples: int | None = None,
    random_cases: int = 4,
    seed: int = 0,
    tolerance: float = 1e-12,
    max_paths: int = 200_000,
) -> VerifierReport:
    """Check a tree verifier ``fn(tree: DraftTree, target_model, rng) -> committed tokens``.

    The tree merges ``num_paths`` i.i.d. paths of ``depth`` tokens drawn from context-dependent draft tables
    (``tree.draft_probs[u]`` is the law node u's draws came from); ``target_model(prefix) -> [V]`` is the
    target law after ``prefix``. For a spec_ref verifier: ``lambda tree, target, rng: verify(tree, target,
    "specinfer", rng)``.
    """
    settings = _settings(fn, mode, arithmetic, alpha, power, tv, samples, random_cases, seed, tolerance, max_paths)
    vocab = _int_argument("vocab_size", vocab_size, 1)
    paths = _int_argument("num_paths", num_paths, 1)
    length = _int_argument("depth", depth, 1)
    _cases.block_cells(vocab, length, "depth")
    return _check("check_tree_verifier", fn, _cases.tree_cases(vocab, paths, length, settings.cases), settings, vocab)


def _raise_unless_lossless(report: VerifierReport) -> VerifierReport:
    if not report.lossless:
        raise AssertionError(str(report))
    return report


def assert_token_verifier(fn: Callable[[Array, Array, tuple[int, ...], Any], Any], **options: Any) -> VerifierReport:
    """:func:`check_token_verifier`, raising ``AssertionError`` with the report unless lossless."""
    return _raise_unless_lossless(check_token_verifier(fn, **options))


def assert_chain_verifier(fn: Callable[[Array, Array, tuple[int, ...], Any], Any], **options: Any) -> VerifierReport:
    """:func:`check_chain_verifier`, raising ``AssertionError`` with the report unless lossless."""
    return _raise_unless_lossless(check_chain_verifier(fn, **options))


def assert_tree_verifier(
    fn: Callable[[DraftTree, Callable[[tuple[int, ...]], Array], Any], Any], **options: Any
) -> VerifierReport:
    """:func:`check_tree_verifier`, raising ``AssertionError`` with the report unless lossless."""
    return _raise_unless_lossless(check_tree_verifier(fn, **options))
