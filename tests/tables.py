"""Context-dependent probability tables shared by the tree tests and the proofs runner.

A table maps every prefix (tuple of token ids after the root) of length <= depth to a pmf [vocab] of exact
Fractions, drawn independently per prefix so that p(.|a) != p(.|b) and depth d != d+1 (docs/testing.md section 5).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from fractions import Fraction

Table = dict[tuple[int, ...], list[Fraction]]


def random_table(seed: int, depth: int, vocab: int = 3, zeros: bool = True) -> Table:
    """A deterministic table prefix -> pmf [vocab] for every prefix of length <= depth."""
    rnd = random.Random(seed)
    weights = (0, 1, 1, 2, 3, 5) if zeros else (1, 2, 3, 5)
    table: Table = {}
    for d in range(depth + 1):
        for prefix in itertools.product(range(vocab), repeat=d):
            w = [rnd.choice(weights) for _ in range(vocab)]
            if not any(w):
                w[rnd.randrange(vocab)] = 1
            table[prefix] = [Fraction(x, sum(w)) for x in w]
    return table


def model(table: Table) -> Callable[[tuple[int, ...]], list[Fraction]]:
    """The table as a model: prefix -> pmf."""
    return lambda prefix: table[prefix]
