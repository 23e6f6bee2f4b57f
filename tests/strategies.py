"""Shared Hypothesis strategies: valid inputs, built (never filtered) — TESTING.md section 5."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import strategies as st

#: Integer weights of exact probability vectors: zeros, small values and one huge value.
EXACT_WEIGHTS = (0, 0, 1, 1, 2, 3, 7, 1000)
PAIR_FAMILIES = ("independent", "equal", "disjoint", "draft_inside_target", "target_inside_draft",
                 "target_one_hot", "draft_one_hot")


@st.composite
def exact_probability_vector(draw: st.DrawFn, size: int) -> list[Fraction]:
    weights = draw(st.lists(st.sampled_from(EXACT_WEIGHTS), min_size=size, max_size=size))
    if sum(weights) == 0:
        weights[draw(st.integers(0, size - 1))] = 1
    total = sum(weights)
    return [Fraction(w, total) for w in weights]


@st.composite
def exact_pair(draw: st.DrawFn, min_size: int = 1, max_size: int = 4) -> tuple[list[Fraction], list[Fraction]]:
    """(target_probs, draft_probs) as exact Fractions, from one of :data:`PAIR_FAMILIES`."""
    size = draw(st.integers(min_size, max_size))
    family = draw(st.sampled_from(PAIR_FAMILIES))
    target = draw(exact_probability_vector(size))
    draft = draw(exact_probability_vector(size))
    if family == "equal":
        draft = list(target)
    elif family == "disjoint" and size >= 2:
        cut = draw(st.integers(1, size - 1))
        target = _renormalised([w if i < cut else Fraction(0) for i, w in enumerate(target)], 0)
        draft = _renormalised([w if i >= cut else Fraction(0) for i, w in enumerate(draft)], size - 1)
    elif family == "draft_inside_target":
        draft = _renormalised([d if t > 0 else Fraction(0) for d, t in zip(draft, target)], target.index(max(target)))
    elif family == "target_inside_draft":
        target = _renormalised([t if d > 0 else Fraction(0) for t, d in zip(target, draft)], draft.index(max(draft)))
    elif family == "target_one_hot":
        target = _one_hot(size, draw(st.integers(0, size - 1)))
    elif family == "draft_one_hot":
        draft = _one_hot(size, draw(st.integers(0, size - 1)))
    return target, draft


def _one_hot(size: int, index: int) -> list[Fraction]:
    return [Fraction(int(i == index)) for i in range(size)]


def _renormalised(weights: list[Fraction], fallback: int) -> list[Fraction]:
    total = sum(weights)
    if total == 0:
        return _one_hot(len(weights), fallback)
    return [w / total for w in weights]
