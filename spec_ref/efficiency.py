"""Expected block efficiency E[tau + 1] of a verification step (seed 002 (docs/papers.md) eq. 1-3; docs/algorithms.md section 4, 5).

* :func:`expected_block_efficiency` ``(tree, target_model, method)`` = E[tau + 1 | tree], exactly:
  - OT methods (naive_tree, nss, spectr, specinfer, khisti): eq. 3, the sum over every node c of the tree
    (the root included, reached with probability 1) of the product of the branching probabilities
    ``B_u(t | D_u)`` on the edges u -> u.t of the path to c (docs/algorithms.md section 4; SpecInfer's branching is the
    corrected Alg 14);
  - naive (path 0): ``1 + sum_{i=1..L} prod_{j<=i} min(1, p_{j-1}(x_j)/q_{j-1}(x_j))`` (5.1);
  - bv and tree_mc (path 0; equal in law, 5.3): ``1 + sum_{i=1..L} (1 - prod_{j=i..L} (1 - h_j))`` (5.2);
  - traversal: exact enumeration (:func:`exact_block_efficiency`; there is no closed form);
  - greedy, dynatree: deterministic, tau + 1 of the single outcome.
* :func:`exact_block_efficiency` and :func:`accepted_depth_law`: the law of tau (and its mean + 1) by
  exact enumeration of every random branch of :func:`spec_ref.verify`, for any method (small cases only).
* :func:`estimate_block_efficiency`: the unbiased s-sample estimator of eq. 1-3 over random delayed
  (K, L1, L2) trees (seed 002 Def. 5.2 and section 5): draw s trees with the draft model and average
  E[tau + 1 | tree]. It removes the verification variance, not the drafting variance.

Results are Fractions in exact mode (any Fraction input) and floats otherwise.

Theorems: proofs/T03_ot_tree_driver.md (eq. 1-3), proofs/T04_chain_bv_tree_verification.md (closed forms).
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from spec_ref._validate import Scalar, probability_vector
from spec_ref.rng import RandomSource, as_source, exact_law
from spec_ref.drafting import draft_delayed_tree
from spec_ref.tree import DraftTree, Model
from spec_ref.verify import (
    GREEDY_METHODS,
    OT_METHODS,
    TreeProbabilities,
    bv_acceptances,
    check_method,
    node_plan,
    ot_solver,
    path_zero,
    tree_probabilities,
    verify,
)

__all__ = [
    "expected_block_efficiency",
    "exact_block_efficiency",
    "accepted_depth_law",
    "estimate_block_efficiency",
]


def expected_block_efficiency(tree: DraftTree, target_model: Model, method: str, **options: Any) -> Scalar:
    """E[tau + 1 | tree] for ``method`` (module docstring), exact in exact mode.

    ``options`` are those of :func:`spec_ref.verify` (``specinfer_order``, ``khisti_truncation``, ...) plus
    ``max_paths`` for the traversal enumeration. Raises ``ValueError`` like :func:`spec_ref.verify`.
    """
    max_paths = options.pop("max_paths", 200_000)
    method = check_method(tree, method, options)
    probs = tree_probabilities(tree, target_model)
    if method in OT_METHODS:
        return _eq3(tree, probs, method, options)
    if method == "naive":
        return _naive_closed_form(tree, probs)
    if method in ("bv", "tree_mc"):
        return _bv_closed_form(tree, probs)
    if method in GREEDY_METHODS:
        result = verify(tree, target_model, method, None)
        return _cast(probs, Fraction(result.accepted_depth + 1))
    return exact_block_efficiency(tree, target_model, method, max_paths=max_paths, **options)


def accepted_depth_law(
    tree: DraftTree, target_model: Model, method: str, *, max_paths: int = 200_000, **options: Any
) -> dict[int, Fraction]:
    """The exact law of tau, by enumerating every random branch of :func:`spec_ref.verify`."""

    def depth(rng: RandomSource) -> int:
        return verify(tree, target_model, method, rng, **options).accepted_depth

    check_method(tree, method, options)
    law = exact_law(depth, max_paths=max_paths)
    return {int(k): v for k, v in sorted(law.items()) if v}  # type: ignore[call-overload]


def exact_block_efficiency(
    tree: DraftTree, target_model: Model, method: str, *, max_paths: int = 200_000, **options: Any
) -> Scalar:
    """E[tau + 1 | tree] by exact enumeration of the verifier (any method; small trees and V only)."""
    law = accepted_depth_law(tree, target_model, method, max_paths=max_paths, **options)
    mean = sum((mass * (depth + 1) for depth, mass in law.items()), Fraction(0))
    return _cast(tree_probabilities(tree, target_model), mean)


def _cast(probs: TreeProbabilities, value: Fraction) -> Scalar:
    return value if probs.exact else float(value)


def _eq3(tree: DraftTree, probs: TreeProbabilities, method: str, options: Mapping[str, Any]) -> Scalar:
    solver = ot_solver(method, options)
    one = probs.target[0][0] * 0 + 1
    reach: list[Any] = [one] * tree.num_nodes  # P(the driver reaches node c | tree); the root always
    for u in range(tree.num_nodes):  # ancestors first
        draws = tree.draws[u]
        if not draws:
            continue
        if method == "nss":
            law = probs.target[u]  # B(y | x) = p(y); also on deterministic trees (no q needed)
        else:
            draft = probs.draft[u]
            assert draft is not None  # only deterministic trees lack q, and they only allow nss
            law = solver.branching_planned(node_plan(solver, probs.target[u], draft, len(draws)), draws)
        for token, child in tree.children[u].items():
            reach[child] = reach[u] * law[token]
    total = sum(reach[1:], reach[0])
    return total if probs.exact else float(total)


def _naive_closed_form(tree: DraftTree, probs: TreeProbabilities) -> Scalar:
    nodes = path_zero(tree)
    one = probs.target[0][0] * 0 + 1
    total, running = one, one
    for i in range(1, len(nodes)):
        parent, token = nodes[i - 1], tree.tokens[nodes[i]]
        draft = probs.draft[parent]
        assert draft is not None
        ratio = probs.target[parent][token] / draft[token]
        running = running * (ratio if ratio < 1 else one)
        total = total + running
    return total if probs.exact else float(total)


def _bv_closed_form(tree: DraftTree, probs: TreeProbabilities) -> Scalar:
    _, h = bv_acceptances(tree, probs)
    one = probs.target[0][0] * 0 + 1
    total = one
    for i in range(len(h)):  # E[tau | x] = sum_i P(tau >= i) = sum_i (1 - prod_{j >= i} (1 - h_j))
        miss = one
        for value in h[i:]:
            miss = miss * (one - value)
        total = total + (one - miss)
    return total if probs.exact else float(total)


# ========================================================================================================
# Random delayed trees and the unbiased estimator
# ========================================================================================================
def _count(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {name}={value!r}")
    return value


def estimate_block_efficiency(
    target_model: Model,
    draft_model: Model,
    method: str,
    K: int,
    L1: int,
    L2: int,
    rng: Any,
    num_trees: int = 4,
    **options: Any,
) -> Scalar:
    """The unbiased s-sample estimator of E[tau + 1] over random (K, L1, L2) delayed trees (eq. 1-3).

    Draws ``num_trees`` (s; the seed uses s = 4) trees with :func:`spec_ref.drafting.draft_delayed_tree`, one after the other
    from ``rng``, and averages :func:`expected_block_efficiency` over them. Its expectation over the drafts
    is exactly E[tau + 1] of drafting + verifying (tested by exact enumeration).
    """
    num_trees = _count(num_trees, "num_trees", 1)
    source = as_source(rng)
    values = [
        expected_block_efficiency(draft_delayed_tree(draft_model, K, L1, L2, source), target_model, method, **options)
        for _ in range(num_trees)
    ]
    total: Any = sum(values[1:], values[0])
    return total / num_trees  # type: ignore[no-any-return]
