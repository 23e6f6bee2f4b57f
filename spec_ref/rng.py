"""The one RNG protocol every randomized ``spec_ref`` routine uses, its sources, and the exact enumerator.

Protocol (:class:`RandomSource`), one uniform per call on the sampling sources:

* ``uniform()``            -> U in [0, 1). Algorithms only *compare* it, always in the multiplicative form
  ``U * draft_mass < target_mass`` (docs/algorithms.md section 1 and 9), so it can be symbolic.
* ``bernoulli(a)``         -> ``uniform() < a``.
* ``categorical(weights)`` -> inverse CDF of ``weights / sum(weights)`` at one uniform
  (:func:`spec_ref._sampling.inverse_cdf`: never returns a zero-weight index).
* ``integers(n)``          -> ``min(floor(uniform() * n), n - 1)``.
* ``substream(index)``     -> the source to use for the node with flattened index ``index`` of a tree.
  Sequential sources return themselves; :class:`NodeReplaySource` returns row ``index`` of its table, so
  a tree verifier can be replayed with a fixed block of uniforms per node (the layout ``spec_fast`` uses).

Sources:

* :class:`GeneratorSource` wraps a ``numpy.random.Generator`` (the production path of ``spec_ref``);
* :class:`ReplaySource` replays an explicit array of uniforms, in order;
* :class:`NodeReplaySource` replays a ``[N, M]`` table, one row per tree node;
* :func:`exact_law` runs a routine under an *enumerating* source that follows every random branch and
  weighs it with :class:`fractions.Fraction` probabilities, returning the exact output law. Its
  ``uniform()`` returns a :class:`SymbolicUniform` that tracks the interval it is known to lie in and
  branches exactly on each comparison (docs/testing.md section 4.1 and appendix A).

Each routine documents its *randomness budget*: which calls it makes, in which order, and what each
means, so that the same uniforms can be handed to ``spec_fast``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from fractions import Fraction
from typing import Any, Protocol, Union, runtime_checkable

import numpy as np
import numpy.typing as npt

from spec_ref._sampling import inverse_cdf

__all__ = [
    "RandomSource",
    "GeneratorSource",
    "ReplaySource",
    "NodeReplaySource",
    "SymbolicUniform",
    "ScaledUniform",
    "as_source",
    "exact_law",
    "ExactLaw",
]


class SymbolicUniform:
    """A uniform on [0, 1) known to lie in ``[lo, hi)``; each comparison branches exactly.

    Only the operations the algorithms need exist: ``u < t`` and ``u * c`` (giving a
    :class:`ScaledUniform`). Any other arithmetic raises ``TypeError``, which keeps the exact
    enumeration honest: code that does arithmetic on uniforms cannot be enumerated this way.
    """

    __slots__ = ("_source", "lo", "hi")

    def __init__(self, source: _EnumeratingSource) -> None:
        self._source = source
        self.lo = Fraction(0)
        self.hi = Fraction(1)

    def less_than(self, threshold: Any) -> bool:
        t = Fraction(threshold)
        if t <= self.lo:
            return False
        if t >= self.hi:
            return True
        share = (t - self.lo) / (self.hi - self.lo)
        below = self._source.branch([1 - share, share]) == 1
        if below:
            self.hi = t
        else:
            self.lo = t
        return below

    def __lt__(self, other: Any) -> bool:
        return self.less_than(other)

    def __mul__(self, factor: Any) -> ScaledUniform:
        return ScaledUniform(self, Fraction(factor))

    __rmul__ = __mul__

    def __repr__(self) -> str:
        return f"SymbolicUniform([{self.lo}, {self.hi}))"


class ScaledUniform:
    """``c * U`` for a symbolic uniform U and a constant ``c >= 0``; supports ``<`` and further scaling."""

    __slots__ = ("base", "factor")

    def __init__(self, base: SymbolicUniform, factor: Fraction) -> None:
        if factor < 0:
            raise TypeError(f"a uniform may only be scaled by a non-negative factor, got {factor}")
        self.base = base
        self.factor = factor

    def __lt__(self, other: Any) -> bool:
        t = Fraction(other)
        if self.factor == 0:
            return 0 < t
        return self.base.less_than(t / self.factor)

    def __mul__(self, factor: Any) -> ScaledUniform:
        return ScaledUniform(self.base, self.factor * Fraction(factor))

    __rmul__ = __mul__


#: What ``uniform()`` returns: a float on the sampling sources, symbolic under the enumerator.
Uniform = Union[float, SymbolicUniform]


@runtime_checkable
class RandomSource(Protocol):
    """The RNG protocol (module docstring). Every randomized ``spec_ref`` routine takes one."""

    def uniform(self) -> Uniform: ...

    def bernoulli(self, probability: Any) -> bool: ...

    def categorical(self, weights: npt.NDArray[Any]) -> int: ...

    def integers(self, n: int) -> int: ...

    def substream(self, index: int) -> RandomSource: ...


class _UniformDrivenSource:
    """Base of the sampling sources: every call consumes exactly one uniform from :meth:`_next`."""

    def _next(self) -> float:
        raise NotImplementedError

    def uniform(self) -> float:
        return self._next()

    def bernoulli(self, probability: Any) -> bool:
        return bool(self._next() < probability)

    def categorical(self, weights: npt.NDArray[Any]) -> int:
        return inverse_cdf(weights, self._next())

    def integers(self, n: int) -> int:
        if n < 1:
            raise ValueError(f"integers(n) needs n >= 1, got n={n}")
        return min(int(self._next() * n), n - 1)

    def substream(self, index: int) -> RandomSource:
        return self


class GeneratorSource(_UniformDrivenSource):
    """Draws uniforms from a ``numpy.random.Generator`` (``Generator.random()``, in [0, 1))."""

    def __init__(self, generator: np.random.Generator) -> None:
        self.generator = generator

    def _next(self) -> float:
        return float(self.generator.random())


class ReplaySource(_UniformDrivenSource):
    """Replays an explicit sequence of uniforms in [0, 1), in order; ``consumed`` counts those used."""

    def __init__(self, uniforms: Sequence[float] | npt.NDArray[Any]) -> None:
        values = np.asarray(uniforms, dtype=np.float64).reshape(-1)
        if values.size and (not np.all(np.isfinite(values)) or values.min() < 0.0 or values.max() >= 1.0):
            bad = [float(v) for v in values if not (0.0 <= v < 1.0)]
            raise ValueError(f"uniforms must lie in [0, 1), got {bad[:3]}")
        self.uniforms = values
        self.consumed = 0

    def _next(self) -> float:
        if self.consumed >= self.uniforms.size:
            raise ValueError(
                f"ReplaySource ran out of uniforms: the routine asked for draw #{self.consumed + 1} "
                f"but only {self.uniforms.size} were given"
            )
        value = float(self.uniforms[self.consumed])
        self.consumed += 1
        return value


class NodeReplaySource(_UniformDrivenSource):
    """Replays a ``[N, M]`` table of uniforms: ``substream(i)`` replays row ``i`` (tree node ``i``)."""

    def __init__(self, uniforms: npt.NDArray[Any]) -> None:
        table = np.asarray(uniforms, dtype=np.float64)
        if table.ndim != 2:
            raise ValueError(f"uniforms must be a table [N, M], got shape {table.shape}")
        self.rows = [ReplaySource(row) for row in table]

    def _next(self) -> float:
        raise ValueError("NodeReplaySource has no stream of its own: use substream(node_index)")

    def substream(self, index: int) -> RandomSource:
        if not 0 <= index < len(self.rows):
            raise ValueError(f"substream index={index} must lie in [0, {len(self.rows)})")
        return self.rows[index]


def as_source(rng: Any) -> RandomSource:
    """Accept a ``numpy.random.Generator``, an ``int`` seed or any :class:`RandomSource`."""
    if isinstance(rng, np.random.Generator):
        return GeneratorSource(rng)
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        return GeneratorSource(np.random.default_rng(int(rng)))
    if isinstance(rng, RandomSource):
        return rng
    raise ValueError(
        f"rng must be a numpy.random.Generator, an int seed or a spec_ref.rng.RandomSource, got {rng!r}"
    )


class _EnumeratingSource:
    """One run of the enumerator along a recorded tape of branch choices (docs/testing.md Appendix A)."""

    def __init__(self, tape: list[int]) -> None:
        self.tape = tape
        self.pos = 0
        self.probability = Fraction(1)
        self.arity: list[int] = []

    def branch(self, weights: Sequence[Any]) -> int:
        exact = [Fraction(w) for w in weights]
        total = sum(exact, Fraction(0))
        if total <= 0:
            raise ValueError(f"cannot branch on weights with non-positive total {total}: {weights!r}")
        support = [i for i, w in enumerate(exact) if w > 0]
        if self.pos == len(self.tape):
            self.tape.append(0)
        choice = support[self.tape[self.pos]]
        self.arity.append(len(support))
        self.pos += 1
        self.probability *= exact[choice] / total
        return choice

    def uniform(self) -> SymbolicUniform:
        return SymbolicUniform(self)

    def bernoulli(self, probability: Any) -> bool:
        a = Fraction(probability)
        if a >= 1:
            return True
        if a <= 0:
            return False
        return self.branch([1 - a, a]) == 1

    def categorical(self, weights: npt.NDArray[Any]) -> int:
        values = list(np.asarray(weights).reshape(-1))
        if any(Fraction(w) < 0 for w in values):
            raise ValueError(f"categorical weights must be non-negative, got {values!r}")
        return self.branch(values)

    def integers(self, n: int) -> int:
        if n < 1:
            raise ValueError(f"integers(n) needs n >= 1, got n={n}")
        return self.branch([1] * n)

    def substream(self, index: int) -> RandomSource:
        return self


#: The exact law of a routine's output: outcome -> probability (Fractions summing to exactly 1).
ExactLaw = dict[Hashable, Fraction]


def _freeze(value: Any) -> Hashable:
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, np.ndarray):
        return tuple(_freeze(v) for v in value.tolist())
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value  # type: ignore[no-any-return]


def exact_law(fn: Callable[..., Any], *args: Any, max_paths: int = 1_000_000) -> ExactLaw:
    """The exact output law of ``fn(*args, rng)`` over every random branch of ``rng``.

    ``fn`` must take the random source as its last positional argument and draw all of its randomness
    from it. Each run follows one path of branch choices (odometer order); the path's probability is
    the product of its branch probabilities as Fractions, so the result is exact whenever the branch
    probabilities are (they are whenever the routine runs in exact mode; float weights enter as the
    exact rational value of the float). Outcomes are made hashable (arrays and lists become tuples,
    numpy integers become ints).

    Raises ``RuntimeError`` if more than ``max_paths`` paths would be needed.
    """
    law: dict[Hashable, Fraction] = {}
    tape: list[int] = []
    paths = 0
    while True:
        source = _EnumeratingSource(tape)
        outcome = _freeze(fn(*args, source))
        del tape[source.pos:]
        law[outcome] = law.get(outcome, Fraction(0)) + source.probability
        paths += 1
        if paths > max_paths:
            raise RuntimeError(f"exact_law: more than max_paths={max_paths} random paths")
        k = len(tape) - 1
        while k >= 0 and tape[k] + 1 >= source.arity[k]:
            k -= 1
        if k < 0:
            break
        tape[k] += 1
        del tape[k + 1:]
    total = sum(law.values(), Fraction(0))
    if total != 1:  # pragma: no cover - a defect of the enumerator itself
        raise RuntimeError(f"exact_law: path probabilities sum to {total}, not 1")
    return law
