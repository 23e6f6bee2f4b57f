"""Shared Hypothesis strategies (docs/testing.md section 5): they live in :mod:`spec_ref.strategies`, the
public kit that users' own property tests import as well."""

from __future__ import annotations

from spec_ref.strategies import (
    EXACT_WEIGHTS,
    PAIR_FAMILIES,
    draft_tree,
    exact_pair,
    exact_probability_vector,
    pair,
    probability_table,
    probability_vector,
)

__all__ = [
    "EXACT_WEIGHTS",
    "PAIR_FAMILIES",
    "draft_tree",
    "exact_pair",
    "exact_probability_vector",
    "pair",
    "probability_table",
    "probability_vector",
]
