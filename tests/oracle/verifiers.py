"""Verifiers the conformance kit is demonstrated on: adapters around our own, and deliberately lossy mutants.

Everything here draws its randomness through the spec_ref RNG protocol (``uniform``, ``categorical``), so
the same function runs in the kit's exact mode (enumerated) and, wrapped by :func:`on_generator`, in its
statistical mode (a ``numpy.random.Generator``). The mutants are test-only negative controls (docs/testing.md
section 7), never product flags; each differs from :func:`naive_step` in one line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from spec_ref import DraftTree, GeneratorSource, verify
from spec_ref._sampling import residual

Step = Callable[[Any, Any, Sequence[int], Any], int]


def naive_step(p: Any, q: Any, drafts: Sequence[int], rng: Any) -> int:
    """Naive speculative sampling on the first draft: accept iff ``u * q(x) < p(x)``, else draw Res(p, q)."""
    x = drafts[0]
    if rng.uniform() * q[x] < p[x]:
        return x
    return int(rng.categorical(residual(np.asarray(p), np.asarray(q))))


def wrong_residual_step(p: Any, q: Any, drafts: Sequence[int], rng: Any) -> int:
    """Mutant: on rejection resample from p instead of Res(p, q)."""
    x = drafts[0]
    if rng.uniform() * q[x] < p[x]:
        return x
    return int(rng.categorical(np.asarray(p)))


def unnormalised_residual_step(p: Any, q: Any, drafts: Sequence[int], rng: Any) -> int:
    """Mutant: inverse CDF over (p - q)+ without dividing by its mass (the leftover goes to the last token)."""
    x = drafts[0]
    if rng.uniform() * q[x] < p[x]:
        return x
    u = rng.uniform()
    cumulative: Any = 0
    for y in range(len(p)):
        cumulative = cumulative + max(p[y] - q[y], 0)
        if u < cumulative:
            return y
    return len(p) - 1


def wrong_ratio_step(p: Any, q: Any, drafts: Sequence[int], rng: Any) -> int:
    """Mutant: accept iff u <= q(x) / p(x), the ratio upside down."""
    x = drafts[0]
    if rng.uniform() * p[x] < q[x]:
        return x
    return int(rng.categorical(residual(np.asarray(p), np.asarray(q))))


MUTANT_STEPS: dict[str, Step] = {
    "wrong_residual": wrong_residual_step,
    "unnormalised_residual": unnormalised_residual_step,
    "wrong_ratio": wrong_ratio_step,
}


def chain_from_step(step: Step) -> Callable[[Any, Any, tuple[int, ...], Any], list[int]]:
    """A chain verifier that runs ``step`` position by position and stops at the first replaced draft."""

    def chain(target_probs: Any, draft_probs: Any, draft_tokens: tuple[int, ...], rng: Any) -> list[int]:
        committed: list[int] = []
        for i, x in enumerate(draft_tokens):
            y = step(target_probs[i], draft_probs[i], (x,), rng)
            committed.append(y)
            if y != x:
                return committed
        committed.append(int(rng.categorical(target_probs[len(draft_tokens)])))
        return committed

    chain.__qualname__ = f"chain_from_step({step.__name__})"
    return chain


def chain_by_verify(method: str) -> Callable[[Any, Any, tuple[int, ...], Any], tuple[int, ...]]:
    """spec_ref's tree verifier ``method`` on the one-path tree of the drafted chain."""

    def chain(target_probs: Any, draft_probs: Any, draft_tokens: tuple[int, ...], rng: Any) -> tuple[int, ...]:
        tree = DraftTree.from_paths([draft_tokens], lambda prefix: draft_probs[len(prefix)])
        return verify(tree, lambda prefix: target_probs[len(prefix)], method, rng).tokens

    chain.__qualname__ = f"chain_by_verify({method!r})"
    return chain


def tree_from_step(step: Step) -> Callable[[DraftTree, Any, Any], list[int]]:
    """The top-down OT driver (docs/algorithms.md section 4) with ``step`` as the node solver."""

    def tree_verifier(tree: DraftTree, target: Any, rng: Any) -> list[int]:
        node, committed = 0, []
        while True:
            p = target(tree.path_tokens(node))
            if not tree.draws[node]:
                return committed + [int(rng.categorical(p))]
            y = step(p, tree.draft_probs[node], tree.draws[node], rng)
            committed.append(y)
            child = tree.child(node, y)
            if child is None:
                return committed
            node = child

    tree_verifier.__qualname__ = f"tree_from_step({step.__name__})"
    return tree_verifier


def tree_by_verify(method: str, parents_row: bool = False) -> Callable[[DraftTree, Any, Any], tuple[int, ...]]:
    """spec_ref's ``verify(tree, target, method, rng)``; ``parents_row``: the off-by-one mutant that reads
    the target law of the node's parent."""

    def tree_verifier(tree: DraftTree, target: Any, rng: Any) -> tuple[int, ...]:
        model = (lambda prefix: target(prefix[:-1])) if parents_row else target
        return verify(tree, model, method, rng).tokens

    tree_verifier.__qualname__ = f"tree_by_verify({method!r}{', parents_row=True' if parents_row else ''})"
    return tree_verifier


def on_generator(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The same verifier driven by a ``numpy.random.Generator`` (its last argument) instead of a source."""

    def wrapped(*args: Any) -> Any:
        return fn(*args[:-1], GeneratorSource(args[-1]))

    wrapped.__qualname__ = getattr(fn, "__qualname__", "fn")
    return wrapped
