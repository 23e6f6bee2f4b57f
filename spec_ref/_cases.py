"""The cases of :mod:`spec_ref.testing`: adversarial and seeded random (target, draft) pairs, and one run.

Every pair is built in exact rational arithmetic (lists of :class:`fractions.Fraction` summing to exactly
1) from one of the *pair families* below, then handed out either as ``object`` arrays of Fractions or as
``float64`` arrays. The families are the adversarial shapes of docs/testing.md section 6:

=====================  ==================================================================================
family                 (p, q)
=====================  ==================================================================================
``random``             independent random weights with zeros
``equal``              p = q
``disjoint``           supports split in two halves: nothing can be accepted (SpecTr's 0/0)
``target_one_hot``     p a point mass
``draft_one_hot``      q a point mass (a deterministic draft)
``ties``               p uniform, q uniform on the first half: equal values and exact ratio 1/2
``tiny``               p(0) and q(V-1) equal to 2^-1000 (float64 can hold it, float32 cannot)
``draft_inside_target``   supp q a strict subset of supp p where possible
``target_inside_draft``   supp p a strict subset of supp q where possible
=====================  ==================================================================================

A :class:`Case` holds the arrays handed to the verifier, the exact target law of the outcome (a token, or the
committed block extended with target samples to L + 1 tokens, encoded in base V) and ``run(fn, source)``,
which draws the drafts from ``source``, calls fn, checks the contract and returns the outcome; the same run
serves the exact mode (an enumerating source) and the statistical mode (:class:`GeneratorDraws`).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from spec_ref._sampling import inverse_cdf
from spec_ref.rng import RandomSource
from spec_ref.tree import DraftTree

__all__ = [
    "ADVERSARIAL_FAMILIES",
    "FAMILIES",
    "Pmf",
    "TINY",
    "WEIGHTS",
    "family_pair",
    "normalised",
    "one_hot",
    "random_weights",
]

#: A probability vector as exact Fractions summing to 1.
Pmf = list[Fraction]

#: Integer weights of random pmfs: zeros, small values and one large value.
WEIGHTS = (0, 0, 1, 1, 2, 3, 7, 1000)
#: The tiny probability of the ``tiny`` family: exactly representable in float64, zero in float32.
TINY = Fraction(1, 2**1000)
#: Every family, adversarial ones first.
ADVERSARIAL_FAMILIES = (
    "equal",
    "disjoint",
    "target_one_hot",
    "draft_one_hot",
    "ties",
    "tiny",
    "draft_inside_target",
    "target_inside_draft",
)
FAMILIES = ADVERSARIAL_FAMILIES + ("random",)


def one_hot(size: int, index: int) -> Pmf:
    return [Fraction(int(i == index)) for i in range(size)]


def normalised(weights: Sequence[Fraction | int], fallback: int) -> Pmf:
    """``weights / sum(weights)``, or a point mass at ``fallback`` if every weight is 0."""
    total = sum((Fraction(w) for w in weights), Fraction(0))
    if total == 0:
        return one_hot(len(weights), fallback)
    return [Fraction(w) / total for w in weights]


def random_weights(generator: np.random.Generator, size: int) -> list[int]:
    """``size`` weights drawn from :data:`WEIGHTS`, at least one positive."""
    weights = [int(WEIGHTS[i]) for i in generator.integers(0, len(WEIGHTS), size=size)]
    if not any(weights):
        weights[int(generator.integers(0, size))] = 1
    return weights


def family_pair(family: str, target_weights: Sequence[int], draft_weights: Sequence[int], pick: int) -> tuple[Pmf, Pmf]:
    """The (p, q) pair of ``family`` built from two weight vectors of equal size (both with a positive entry).

    ``pick`` (any int) chooses the point of the one-hot families and the cut of ``disjoint``.
    """
    size = len(target_weights)
    if family not in FAMILIES:
        raise ValueError(f"family={family!r} must be one of {FAMILIES}")
    p = normalised(target_weights, 0)
    q = normalised(draft_weights, size - 1)
    if size == 1:
        return p, q
    if family == "equal":
        return p, list(p)
    if family == "disjoint":
        cut = 1 + pick % (size - 1)
        p = normalised([w if i < cut else 0 for i, w in enumerate(target_weights)], 0)
        q = normalised([w if i >= cut else 0 for i, w in enumerate(draft_weights)], size - 1)
        return p, q
    if family == "target_one_hot":
        return one_hot(size, pick % size), q
    if family == "draft_one_hot":
        return p, one_hot(size, pick % size)
    if family == "ties":
        half = max(1, size // 2)
        return normalised([1] * size, 0), normalised([1] * half + [0] * (size - half), 0)
    if family == "tiny":
        rest_p = normalised([w for w in target_weights[1:]], 0)
        rest_q = normalised([w for w in draft_weights[:-1]], 0)
        return [TINY] + [(1 - TINY) * w for w in rest_p], [(1 - TINY) * w for w in rest_q] + [TINY]
    if family == "draft_inside_target":
        support = [i for i in range(size) if p[i] > 0]
        keep = support[: max(1, len(support) - 1)]
        return p, normalised([draft_weights[i] + 1 if i in keep else 0 for i in range(size)], keep[0])
    if family == "target_inside_draft":
        support = [i for i in range(size) if q[i] > 0]
        keep = support[: max(1, len(support) - 1)]
        return normalised([target_weights[i] + 1 if i in keep else 0 for i in range(size)], keep[0]), q
    return p, q


def prefixes(vocab_size: int, max_length: int) -> list[tuple[int, ...]]:
    """Every token prefix of length 0..``max_length`` over ``vocab_size`` tokens, shortest first."""
    out: list[tuple[int, ...]] = []
    for length in range(max_length + 1):
        out.extend(itertools.product(range(vocab_size), repeat=length))
    return out


def as_array(pmf: Sequence[Fraction], fraction: bool) -> npt.NDArray[np.generic]:
    """A read-only array: ``object`` holding Fractions, or ``float64``."""
    if fraction:
        array = np.empty(len(pmf), dtype=object)
        array[:] = list(pmf)
    else:
        array = np.array([float(x) for x in pmf], dtype=np.float64)
    array.setflags(write=False)
    return array

# ========================================================================================================
# The cases of spec_ref.testing: inputs handed to fn, target laws, and one run of a case
# ========================================================================================================
#: Chain and tree checks refuse vocabularies and lengths with more blocks of L + 1 tokens than this.
MAX_CELLS = 1_000_000
Outcome = Hashable
Array = npt.NDArray[Any]
Table = dict[tuple[int, ...], Array]


@dataclass(frozen=True)
class CaseSettings:
    """What case generation depends on: the seed, Fraction or float64 arrays, and the number of random cases."""

    seed: int
    fraction: bool
    random_cases: int


class ContractViolation(Exception):
    """fn broke the verifier contract (a token out of range, committed tokens that are not a draft prefix...)."""


@dataclass(frozen=True)
class Case:
    """One case: the inputs handed to fn, the target law over outcomes (exact Fractions), and how to run it."""

    name: str
    target_probs: Any
    draft_probs: Any
    drafts: str
    target_law: dict[Outcome, Fraction]
    run: Callable[[Any, RandomSource], Outcome]  # (fn, source) -> outcome, drafts drawn from source
    cells: int  # outcomes are ints in [0, cells): a token, or an extended block in base V
    length: int | None  # None: the outcome is a token; else the extended block's length


def exact_pmf(row: Array) -> list[Fraction]:
    """The exact rational law of a probability row as handed to fn (normalised: float rows may not sum to 1)."""
    values = [Fraction(x) for x in np.asarray(row).reshape(-1).tolist()]
    total = sum(values, Fraction(0))
    return [v / total for v in values]


def make_pairs(
    vocab_size: int, count: int, settings: CaseSettings, family: str, salt: int
) -> list[tuple[Array, Array]]:
    """``count`` (p, q) pairs of ``family`` (``"mixed"``: a different adversarial family per pair)."""
    generator = np.random.default_rng([settings.seed, salt])
    out = []
    for i in range(count):
        fam = ADVERSARIAL_FAMILIES[i % len(ADVERSARIAL_FAMILIES)] if family == "mixed" else family
        p_weights = random_weights(generator, vocab_size)
        q_weights = random_weights(generator, vocab_size)
        p, q = family_pair(fam, p_weights, q_weights, int(generator.integers(0, 1 << 30)))
        fraction = settings.fraction
        out.append((as_array(p, fraction), as_array(q, fraction)))
    return out


def case_families(settings: CaseSettings, rows: int) -> list[tuple[str, str, int]]:
    """(case name, family, salt): every adversarial family, a mixed one when a case has several rows, and the
    seeded random cases."""
    names = [(f, f, i) for i, f in enumerate(ADVERSARIAL_FAMILIES)]
    if rows > 1:
        names.append(("mixed", "mixed", len(names)))
    base = len(names)
    names += [(f"random_{i}", "random", base + i) for i in range(settings.random_cases)]
    return names


def stack(rows: Sequence[Array]) -> Array:
    array = np.stack(list(rows))
    array.setflags(write=False)
    return array


def token_of(value: Any, vocab_size: int, what: str) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise ContractViolation(f"{what} is a bool ({value!r}), not a token id")
    try:
        token = operator.index(value)
    except TypeError:
        item = getattr(value, "item", None)
        token = item() if callable(item) and getattr(value, "size", 1) in (1, None) else value
        if not isinstance(token, (int, np.integer)) or isinstance(token, bool):
            raise ContractViolation(f"{what} must be an int token id, got {value!r}") from None
    if not 0 <= token < vocab_size:
        raise ContractViolation(f"{what}={token} is outside [0, {vocab_size})")
    return int(token)


def tokens_of(value: Any, vocab_size: int, max_length: int) -> tuple[int, ...]:
    value = getattr(value, "tokens", value)
    try:
        flat = np.asarray(value).reshape(-1).tolist()
    except (TypeError, ValueError) as error:
        raise ContractViolation(f"fn must return a sequence of token ids, got {value!r}") from error
    if not 1 <= len(flat) <= max_length:
        raise ContractViolation(f"fn committed {len(flat)} tokens {flat}; it must commit 1..{max_length}")
    return tuple(token_of(t, vocab_size, f"committed token {i}") for i, t in enumerate(flat))


def encode(tokens: Sequence[int], vocab_size: int) -> int:
    index = 0
    for t in tokens:
        index = index * vocab_size + t
    return index


def block_law(
    row_of: Callable[[tuple[int, ...]], list[Fraction]], length: int, vocab_size: int
) -> dict[Outcome, Fraction]:
    """The autoregressive law prod_i row_of(y_<i)[y_i] of blocks of ``length`` tokens, over positive cells only."""
    law: dict[Outcome, Fraction] = {}
    stack: list[tuple[tuple[int, ...], Fraction]] = [((), Fraction(1))]
    while stack:
        prefix, mass = stack.pop()
        if len(prefix) == length:
            law[encode(prefix, vocab_size)] = mass
            continue
        for token, weight in enumerate(row_of(prefix)):
            if weight > 0:
                stack.append((prefix + (token,), mass * weight))
    return law


def block_cells(vocab_size: int, length: int, length_name: str) -> None:
    if vocab_size ** (length + 1) > MAX_CELLS:
        raise ValueError(
            f"vocab_size={vocab_size} and {length_name}={length} give vocab_size ** ({length_name} + 1) = "
            f"{vocab_size ** (length + 1)} blocks, more than the {MAX_CELLS} this check compares"
        )


def token_cases(vocab_size: int, num_drafts: int, settings: CaseSettings) -> list[Case]:
    drafts = f"{num_drafts} i.i.d. draws from draft_probs, in draw order"
    out = []
    for name, family, salt in case_families(settings, 1):
        ((p, q),) = make_pairs(vocab_size, 1, settings, family, salt)
        law: dict[Outcome, Fraction] = {y: w for y, w in enumerate(exact_pmf(p)) if w > 0}

        def run(fn: Any, source: RandomSource, p: Array = p, q: Array = q) -> Outcome:
            tokens = tuple(source.categorical(q) for _ in range(num_drafts))
            return token_of(fn(p, q, tokens, source), vocab_size, "the returned token")

        out.append(Case(name, p, q, drafts, law, run, vocab_size, None))
    return out


def chain_cases(vocab_size: int, draft_length: int, settings: CaseSettings) -> list[Case]:
    length = draft_length
    drafts = f"draft_tokens[i] ~ draft_probs[i] independently, i < {length}"
    out = []
    for name, family, salt in case_families(settings, length + 1):
        pairs = make_pairs(vocab_size, length + 1, settings, family, salt)
        p = stack([pq[0] for pq in pairs])
        q = stack([pq[1] for pq in pairs[:length]])
        rows = [exact_pmf(row) for row in p]
        law = block_law(lambda prefix: rows[len(prefix)], length + 1, vocab_size)

        def run(fn: Any, source: RandomSource, p: Array = p, q: Array = q) -> Outcome:
            draft_tokens = tuple(source.categorical(q[i]) for i in range(length))
            tokens = tokens_of(fn(p, q, draft_tokens, source), vocab_size, length + 1)
            if tokens[:-1] != draft_tokens[: len(tokens) - 1]:
                raise ContractViolation(
                    f"committed tokens {tokens} do not start with the accepted drafts of {draft_tokens}"
                )
            extended = list(tokens)
            while len(extended) < length + 1:
                extended.append(source.categorical(p[len(extended)]))
            return encode(extended, vocab_size)

        out.append(Case(name, p, q, drafts, law, run, vocab_size ** (length + 1), length + 1))
    return out


def tree_cases(vocab_size: int, num_paths: int, depth: int, settings: CaseSettings) -> list[Case]:
    drafts = (
        f"{num_paths} i.i.d. paths of {depth} tokens, each token ~ draft_probs[prefix], merged with "
        "DraftTree.from_paths"
    )
    all_prefixes = prefixes(vocab_size, depth)
    out = []
    for name, family, salt in case_families(settings, len(all_prefixes)):
        pairs = make_pairs(vocab_size, len(all_prefixes), settings, family, salt)
        target: Table = {prefix: pq[0] for prefix, pq in zip(all_prefixes, pairs)}
        draft: Table = {prefix: pq[1] for prefix, pq in zip(all_prefixes, pairs) if len(prefix) < depth}
        rows = {prefix: exact_pmf(row) for prefix, row in target.items()}
        law = block_law(lambda prefix: rows[prefix], depth + 1, vocab_size)
        target_model = table_model(target, "target_model")
        draft_model = table_model(draft, "draft_model")

        def run(
            fn: Any, source: RandomSource, target: Table = target, draft: Table = draft,
            target_model: Callable[[tuple[int, ...]], Array] = target_model,
            draft_model: Callable[[tuple[int, ...]], Array] = draft_model,
        ) -> Outcome:
            paths = []
            for _ in range(num_paths):
                prefix: tuple[int, ...] = ()
                for _ in range(depth):
                    prefix = prefix + (source.categorical(draft[prefix]),)
                paths.append(prefix)
            tree = DraftTree.from_paths(paths, draft_model)
            tokens = tokens_of(fn(tree, target_model, source), vocab_size, depth + 1)
            node = 0
            for t in tokens[:-1]:
                child = tree.child(node, t)
                if child is None:
                    raise ContractViolation(f"committed tokens {tokens} are not a root path of {tree} plus one token")
                node = child
            extended = tokens
            while len(extended) < depth + 1:
                extended = extended + (source.categorical(target[extended]),)
            return encode(extended, vocab_size)

        out.append(Case(name, target, draft, drafts, law, run, vocab_size ** (depth + 1), depth + 1))
    return out


def table_model(table: Table, name: str) -> Callable[[tuple[int, ...]], Array]:
    def model(prefix: tuple[int, ...]) -> Array:
        key = tuple(int(t) for t in prefix)
        if key not in table:
            raise ContractViolation(f"{name} was asked for prefix {key}, which is not a node of any drafted tree")
        return table[key]

    return model

class GeneratorDraws:
    """The check's own randomness in statistical mode (drafts, extensions), separate from fn's generator.

    It implements the RNG protocol on a block of pre-drawn uniforms, so the case's ``run`` is shared with
    exact mode; fn itself is called with a plain ``numpy.random.Generator``.
    """

    def __init__(self, generator: np.random.Generator, block: int = 1 << 16) -> None:
        self.generator = generator
        self.block = block
        self.buffer = generator.random(block)
        self.position = 0

    def uniform(self) -> float:
        if self.position == self.block:
            self.buffer = self.generator.random(self.block)
            self.position = 0
        value = float(self.buffer[self.position])
        self.position += 1
        return value

    def bernoulli(self, probability: Any) -> bool:
        return bool(self.uniform() < probability)

    def categorical(self, weights: Any) -> int:
        return inverse_cdf(weights, self.uniform())

    def integers(self, n: int) -> int:
        return min(int(self.uniform() * n), n - 1)

    def substream(self, index: int) -> GeneratorDraws:
        return self
