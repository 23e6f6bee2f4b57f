"""Monte Carlo tests of the tree verifiers on the production RNG path (docs/testing.md layer D, section 4.4).

Each configuration drafts K i.i.d. paths of length L and verifies them with a ``numpy.random.Generator``
(through :class:`spec_ref.GeneratorSource`), extends the emitted block with target samples to length L + 1
and counts the V^(L+1) cells. Two Pearson chi-square tests per configuration, cells pooled to expected count
>= 20, each at alpha = 1e-6 (``tests/stats.py``):

* D2: the extended block against the autoregressive law prod p (losslessness);
* D3: the accepted depth tau against its exact law (from the enumerator: drafting + verifying), which a
  verifier that silently degenerates to NSS would fail.

Negative control: the same check, fed the verifier with the parent's target row at every node (a test-only
mutant), must reject, and N * chi2(mutant || expected) computed from the mutant's exact law must reach the
noncentrality needed for power 0.99 at alpha = 1e-6. Seeds: ``config_seed(name)`` (zlib.crc32).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from spec_ref import DraftTree, GeneratorSource, exact_law, verify
from spec_ref.rng import RandomSource
from tests.ref.test_verify_exact import random_table
from tests.stats import ALPHA, POWER, chi2_gof, config_seed, noncentrality, required_noncentrality

V = 3
N = 16384
FloatTable = dict[tuple[int, ...], np.ndarray]
GRID: list[tuple[str, dict[str, Any], int, int]] = [
    ("naive_tree", {}, 2, 2),
    ("nss", {}, 2, 2),
    ("spectr", {}, 2, 2),
    ("specinfer", {}, 2, 2),
    ("khisti", {}, 2, 2),
    ("naive", {}, 2, 2),
    ("bv", {}, 2, 2),
    ("tree_mc", {}, 2, 2),
    ("traversal", {}, 3, 2),
    ("traversal", {"sibling_model": "wr"}, 2, 2),
]


def config_name(method: str, options: dict[str, Any], K: int, L: int) -> str:
    return f"{method}{''.join('-' + str(v) for v in options.values())}-K{K}-L{L}"


def float_tables(name: str, L: int) -> tuple[FloatTable, FloatTable]:
    seed = config_seed(name)
    target = {k: np.array([float(x) for x in v]) for k, v in random_table(seed, L + 1).items()}
    draft = {k: np.array([float(x) for x in v]) for k, v in random_table(seed + 1, L, zeros=False).items()}
    return target, draft


def step(
    rng: RandomSource, target: FloatTable, draft: FloatTable, verifier_target: Callable[[tuple[int, ...]], Any],
    method: str, options: dict[str, Any], K: int, L: int,
) -> tuple[tuple[int, ...], int]:
    paths = []
    for _ in range(K):
        prefix: tuple[int, ...] = ()
        for _ in range(L):
            prefix = prefix + (rng.categorical(draft[prefix]),)
        paths.append(prefix)
    tree = DraftTree.from_paths(paths, lambda prefix: draft[prefix])
    result = verify(tree, verifier_target, method, rng, **options)
    tokens = result.tokens
    while len(tokens) < L + 1:
        tokens = tokens + (rng.categorical(target[tokens]),)
    return tokens, result.accepted_depth


def cell_index(tokens: tuple[int, ...]) -> int:
    index = 0
    for t in tokens:
        index = index * V + t
    return index


def exact_laws(
    target: FloatTable, draft: FloatTable, verifier_target: Callable[[tuple[int, ...]], Any],
    method: str, options: dict[str, Any], K: int, L: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(law of the extended block [V^(L+1)], law of tau [L+1]) by exact enumeration (float inputs)."""
    joint = exact_law(lambda rng: step(rng, target, draft, verifier_target, method, options, K, L))
    block, depth = np.zeros(V ** (L + 1)), np.zeros(L + 1)
    for (tokens, tau), mass in joint.items():  # type: ignore[misc]
        block[cell_index(tokens)] += float(mass)
        depth[tau] += float(mass)
    return block, depth


def autoregressive(target: FloatTable, L: int) -> np.ndarray:
    law = np.zeros(V ** (L + 1))
    for seq in itertools.product(range(V), repeat=L + 1):
        law[cell_index(seq)] = np.prod([target[seq[:i]][seq[i]] for i in range(L + 1)])
    return law


def monte_carlo(
    name: str, target: FloatTable, draft: FloatTable, verifier_target: Callable[[tuple[int, ...]], Any],
    method: str, options: dict[str, Any], K: int, L: int,
) -> tuple[np.ndarray, np.ndarray]:
    rng = GeneratorSource(np.random.default_rng(config_seed(name)))
    block, depth = np.zeros(V ** (L + 1)), np.zeros(L + 1)
    for _ in range(N):
        tokens, tau = step(rng, target, draft, verifier_target, method, options, K, L)
        block[cell_index(tokens)] += 1
        depth[tau] += 1
    return block, depth


@pytest.mark.statistical
@pytest.mark.parametrize(("method", "options", "K", "L"), GRID, ids=[config_name(*c) for c in GRID])
def test_tree_verifier_on_the_generator_path_matches_the_target_law_and_its_exact_depth_law(
    method: str, options: dict[str, Any], K: int, L: int
) -> None:
    # alpha = 1e-6 per chi-square assertion (two per configuration); power: see the negative control below.
    name = config_name(method, options, K, L)
    target, draft = float_tables(name, L)
    _, depth_law = exact_laws(target, draft, lambda prefix: target[prefix], method, options, K, L)
    block_counts, depth_counts = monte_carlo(name, target, draft, lambda prefix: target[prefix], method, options, K, L)
    block = chi2_gof(block_counts, autoregressive(target, L), ALPHA)
    depth = chi2_gof(depth_counts, depth_law, ALPHA)
    assert not block.rejected, f"{name}: block law chi2={block.statistic:.1f} > {block.critical:.1f} ({block})"
    assert not depth.rejected, f"{name}: tau law chi2={depth.statistic:.1f} > {depth.critical:.1f} ({depth})"


@pytest.mark.statistical
@pytest.mark.parametrize("method", ["specinfer", "traversal"])
def test_the_statistical_check_rejects_a_verifier_that_reads_the_parents_row_and_has_the_power_to(method: str) -> None:
    K, L, options = 2, 2, {}
    name = config_name(method, options, K, L) + "-parent-row-mutant"
    target, draft = float_tables(name, L)

    def parents_row(prefix: tuple[int, ...]) -> np.ndarray:  # the mutant: p(. | parent) at every node
        return target[prefix[:-1]]

    expected = autoregressive(target, L)
    mutant_law, _ = exact_laws(target, draft, parents_row, method, options, K, L)
    lam, df = noncentrality(N, mutant_law, expected)
    assert lam >= required_noncentrality(df, ALPHA, POWER), f"N={N} is too small to catch the mutant (lambda={lam:.1f})"
    counts, _ = monte_carlo(name, target, draft, parents_row, method, options, K, L)
    assert chi2_gof(counts, expected, ALPHA).rejected
