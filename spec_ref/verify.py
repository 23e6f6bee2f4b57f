"""Every tree/path verifier of seed 002 (docs/papers.md) (plus greedy and DynaTree) on a :class:`DraftTree`.

``verify(tree, target_model, method, rng, **options) -> VerifyResult``. ``target_model`` maps a prefix (the
drafted tokens after the root) to the processed target distribution ``G(target) [V]`` at that node; the tree
carries the draft distribution q_u of every node that has draws (docs/algorithms.md section 1).

Methods (docs/algorithms.md sections 4, 5, 6, 8):

============  ==========================================================================================
method        algorithm
============  ==========================================================================================
naive_tree    OT top-down driver (section 4) with the Naive solver (3.2)
nss           OT top-down driver with NSS (3.1): ``y ~ p_u`` at each node; the only lossless *sampling*
              verifier on a deterministic (top-k/greedy) tree
spectr        OT driver with SpecTr K-SEQ (3.3); option ``spectr_iterations`` (default 64)
specinfer     OT driver with SpecInfer RRS (3.4); option ``specinfer_order`` in {"uniform" (default), "draw"}
khisti        OT driver with Khisti (3.5); option ``khisti_truncation`` (default 5)
naive         single-path naive speculative sampling (5.1) on path 0
bv            block verification (5.2) on path 0
tree_mc       Hu & Huang tree verification, official-code form (5.3) on path 0: one categorical draw
traversal     Traversal verification (section 6), true post-order in draw order; option ``sibling_model`` in
              {"wor" (default), "wr"}
greedy        the general greedy rule (section 8): follow child(u, argmax p_u) while it exists
dynatree      DynaTree SELECTCOMMIT (seed 003 Algorithm 1, docs/algorithms.md section 8)
============  ==========================================================================================

*Path 0* is the chain obtained by following the first draw ``draws[u][0]`` from the root: on a tree built
from K paths in path-index draw order it is exactly the first path (docs/algorithms.md section 5: single-path methods use
path 0 and ignore the other paths).

Randomness layout (what ``spec_fast`` replays draw for draw). All draws go through the protocol of
:mod:`spec_ref.rng`; ``S(u)`` below is ``rng.substream(u)`` with u the node's flattened index. With a
:class:`~spec_ref.rng.NodeReplaySource` each ``S(u)`` is row u of a ``[N, M]`` uniform table, consumed
left to right; with a sequential source every ``S(u)`` is the same stream, consumed in the order listed.

* OT driver (naive_tree, nss, spectr, specinfer, khisti): for each visited node u from the root down, the
  solver's own budget (module docstring of :mod:`spec_ref.solvers`) is drawn from ``S(u)``; at a node
  without draws (a leaf) the bonus is ``S(u).categorical(p_u)``. NSS draws exactly one
  ``S(u).categorical(p_u)`` per visited node. A visited node uses its row once, so M = the solver's
  largest budget (spectr: k+1, specinfer: 2k+1 uniform / k+1 draw order, khisti: k+1, naive/nss: 2/1).
* naive (path 0, nodes v_0 = root, v_1, ..., v_L): for i = 1..L: ``S(v_{i-1}).uniform()`` tests x_i with
  ``u * q(x_i) < p(x_i)``; on rejection ``S(v_{i-1}).categorical(Res(p, q))`` is the correction and the
  step ends. If all L are accepted, ``S(v_L).categorical(p_L)`` is the bonus. (Draw for draw identical to
  naive_tree on a one-path tree.)
* bv (path 0): nodes are tested from the deepest up, i = L, L-1, ..., 1: ``S(v_i).uniform() < h_i``
  accepts tau = i and stops (the sequential form of section 5.2; tau = 0 if none is accepted). Then the
  extra token is ``S(v_tau).categorical(.)``: ``p_L`` if tau = L, else ``Res(w_tau p_tau, q_tau)``. So row
  v_i holds [acceptance uniform of node i, extra-token uniform], and the root's row holds only the extra
  token. Rows of untested nodes are untouched.
* tree_mc (path 0): ``S(0).categorical(W)`` over the L x V cell matrix of section 5.3, flattened row-major
  (cell (j, v) is index (j-1)*V + v); if the drawn cell is the "fully coupled" cell (L, x_L), the bonus is a
  second draw ``S(0).categorical(p_L)``. With L = 0 the only draw is ``S(0).categorical(p_0)``.
* traversal: every node is tested at most once, when it becomes the first leaf in post-order:
  ``S(u).uniform() < w_u``. Duplicate (WR) rounds are automatic rejections and draw nothing. The extra token
  of the accepted node u* is ``S(u*).categorical(P_{u*})``: the second draw of its row (the first for the
  root, which is never tested). With K = 1 this is exactly bv's layout, so on a chain bv and traversal
  consume the same uniforms for the same tests.
* greedy, dynatree: no randomness (``rng`` may be None).

Refused combinations (``ValueError``): any method but nss/greedy/dynatree on a ``process="deterministic"``
tree (softmax q with deterministic drafts is lossy, docs/algorithms.md section 2, docs/testing.md section 0 (item 8)); any i.i.d. verifier
on a ``process="without_replacement"`` tree (docs/testing.md section 0 (item 8)). Traversal with ``sibling_model="wor"`` is
allowed there: its rounds *are* successive sampling without replacement (section 6.3, 6.5; checked by
exact enumeration in ``tests/ref/test_verify_exact.py``), as are nss, greedy and dynatree.

Everything runs in float64 or, when any input probability is a :class:`fractions.Fraction`, in exact
rational arithmetic (the mode of :mod:`spec_ref._validate`).

Theorems: proofs/T03_ot_tree_driver.md, proofs/T04_chain_bv_tree_verification.md, proofs/T05_traversal.md,
proofs/T06_deterministic_trees_and_routing.md, proofs/T07_merge_and_greedy.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import numpy as np

from spec_ref._sampling import accept, positive_part, residual
from spec_ref._validate import Vector, any_exact, is_exact, probability_vector, to_mode
from spec_ref.rng import RandomSource, as_source
from spec_ref.solvers import SOLVERS, KhistiSolver, Solver, SolverPlan, SpecInferSolver, SpecTrSolver
from spec_ref.tree import DraftTree, Model

__all__ = [
    "VerifyResult",
    "verify",
    "METHODS",
    "OT_METHODS",
    "PATH_METHODS",
    "GREEDY_METHODS",
    "TreeProbabilities",
    "tree_probabilities",
    "ot_solver",
    "node_plan",
    "check_method",
    "path_zero",
    "bv_acceptances",
    "greedy_argmax",
]

#: Methods driven by the top-down OT driver (docs/algorithms.md section 4), by solver name.
OT_METHODS = ("naive_tree", "nss", "spectr", "specinfer", "khisti")
#: Single-path methods: they verify path 0 only.
PATH_METHODS = ("naive", "bv", "tree_mc")
#: Deterministic (T = 0) methods.
GREEDY_METHODS = ("greedy", "dynatree")
#: Every method :func:`verify` accepts.
METHODS = OT_METHODS + PATH_METHODS + ("traversal",) + GREEDY_METHODS

#: Methods that are lossless on a deterministic (top-k / argmax) tree.
_DETERMINISTIC_OK = ("nss", "greedy", "dynatree")
#: Options each method accepts (anything else is refused, so a typo cannot silently change nothing).
_OPTIONS: Mapping[str, tuple[str, ...]] = {
    "spectr": ("spectr_iterations",),
    "specinfer": ("specinfer_order",),
    "khisti": ("khisti_truncation",),
    "traversal": ("sibling_model",),
}


@dataclass(frozen=True)
class VerifyResult:
    """One verification step's output (docs/algorithms.md section 1, "Output of one verification step").

    ``tokens``: the emitted block, the drafted tokens of the accepted node u* after the root followed by the
    extra (correction or bonus) token; ``accepted_node``: u*'s flattened index; ``accepted_depth``: tau =
    depth(u*), so ``len(tokens) == tau + 1``; ``method``: the method that produced it.
    """

    tokens: tuple[int, ...]
    accepted_node: int
    accepted_depth: int
    method: str

    @property
    def accepted_tokens(self) -> tuple[int, ...]:
        """The accepted drafted tokens (``tokens`` without the extra token)."""
        return self.tokens[:-1]

    @property
    def extra_token(self) -> int:
        """The correction or bonus token (the last emitted token)."""
        return self.tokens[-1]


@dataclass(frozen=True, eq=False)
class TreeProbabilities:
    """The validated per-node distributions of one (tree, target_model) pair, in one arithmetic mode.

    ``target [N]``: p_u ``[V]`` for every node; ``draft [N]``: q_u ``[V]`` or None (no draws, or a
    deterministic tree without q); ``vocab_size``: V; ``exact``: Fraction mode.
    """

    target: tuple[Vector, ...]
    draft: tuple[Vector | None, ...]
    vocab_size: int
    exact: bool


def tree_probabilities(tree: DraftTree, target_model: Model) -> TreeProbabilities:
    """Evaluate ``target_model`` at every node and validate it against the tree.

    Raises ``ValueError`` if ``tree`` is not a :class:`DraftTree`, ``target_model`` is not callable, a target
    vector is malformed, the vocabulary sizes of target and draft disagree, or a drafted token is outside
    the vocabulary.
    """
    if not isinstance(tree, DraftTree):
        raise ValueError(f"tree must be a spec_ref.DraftTree, got {type(tree).__name__}")
    if not callable(target_model):
        raise ValueError(f"target_model must be a function prefix -> probabilities [V], got {target_model!r}")
    raw_target = [target_model(tree.path_tokens(u)) for u in range(tree.num_nodes)]
    exact = any_exact(*raw_target, *[q for q in tree.draft_probs if q is not None])
    target: list[Vector] = []
    vocab: int | None = None
    for u, values in enumerate(raw_target):
        name = f"target_model({tree.path_tokens(u)})"
        vector = probability_vector(values, name, exact=exact, size=vocab)
        vocab = vector.shape[0]
        target.append(vector)
    assert vocab is not None  # the tree has a root
    draft: list[Vector | None] = []
    for u, q in enumerate(tree.draft_probs):
        if q is None:
            draft.append(None)
            continue
        q_arr = to_mode(q, exact, f"tree.draft_probs[{u}]")
        if q_arr.shape != (vocab,):
            raise ValueError(
                f"tree.draft_probs[{u}].shape={q_arr.shape} must be ({vocab},) to match the target vocabulary "
                f"size V={vocab} of target_model"
            )
        draft.append(probability_vector(q_arr, f"tree.draft_probs[{u}]", exact=exact, size=vocab))
    for u in range(1, tree.num_nodes):
        if tree.tokens[u] >= vocab:
            raise ValueError(
                f"tree.tokens[{u}]={tree.tokens[u]} is outside the target vocabulary [0, {vocab}) of target_model"
            )
    return TreeProbabilities(tuple(target), tuple(draft), vocab, exact)


def ot_solver(method: str, options: Mapping[str, Any]) -> Solver:
    """The token-level solver an OT method runs at every node, configured from ``options``."""
    if method == "nss":
        return SOLVERS["nss"]
    if method == "naive_tree":
        return SOLVERS["naive"]
    if method == "spectr":
        iterations = options.get("spectr_iterations", 64)
        if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
            raise ValueError(f"spectr_iterations must be an integer >= 1, got spectr_iterations={iterations!r}")
        return _spectr(iterations)
    if method == "specinfer":
        order = options.get("specinfer_order", "uniform")
        if order not in ("uniform", "draw"):
            raise ValueError(f"specinfer_order must be 'uniform' or 'draw', got specinfer_order={order!r}")
        return _specinfer(order)
    if method == "khisti":
        truncation = options.get("khisti_truncation", 5)
        if isinstance(truncation, bool) or not isinstance(truncation, int) or truncation < 1:
            raise ValueError(f"khisti_truncation must be an integer >= 1, got khisti_truncation={truncation!r}")
        return _khisti(truncation)
    raise ValueError(f"method={method!r} is not an OT method {OT_METHODS}")


def node_plan(solver: Solver, target_probs: Vector, draft_probs: Vector, k: int) -> SolverPlan:
    """``solver.plan(target_probs, draft_probs, k)``, memoised on the values (plans are deterministic).

    SpecTr's bisection and Khisti's pair LPs depend on (p_u, q_u, k) only; the exact enumerator calls a
    verifier thousands of times on the same nodes, so the plan is computed once per distinct input.
    """
    exact = is_exact(target_probs)
    if len(target_probs) > MEMO_MAX_VOCAB:
        return solver.plan(list(target_probs), list(draft_probs), k) if exact else solver.plan(
            np.asarray(target_probs, dtype=np.float64), np.asarray(draft_probs, dtype=np.float64), k)
    return _cached_plan(solver, tuple(target_probs.tolist()), tuple(draft_probs.tolist()), k, exact)


#: Plans over larger vocabularies are not memoised. The key holds two V-tuples of Python numbers and the plan
#: O(V) more, so a full cache of 4096 plans over a real vocabulary (V = 49152) would hold over 10 GB; the
#: enumerator, which is what the memo is for, only runs on small vocabularies.
MEMO_MAX_VOCAB = 1024


@lru_cache(maxsize=4096)
def _cached_plan(solver: Solver, target: tuple[Any, ...], draft: tuple[Any, ...], k: int, exact: bool) -> SolverPlan:
    return solver.plan(list(target), list(draft), k) if exact else solver.plan(np.asarray(target), np.asarray(draft), k)


@lru_cache(maxsize=None)
def _spectr(iterations: int) -> Solver:  # one instance per configuration, so plans memoise across calls
    return SpecTrSolver(iterations)


@lru_cache(maxsize=None)
def _specinfer(order: Literal["uniform", "draw"]) -> Solver:
    return SpecInferSolver(order)


@lru_cache(maxsize=None)
def _khisti(truncation: int) -> Solver:
    return KhistiSolver(truncation)


def check_method(tree: DraftTree, method: Any, options: Mapping[str, Any]) -> str:
    """Validate ``method`` and ``options`` and refuse the lossy (tree process, method) combinations."""
    if not isinstance(tree, DraftTree):
        raise ValueError(f"tree must be a spec_ref.DraftTree, got {type(tree).__name__}")
    if method not in METHODS:
        raise ValueError(f"method={method!r} must be one of {METHODS}")
    allowed = _OPTIONS.get(method, ())
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"option(s) {unknown} do not apply to method={method!r} (it accepts {list(allowed)})")
    if tree.process == "deterministic" and method not in _DETERMINISTIC_OK:
        raise ValueError(
            f"method={method!r} on a process='deterministic' tree is lossy: deterministic (top-k/argmax) drafts "
            f"are not samples from their softmax q (docs/algorithms.md section 2); use one of {_DETERMINISTIC_OK}"
        )
    sibling_model = options.get("sibling_model", "wor")
    if method == "traversal" and sibling_model not in ("wor", "wr"):
        raise ValueError(f"sibling_model must be 'wor' or 'wr', got sibling_model={sibling_model!r}")
    if tree.process == "without_replacement":
        wor_ok = method in ("nss", "greedy", "dynatree") or (method == "traversal" and sibling_model == "wor")
        if not wor_ok:
            raise ValueError(
                f"method={method!r}"
                + (f" with sibling_model={sibling_model!r}" if method == "traversal" else "")
                + " assumes i.i.d. draws but the tree has process='without_replacement' (lossy, docs/testing.md section 0 (item 8)); "
                "use traversal with sibling_model='wor', nss, greedy or dynatree"
            )
    return str(method)


def verify(tree: DraftTree, target_model: Model, method: str, rng: Any, **options: Any) -> VerifyResult:
    """Verify ``tree`` against ``target_model`` with ``method``; return the emitted block.

    ``tree``: the draft tree (q per node, draws in draw order); ``target_model``: prefix -> G(target) [V];
    ``method``: see the module docstring; ``rng``: a ``numpy.random.Generator``, an int seed or a
    :class:`~spec_ref.rng.RandomSource` (may be None for greedy/dynatree). The randomness layout of each
    method is in the module docstring. Raises ``ValueError`` for malformed input and lossy combinations.
    """
    method = check_method(tree, method, options)
    probs = tree_probabilities(tree, target_model)
    if method in GREEDY_METHODS:
        node, token = _greedy(tree, probs) if method == "greedy" else _dynatree(tree, probs)
        return _result(tree, node, token, method)
    source = as_source(rng)
    if method in OT_METHODS:
        node, token = _ot_verify(tree, probs, ot_solver(method, options), source)
    elif method == "naive":
        node, token = _naive_path(tree, probs, source)
    elif method == "bv":
        node, token = _block_verify(tree, probs, source)
    elif method == "tree_mc":
        node, token = _tree_mc(tree, probs, source)
    else:
        node, token = _traversal(tree, probs, options.get("sibling_model", "wor"), source)
    return _result(tree, node, token, method)


def _result(tree: DraftTree, node: int, token: int, method: str) -> VerifyResult:
    tokens = tree.path_tokens(node) + (int(token),)
    return VerifyResult(tokens, node, tree.depths[node], method)


def _one(reference: Vector) -> Any:
    return reference[0] * 0 + 1


def _draft_or_dummy(probs: TreeProbabilities, u: int) -> Vector:
    q = probs.draft[u]
    # A node without q (a deterministic tree, verified with NSS) needs none: NSS ignores the draft.
    return probs.target[u] if q is None else q


# ========================================================================================================
# Section 4: top-down OT driver
# ========================================================================================================
def _ot_verify(tree: DraftTree, probs: TreeProbabilities, solver: Solver, rng: RandomSource) -> tuple[int, int]:
    u = 0
    while True:
        stream = rng.substream(u)
        draws = tree.draws[u]
        if not draws or solver.name == "nss":
            token = stream.categorical(probs.target[u])  # leaf bonus, or NSS's y ~ p_u
        else:
            plan = node_plan(solver, probs.target[u], _draft_or_dummy(probs, u), len(draws))
            token = solver.sample_planned(plan, draws, stream)
        if not draws:
            return u, token
        child = tree.child(u, token)
        if child is None:
            return u, token  # the correction token
        u = child  # accepted or residual-sampled: either way the child is reached (docs/algorithms.md section 4)


# ========================================================================================================
# Section 5: single-path methods on path 0
# ========================================================================================================
def path_zero(tree: DraftTree) -> tuple[int, ...]:
    """Node indices of path 0: from the root, follow the first draw ``draws[u][0]`` while there is one."""
    nodes = [0]
    while tree.draws[nodes[-1]]:
        child = tree.child(nodes[-1], tree.draws[nodes[-1]][0])
        assert child is not None  # DraftTree guarantees a child for every drawn token
        nodes.append(child)
    return tuple(nodes)


def _capped_ratio(numerator: Any, denominator: Any, one: Any) -> Any:
    """``min(1, numerator / denominator)`` for ``denominator > 0`` without dividing when the ratio would
    reach 1: a subnormal draft probability (5e-324) would otherwise overflow the quotient to inf (and a
    0 * inf later to NaN)."""
    return one if numerator >= denominator else numerator / denominator


def _path_q(probs: TreeProbabilities, node: int) -> Vector:
    q = probs.draft[node]
    assert q is not None  # refused deterministic trees are the only ones with draws but no q
    return q


def _naive_path(tree: DraftTree, probs: TreeProbabilities, rng: RandomSource) -> tuple[int, int]:
    nodes = path_zero(tree)
    for i in range(1, len(nodes)):
        parent, token = nodes[i - 1], tree.tokens[nodes[i]]
        stream = rng.substream(parent)
        p, q = probs.target[parent], _path_q(probs, parent)
        if not accept(stream.uniform(), q[token], p[token]):
            return parent, stream.categorical(residual(p, q))
    leaf = nodes[-1]
    return leaf, rng.substream(leaf).categorical(probs.target[leaf])


def bv_acceptances(tree: DraftTree, probs: TreeProbabilities) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """Block verification's prefix weights ``(w_0..w_L)`` and node acceptances ``(h_1..h_L)`` on path 0.

    docs/algorithms.md section 5.2: ``w_i = min(1, w_{i-1} p_{i-1}(x_i)/q_{i-1}(x_i))``; for i < L, ``h_i = Z_i/D_i`` with
    ``Z_i = sum (w_i p_i - q_i)_+``, ``D_i = Z_i + (1 - w_i)`` (1 if D_i = 0); ``h_L = w_L``. The tuples
    are indexed so that ``h[i - 1]`` is h_i.
    """
    nodes = path_zero(tree)
    length = len(nodes) - 1
    one = _one(probs.target[0])
    weights: list[Any] = [one]
    for i in range(1, length + 1):
        parent, token = nodes[i - 1], tree.tokens[nodes[i]]
        p, q = probs.target[parent], _path_q(probs, parent)
        weights.append(_capped_ratio(weights[-1] * p[token], q[token], one))
    h: list[Any] = []
    for i in range(1, length):
        p, q = probs.target[nodes[i]], _path_q(probs, nodes[i])
        z = positive_part(weights[i] * p - q).sum()
        d = z + (one - weights[i])
        h.append(z / d if d > 0 else one)
    if length:
        h.append(weights[length])
    return tuple(weights), tuple(h)


def _block_verify(tree: DraftTree, probs: TreeProbabilities, rng: RandomSource) -> tuple[int, int]:
    nodes = path_zero(tree)
    length = len(nodes) - 1
    weights, h = bv_acceptances(tree, probs)
    tau = 0
    for i in range(length, 0, -1):  # deepest first; stop at the first acceptance (tau = largest accepted)
        if rng.substream(nodes[i]).uniform() < h[i - 1]:
            tau = i
            break
    node = nodes[tau]
    stream = rng.substream(node)
    if tau == length:
        return node, stream.categorical(probs.target[node])
    # w_0 = 1 gives the standard residual at tau = 0; zero residual mass (probability 0) falls back to p_tau.
    return node, stream.categorical(residual(weights[tau] * probs.target[node], _path_q(probs, node)))


def _tree_mc(tree: DraftTree, probs: TreeProbabilities, rng: RandomSource) -> tuple[int, int]:
    nodes = path_zero(tree)
    length = len(nodes) - 1
    stream = rng.substream(0)
    if length == 0:
        return 0, stream.categorical(probs.target[0])
    vocab = probs.vocab_size
    one = _one(probs.target[0])
    cells = np.empty((length, vocab), dtype=object if probs.exact else np.float64)
    cells[...] = one * 0
    s_prev: Any = one
    for j in range(1, length + 1):  # row j-1 of ``cells`` is the code's row j
        parent, token = nodes[j - 1], tree.tokens[nodes[j]]
        p, q = probs.target[parent], _path_q(probs, parent)
        if j >= 2:
            cells[j - 2, tree.tokens[nodes[j - 1]]] = one * 0  # "accept x_{j-1} and stop" is not an outcome
        excess = positive_part(q - s_prev * p).sum()
        s_j = _capped_ratio(s_prev * p[token], q[token], one)
        scale = (one - s_j) / excess if excess > 0 else one
        cells = cells * scale  # rescale every earlier row
        cells[j - 1, :] = scale * positive_part(s_prev * p - q)
        cells[j - 1, token] = s_j  # survives only for j = L ("accept all")
        s_prev = s_j
    index = stream.categorical(cells.reshape(-1))
    row, value = divmod(index, vocab)
    if row == length - 1 and value == tree.tokens[nodes[length]]:
        leaf = nodes[length]
        return leaf, stream.categorical(probs.target[leaf])  # fully coupled: bonus from the target
    return nodes[row], value


# ========================================================================================================
# Section 6: Traversal verification
# ========================================================================================================
def _traversal(tree: DraftTree, probs: TreeProbabilities, sibling_model: str, rng: RandomSource) -> tuple[int, int]:
    n = tree.num_nodes
    one = _one(probs.target[0])
    zero = one * 0
    weight: list[Any] = [one] * n
    current_target: list[Vector] = [p.copy() for p in probs.target]
    current_draft: list[Vector | None] = [None if q is None else q.copy() for q in probs.draft]
    # Rounds (6.3): WOR = distinct children in first-appearance order; WR = every draw, later copies are dups.
    rounds: list[list[tuple[int, bool]]] = []
    for u in range(n):
        seen: set[int] = set()
        entries: list[tuple[int, bool]] = []
        for token in tree.draws[u]:
            child = tree.child(u, token)
            assert child is not None
            if token in seen:
                if sibling_model == "wr":
                    entries.append((child, True))
                continue
            seen.add(token)
            entries.append((child, False))
        rounds.append(entries)

    def child_weight(u: int, token: int) -> Any:
        q = current_draft[u]
        assert q is not None
        if not q[token] > 0:
            return zero
        return _capped_ratio(weight[u] * current_target[u][token], q[token], one)

    def refresh(u: int) -> None:  # the remaining subtrees below u are pristine: recompute their weights
        for child, dup in rounds[u]:
            if not dup:
                weight[child] = child_weight(u, tree.tokens[child])
                refresh(child)

    def reject(u: int, token: int) -> None:  # one of u's rounds failed
        q = current_draft[u]
        assert q is not None
        mass = positive_part(weight[u] * current_target[u] - q)
        z = mass.sum()
        d = z + (one - weight[u])
        updated = z / d if d > 0 else one  # w <- Z/(Z + 1 - w) with the CURRENT w (6.2, 6.4 pitfall 2)
        weight[u] = updated if updated < 1 else one
        if z > 0:
            current_target[u] = mass / z
        if sibling_model == "wor":
            q = q.copy()
            q[token] = zero
            total = q.sum()
            if total > 0:
                q = q / total
            current_draft[u] = q
        refresh(u)

    for u in range(1, n):  # initial weights top-down (6.1): ancestors first
        weight[u] = child_weight(tree.parents[u], tree.tokens[u])
    while True:
        u = 0  # the first leaf in post-order: always descend into the FIRST remaining round
        while rounds[u]:
            child, dup = rounds[u][0]
            if dup:  # WR duplicate: automatic rejection (P_u(x) = 0 after x's rejection), no draw
                rounds[u].pop(0)
                reject(u, tree.tokens[child])
                continue
            u = child
        stream = rng.substream(u)
        if u == 0:
            return 0, stream.categorical(current_target[0])  # the root is always accepted
        if stream.uniform() < weight[u]:
            return u, stream.categorical(current_target[u])
        parent = tree.parents[u]
        rounds[parent].pop(0)
        reject(parent, tree.tokens[u])


# ========================================================================================================
# Section 8: greedy rules
# ========================================================================================================
def greedy_argmax(values: Vector) -> int:
    """``argmax`` with ties broken by the lowest token id (``np.argmax`` semantics, in either mode)."""
    best = 0
    for token in range(1, values.shape[0]):
        if values[token] > values[best]:
            best = token
    return best


def _greedy(tree: DraftTree, probs: TreeProbabilities) -> tuple[int, int]:
    u = 0
    while True:
        token = greedy_argmax(probs.target[u])
        child = tree.child(u, token)
        if child is None:
            return u, token
        u = child


def _dynatree(tree: DraftTree, probs: TreeProbabilities) -> tuple[int, int]:
    # SELECTCOMMIT (seed 003 Algorithm 1): first = argmax s_last; the longest path whose root token is
    # ``first`` and whose every edge u -> v has token(v) = yhat[pos(u)]; then the bonus yhat[pos(last)].
    # The tree's depth-1 nodes are DynaTree's candidate root tokens (u_0). Children are merged by token, so
    # the greedy-consistent path is unique and the "longest" search is a walk.
    first = greedy_argmax(probs.target[0])
    start = tree.child(0, first)
    if start is None:
        return 0, first  # P is empty: commit [first]
    u = start
    while True:
        predicted = greedy_argmax(probs.target[u])
        child = tree.child(u, predicted)
        if child is None:
            return u, predicted  # bonus yhat[pos(last(P))]
        u = child
