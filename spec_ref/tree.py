"""The draft-tree type shared by drafting, tensorisation and every verifier (docs/algorithms.md section 1).

A :class:`DraftTree` is flattened in *ancestors-first* order: node 0 is the root r (the context whose next
token is being decided; its token is ``-1``), and ``parents[i] < i`` for every other node. Node ``i`` is the
prefix ``path_tokens(i)`` (the drafted tokens after the root).

At each node u:

* ``draws[u]`` is the ordered list of draws made at u (draw order, with multiplicity: D_u). Children are
  merged by token: every distinct token of ``draws[u]`` has exactly one child node with that token, and
  every child's token appears in ``draws[u]``.
* ``draft_probs[u]`` is q_u, the distribution u's draws were *actually sampled* from (``None`` when u has no
  draws, or on a deterministic tree where q_u is a point mass at each drafted token).
* ``process`` says how the draws were made: ``"iid"`` (i.i.d. from q_u, the default), ``"deterministic"``
  (argmax/top-k expansion: q_u is a point mass at each drafted token, sibling tokens are distinct, and the
  only lossless sampling verifier is NSS, docs/algorithms.md section 2) or ``"without_replacement"`` (distinct
  siblings sampled successively without replacement: lossy under any i.i.d. verifier, docs/testing.md section 0 (item 8);
  verifiers must refuse it unless they are built for it).

Target and draft distributions are given by *models*: functions ``prefix (tuple of token ids after the
root) -> probabilities [V]``, so tests can use context-dependent tables.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from spec_ref._validate import Vector, probability_vector

__all__ = ["DraftTree", "Model", "PROCESSES"]

#: How a tree's draws were made (see the module docstring).
PROCESSES = ("iid", "deterministic", "without_replacement")

#: A model maps a prefix (token ids after the root) to a next-token distribution [V].
Model = Callable[[tuple[int, ...]], Any]


def path_tokens(tokens: Sequence[int], parents: Sequence[int], node: int) -> tuple[int, ...]:
    """The tokens from the root (node 0, excluded) down to ``node`` of a flattened tree."""
    out: list[int] = []
    while node > 0:
        out.append(tokens[node])
        node = parents[node]
    return tuple(reversed(out))


@dataclass(frozen=True, eq=False)
class DraftTree:
    """A draft tree in ancestors-first order (module docstring). Validated on construction.

    ``tokens [N]`` (root: -1), ``parents [N]`` (root: -1), ``draws`` (N ordered tuples),
    ``draft_probs`` (N vectors [V] or None), ``deterministic``.
    """

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    draws: tuple[tuple[int, ...], ...]
    draft_probs: tuple[Vector | None, ...]
    process: str = "iid"
    depths: tuple[int, ...] = field(init=False)
    children: tuple[dict[int, int], ...] = field(init=False)

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if self.process not in PROCESSES:
            raise ValueError(f"process={self.process!r} must be one of {PROCESSES}")
        if n == 0:
            raise ValueError("a DraftTree needs at least the root node, got tokens=()")
        for name, seq in (("parents", self.parents), ("draws", self.draws), ("draft_probs", self.draft_probs)):
            if len(seq) != n:
                raise ValueError(f"len({name})={len(seq)} must equal len(tokens)={n}")
        if self.parents[0] != -1 or self.tokens[0] != -1:
            raise ValueError(
                f"node 0 must be the root with parents[0]=-1 and tokens[0]=-1, got "
                f"parents[0]={self.parents[0]}, tokens[0]={self.tokens[0]}"
            )
        depths = [0] * n
        children: list[dict[int, int]] = [{} for _ in range(n)]
        for i in range(1, n):
            parent = self.parents[i]
            if not 0 <= parent < i:
                raise ValueError(
                    f"parents[{i}]={parent} must be an earlier node (0 <= parent < {i}): the order must list "
                    "ancestors first (this also rules out cycles)"
                )
            if self.tokens[i] < 0:
                raise ValueError(f"tokens[{i}]={self.tokens[i]} must be a token id >= 0")
            if self.tokens[i] in children[parent]:
                raise ValueError(
                    f"nodes {children[parent][self.tokens[i]]} and {i} are both children of {parent} with token "
                    f"{self.tokens[i]}: children must be merged by token"
                )
            children[parent][self.tokens[i]] = i
            depths[i] = depths[parent] + 1
        for u in range(n):
            distinct = set(self.draws[u])
            if distinct != set(children[u]):
                raise ValueError(
                    f"draws[{u}]={self.draws[u]} must list exactly the child tokens {sorted(children[u])} of node {u}"
                )
            if self.process != "iid" and len(distinct) != len(self.draws[u]):
                raise ValueError(f"draws[{u}]={self.draws[u]} repeats a token on a {self.process} tree")
            q = self.draft_probs[u]
            if q is not None:
                for t in self.draws[u]:
                    if not 0 <= t < len(q) or not q[t] > 0:
                        raise ValueError(
                            f"draws[{u}] holds token {t} with draft_probs[{u}][{t}]="
                            f"{q[t] if 0 <= t < len(q) else 'out of range'}; drafted tokens need q > 0"
                        )
            elif self.draws[u] and not self.deterministic:
                raise ValueError(f"node {u} has draws {self.draws[u]} but draft_probs[{u}] is None on a sampled tree")
        object.__setattr__(self, "depths", tuple(depths))
        object.__setattr__(self, "children", tuple(children))

    # ----- structure ---------------------------------------------------------------------------------
    @property
    def deterministic(self) -> bool:
        return self.process == "deterministic"

    @property
    def num_nodes(self) -> int:
        return len(self.tokens)

    @property
    def max_depth(self) -> int:
        return max(self.depths)

    def path_tokens(self, node: int) -> tuple[int, ...]:
        """The drafted tokens from the root down to ``node`` (the node's prefix after the root)."""
        return path_tokens(self.tokens, self.parents, node)

    def path_nodes(self, node: int) -> tuple[int, ...]:
        """Node indices from the root (0) down to ``node``, inclusive."""
        out: list[int] = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return tuple(reversed(out))

    def child(self, node: int, token: int) -> int | None:
        """The child of ``node`` with ``token``, or None."""
        return self.children[node].get(token)

    def leaves(self) -> tuple[int, ...]:
        return tuple(u for u in range(self.num_nodes) if not self.children[u])

    # ----- constructors ------------------------------------------------------------------------------
    @staticmethod
    def from_paths(
        paths: Sequence[Sequence[int]],
        draft_model: Model,
    ) -> DraftTree:
        """Build the merged tree of K sampled paths (draw order = path index order, docs/algorithms.md section 1).

        Nodes are numbered in DFS pre-order with children in first-appearance order, so ancestors come
        first. ``draft_probs[u] = draft_model(prefix(u))`` for every node with draws.
        """
        root_prefix: tuple[int, ...] = ()
        # prefix -> ordered draws
        draws_of: dict[tuple[int, ...], list[int]] = {root_prefix: []}
        for path in paths:
            prefix: tuple[int, ...] = ()
            for token in path:
                draws_of[prefix].append(int(token))
                prefix = prefix + (int(token),)
                if prefix not in draws_of:
                    draws_of[prefix] = []
        # DFS pre-order, children in first-appearance order
        order: list[tuple[int, ...]] = []

        def visit(prefix: tuple[int, ...]) -> None:
            order.append(prefix)
            seen: list[int] = []
            for t in draws_of[prefix]:
                if t not in seen:
                    seen.append(t)
            for t in seen:
                visit(prefix + (t,))

        visit(root_prefix)
        index = {prefix: i for i, prefix in enumerate(order)}
        tokens = tuple(-1 if not pre else pre[-1] for pre in order)
        parents = tuple(-1 if not pre else index[pre[:-1]] for pre in order)
        draws = tuple(tuple(draws_of[pre]) for pre in order)
        probs = tuple(
            probability_vector(draft_model(pre), f"draft_model({pre})") if draws_of[pre] else None for pre in order
        )
        return DraftTree(tokens, parents, draws, probs)

    def __repr__(self) -> str:
        return f"DraftTree(N={self.num_nodes}, depth={self.max_depth}, {self.process}, draws={self.draws})"

