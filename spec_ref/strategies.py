"""Hypothesis strategies for property tests of speculative-decoding verifiers (docs/testing.md section 5).

Inputs are *built*, never filtered, so no strategy trips ``filter_too_much``:

* :func:`exact_probability_vector` / :func:`exact_pair`: exact :class:`fractions.Fraction` laws (the
  enumerator's input), ``exact_pair`` choosing one of :data:`PAIR_FAMILIES`;
* :func:`probability_vector`: float64 laws with adversarial shapes (zeros, huge weights, tiny and subnormal
  values, powers of two);
* :func:`pair`: a (target, draft) pair from any family of :mod:`spec_ref.testing`'s cases
  (``disjoint``, ``ties``, ``tiny``, ...), exact or float;
* :func:`probability_table`: a context-dependent table prefix -> law for every prefix up to a depth;
* :func:`draft_tree`: a valid :class:`spec_ref.DraftTree` (random rooted shape, distinct sibling tokens,
  i.i.d. draws with repeats, each node's draft law positive on its drafted tokens).

This is the only ``spec_ref`` module that imports ``hypothesis``. For losslessness tests let the enumerator
(:func:`spec_ref.exact_law`) draw the draft *tokens*; Hypothesis should choose laws and shapes only.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from hypothesis import strategies as st

from spec_ref import _cases
from spec_ref.tree import DraftTree

__all__ = [
    "EXACT_WEIGHTS",
    "FLOAT_TINY",
    "PAIR_FAMILIES",
    "draft_tree",
    "exact_pair",
    "exact_probability_vector",
    "pair",
    "probability_table",
    "probability_vector",
]

#: Integer weights of exact probability vectors: zeros, small values and one huge value.
EXACT_WEIGHTS = (0, 0, 1, 1, 2, 3, 7, 1000)
#: The families :func:`exact_pair` draws from.
PAIR_FAMILIES = (
    "independent",
    "equal",
    "disjoint",
    "draft_inside_target",
    "target_inside_draft",
    "target_one_hot",
    "draft_one_hot",
)
#: Tiny float weights: float64 subnormal, float32 subnormal and minimum normal, and two small normals.
FLOAT_TINY = (1e-30, 1e-300, 5e-324, 1.4e-45, 1.18e-38)

Pmf = list[Fraction]


@st.composite
def exact_probability_vector(draw: st.DrawFn, size: int) -> Pmf:
    """A law over ``size`` tokens as Fractions summing to exactly 1, weights from :data:`EXACT_WEIGHTS`."""
    weights = draw(st.lists(st.sampled_from(EXACT_WEIGHTS), min_size=size, max_size=size))
    if sum(weights) == 0:
        weights[draw(st.integers(0, size - 1))] = 1
    total = sum(weights)
    return [Fraction(w, total) for w in weights]


@st.composite
def exact_pair(draw: st.DrawFn, min_size: int = 1, max_size: int = 4) -> tuple[Pmf, Pmf]:
    """(target_probs, draft_probs) as exact Fractions, from one of :data:`PAIR_FAMILIES`."""
    size = draw(st.integers(min_size, max_size))
    family = draw(st.sampled_from(PAIR_FAMILIES))
    target = draw(exact_probability_vector(size))
    draft = draw(exact_probability_vector(size))
    if family == "equal":
        draft = list(target)
    elif family == "disjoint" and size >= 2:
        cut = draw(st.integers(1, size - 1))
        target = _cases.normalised([w if i < cut else Fraction(0) for i, w in enumerate(target)], 0)
        draft = _cases.normalised([w if i >= cut else Fraction(0) for i, w in enumerate(draft)], size - 1)
    elif family == "draft_inside_target":
        keep = target.index(max(target))
        draft = _cases.normalised([d if t > 0 else Fraction(0) for d, t in zip(draft, target)], keep)
    elif family == "target_inside_draft":
        keep = draft.index(max(draft))
        target = _cases.normalised([t if d > 0 else Fraction(0) for t, d in zip(target, draft)], keep)
    elif family == "target_one_hot":
        target = _cases.one_hot(size, draw(st.integers(0, size - 1)))
    elif family == "draft_one_hot":
        draft = _cases.one_hot(size, draw(st.integers(0, size - 1)))
    return target, draft


def _float_weight() -> st.SearchStrategy[float]:
    return st.one_of(
        st.just(0.0),
        st.floats(0.0, 1.0, allow_nan=False, allow_infinity=False),
        st.just(1e6),
        st.sampled_from(FLOAT_TINY),
        st.integers(0, 1074).map(lambda e: 2.0**-e),
    )


@st.composite
def probability_vector(draw: st.DrawFn, size: int | None = None, max_size: int = 64) -> npt.NDArray[np.float64]:
    """A float64 law ``[V]`` (V drawn from 1..``max_size`` unless ``size`` is given) with adversarial weights:
    zeros, 1e6, subnormals, powers 2^-e; at least one positive entry; normalised by its sum."""
    vocab = size if size is not None else draw(st.integers(1, max_size))
    weights = np.array(draw(st.lists(_float_weight(), min_size=vocab, max_size=vocab)), dtype=np.float64)
    if not weights.sum() > 0:
        weights[draw(st.integers(0, vocab - 1))] = 1.0
    return weights / weights.sum()  # type: ignore[no-any-return]


@st.composite
def pair(
    draw: st.DrawFn,
    min_size: int = 1,
    max_size: int = 6,
    arithmetic: Literal["fraction", "float"] = "fraction",
    families: tuple[str, ...] = _cases.FAMILIES,
) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """(target_probs [V], draft_probs [V]) from one of ``families`` (:data:`spec_ref._cases.FAMILIES`:
    ``equal``, ``disjoint``, ``target_one_hot``, ``draft_one_hot``, ``ties``, ``tiny``, nested supports,
    ``random``), as read-only ``object`` arrays of Fractions or ``float64`` arrays."""
    unknown = [f for f in families if f not in _cases.FAMILIES]
    if unknown or not families:
        raise ValueError(f"families={families!r} must be a non-empty subset of {_cases.FAMILIES}")
    size = draw(st.integers(min_size, max_size))
    family = draw(st.sampled_from(families))
    target_weights = draw(st.lists(st.sampled_from(EXACT_WEIGHTS), min_size=size, max_size=size))
    draft_weights = draw(st.lists(st.sampled_from(EXACT_WEIGHTS), min_size=size, max_size=size))
    target_weights[0] += int(not any(target_weights))
    draft_weights[-1] += int(not any(draft_weights))
    p, q = _cases.family_pair(family, target_weights, draft_weights, draw(st.integers(0, 1 << 16)))
    fraction = arithmetic == "fraction"
    return _cases.as_array(p, fraction), _cases.as_array(q, fraction)


@st.composite
def probability_table(
    draw: st.DrawFn, vocab_size: int, depth: int, positive: bool = False
) -> dict[tuple[int, ...], Pmf]:
    """A context-dependent table: every prefix of length 0..``depth`` maps to its own exact law ``[V]``, drawn
    independently so that p(.|a) != p(.|b) and depth d != d + 1 (``positive``: no zero entries)."""
    table: dict[tuple[int, ...], Pmf] = {}
    for prefix in _cases.prefixes(vocab_size, depth):
        pmf = draw(exact_probability_vector(vocab_size))
        if positive:
            pmf = _cases.normalised([w + Fraction(1, 8 * vocab_size) for w in pmf], 0)
        table[prefix] = pmf
    return table


@st.composite
def draft_tree(draw: st.DrawFn, vocab_size: int, max_nodes: int = 8, max_repeats: int = 1) -> DraftTree:
    """A valid i.i.d. :class:`spec_ref.DraftTree` over ``vocab_size`` tokens with 1..``max_nodes`` nodes.

    Each new node hangs under a random earlier node with room for another distinct child token, so the
    order is ancestors-first; ``draws[u]`` lists u's child tokens in a drawn order plus up to ``max_repeats``
    repeated draws; ``draft_probs[u]`` is a drawn exact law, made positive on u's drafted tokens.
    """
    nodes = draw(st.integers(1, max_nodes))
    tokens, parents = [-1], [-1]
    children: list[list[int]] = [[]]
    for i in range(1, nodes):
        open_nodes = [u for u in range(i) if len(children[u]) < vocab_size]
        if not open_nodes:
            break
        parent = draw(st.sampled_from(open_nodes))
        token = draw(st.sampled_from([t for t in range(vocab_size) if t not in children[parent]]))
        children[parent].append(token)
        children.append([])
        tokens.append(token)
        parents.append(parent)
    draws: list[tuple[int, ...]] = []
    probs: list[npt.NDArray[Any] | None] = []
    for u in range(len(tokens)):
        if not children[u]:
            draws.append(())
            probs.append(None)
            continue
        order = draw(st.permutations(children[u]))
        repeats = draw(st.lists(st.sampled_from(children[u]), max_size=max_repeats))
        draws.append(tuple(order) + tuple(repeats))
        pmf = draw(exact_probability_vector(vocab_size))
        boosted = [w + (1 if t in children[u] else 0) for t, w in enumerate(pmf)]
        probs.append(_cases.as_array(_cases.normalised(boosted, children[u][0]), True))
    return DraftTree(tuple(tokens), tuple(parents), tuple(draws), tuple(probs))
