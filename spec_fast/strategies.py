"""Decoding strategies: tree shapes, how the drafter fills them, and which verifier checks them.

A :class:`Strategy` names a tree shape and a verifier:

=============  ===========================================  =========================================
``shape``      tree                                         verifiers (sampling; greedy always works)
=============  ===========================================  =========================================
``ar``         no draft: plain autoregressive decoding      --
``chain``      one path of ``depth`` draft tokens           ``naive`` (default), ``bv``, ``traversal``
``iid``        ``K`` i.i.d. paths of ``depth`` tokens       ``specinfer`` (default), ``naive_tree``,
               (merged by token, draw order kept)           ``nss``, ``spectr``, ``khisti``, ``traversal``
``delayed``    trunk of ``L1`` tokens, then ``K`` i.i.d.    same as ``iid``
               branches of ``L2`` tokens (seed 002 (docs/papers.md) Def 5.2)
``topk``       deterministic budgeted top-k tree (EAGLE-2;  ``nss`` (the only lossless sampling choice,
               same rule as :func:`spec_ref.draft_topk_tree`) docs/algorithms.md section 2)
``nde``        a delayed tree per step, its (K, L1, L2)      ``specinfer`` (default), ``spectr``,
               chosen by the NDE selector (seed 002           ``khisti``, ``naive_tree``, ``nss``
               (docs/papers.md) section 6; spec_fast.nde)
``dynatree``   DynaTree adaptive tree (breadth by draft      ``nss``; greedy commit at T = 0
               confidence, depth gating, probability
               pruning, history adjustment; the decisions
               of :func:`spec_ref.draft_dynatree`)
=============  ===========================================  =========================================

At temperature 0 every strategy is verified by the exact greedy rule (docs/algorithms.md section 8); with
``iid``/``delayed`` shapes the draft then samples its paths from ``softmax(draft logits)`` (the draft law
is irrelevant to greedy verification), a ``chain`` follows the draft's argmax.

``+adaptive`` after any drafting strategy (``chain:3+adaptive``) lets the engine fall back to plain
decoding steps while speculation does not pay (measured tokens per second of speculative steps vs plain
steps, re-probed every few steps); both kinds of steps are exact, so the output law is unchanged.

Strings accepted by :func:`parse_strategy` (CLI ``--strategy``): ``ar``, ``chain:L``, ``iid:KxL``,
``delayed:K,L1,L2``, ``nde`` or ``nde:VERIFIER``, ``topk:DEPTH,K,BUDGET``, ``dynatree`` or ``dynatree:D0,DMAX,BUDGET``
(seed depths as in seed 003: the DraftTree depth is ``DMAX + 1``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: parsing a strategy must not pull in spec_ref's SciPy solvers
    from spec_ref.dynatree import DynaTreeParams

__all__ = ["Strategy", "parse_strategy", "SAMPLING_VERIFIERS", "DEFAULT_STRATEGY", "DEFAULT_UNTRAINED_STRATEGY"]

#: Verifiers that each shape accepts at temperature > 0.
SAMPLING_VERIFIERS: dict[str, tuple[str, ...]] = {
    "ar": (),
    "chain": ("naive", "bv", "traversal", "nss"),
    "iid": ("specinfer", "naive_tree", "nss", "spectr", "khisti", "traversal"),
    "delayed": ("specinfer", "naive_tree", "nss", "spectr", "khisti", "traversal"),
    "topk": ("nss",),
    "dynatree": ("nss",),
    "nde": ("specinfer", "spectr", "khisti", "naive_tree", "nss"),
}
#: The NDE action space bounds of seed 002 eq. (8): K <= 4, L1 <= 8, L2 <= 8 (an ``nde`` strategy holds them
#: as ``num_paths``, ``trunk`` and ``depth - trunk``, its largest tree).
NDE_BOUNDS = (4, 8, 8)
#: Trees larger than this are refused (per prompt; the engine allocates ``[B, N, V]`` tensors).
MAX_TREE_NODES = 1024
#: The vocabulary and the per-(node, token) bytes the size error's memory estimate assumes (SmolLM2's V;
#: float32 p and q, and the decoding operator's sort order and float64 softmax for every node).
ESTIMATE_VOCAB = 49152
BYTES_PER_NODE_AND_TOKEN = 32
_DEFAULT_VERIFIER = {
    "ar": "greedy", "chain": "naive", "iid": "specinfer", "delayed": "specinfer", "topk": "nss", "dynatree": "nss",
    "nde": "specinfer",
}

#: The CLI default with a trained or retrieval draft. ``chain:2`` is the fastest greedy shape on prompts
#: like the drafts' held-out set (bench/results/drafts.md) but slower than plain decoding on chat prompts
#: (0.80x with the retrieval draft, bench/results/defaults.md); ``+adaptive`` keeps the gain where drafts
#: are accepted (input-grounded prompts) and falls back to plain steps where they are not: the best
#: worst case over the chat, input-grounded and long workloads there.
DEFAULT_STRATEGY = "chain:2+adaptive"
#: The CLI default with any other draft (early exit, HF model): ``+adaptive`` falls back to plain steps
#: where drafting does not pay, as with the untrained early-exit draft (bench/results/engine.md).
DEFAULT_UNTRAINED_STRATEGY = "chain:2+adaptive"


@dataclass(frozen=True)
class Strategy:
    """A tree shape plus a sampling verifier (greedy verification is used at temperature 0).

    ``num_paths`` K, ``trunk`` L1, ``depth`` total depth L (= L1 + L2 for delayed trees), ``top_k`` and
    ``budget`` for ``topk`` trees.
    """

    shape: str = "chain"
    depth: int = 4
    num_paths: int = 1
    trunk: int = 0
    top_k: int = 0
    budget: int = 0
    verifier: str = ""
    adaptive: bool = False

    def __post_init__(self) -> None:
        if self.shape not in SAMPLING_VERIFIERS:
            raise ValueError(f"shape must be one of {sorted(SAMPLING_VERIFIERS)}, got shape={self.shape!r}")
        for name in ("depth", "num_paths", "trunk", "top_k", "budget"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {name}={value!r}")
        if self.shape != "ar" and self.depth < 1:
            raise ValueError(f"depth must be >= 1 for shape {self.shape!r}, got depth={self.depth}")
        if self.shape in ("iid", "delayed") and self.num_paths < 1:
            raise ValueError(f"num_paths must be >= 1, got num_paths={self.num_paths}")
        if self.shape == "delayed" and not self.trunk < self.depth:
            raise ValueError(f"trunk must be < depth, got trunk={self.trunk}, depth={self.depth}")
        if self.shape == "nde" and self.adaptive:
            raise ValueError("strategy 'nde' chooses every step's tree itself; '+adaptive' does not apply to it")
        if self.shape == "dynatree":
            self.dynatree_params()  # validates D0 < DMAX and the budget
        if self.shape == "topk" and (self.top_k < 1 or self.budget < 1):
            raise ValueError(f"topk trees need top_k >= 1 and budget >= 1, got {self.top_k}, {self.budget}")
        verifier = self.verifier or _DEFAULT_VERIFIER[self.shape]
        if verifier != "greedy" and verifier not in SAMPLING_VERIFIERS[self.shape]:
            raise ValueError(
                f"verifier {verifier!r} is not valid for shape {self.shape!r}; "
                f"choose from {('greedy',) + SAMPLING_VERIFIERS[self.shape]}"
            )
        object.__setattr__(self, "verifier", verifier)
        nodes = self.max_nodes
        if nodes > MAX_TREE_NODES:
            # checked before anything is allocated: the verifier holds p and q for every node ([B, N, V]
            # float32 each) and the decoding operator's float64 sort/softmax temporaries on top
            gib = nodes * ESTIMATE_VOCAB * BYTES_PER_NODE_AND_TOKEN / 2**30
            raise ValueError(
                f"strategy {self._label()!r} has {nodes} nodes per tree, more than {MAX_TREE_NODES}; it would need "
                f"about {gib:.1f} GiB per prompt at V={ESTIMATE_VOCAB} ({BYTES_PER_NODE_AND_TOKEN} bytes per node "
                "and vocabulary entry); use fewer paths or a shallower tree"
            )

    @property
    def max_nodes(self) -> int:
        """The most nodes (root included) one tree of this strategy can have."""
        if self.shape == "ar":
            return 1
        if self.shape == "chain":
            return 1 + self.depth
        if self.shape == "iid":
            return 1 + self.num_paths * self.depth
        if self.shape in ("delayed", "nde"):
            return 1 + self.trunk + self.num_paths * (self.depth - self.trunk)
        return 1 + self.budget  # topk and dynatree: the node budget

    def dynatree_params(self) -> DynaTreeParams:
        """The DynaTree parameters (seed 003 defaults; ``trunk`` = D0, ``depth - 1`` = DMAX, ``budget``)."""
        from spec_ref.dynatree import DynaTreeParams

        return DynaTreeParams(base_depth=self.trunk, max_depth=self.depth - 1, node_budget=self.budget)

    @property
    def drafts(self) -> bool:
        return self.shape != "ar"

    @property
    def process(self) -> str:
        return "deterministic" if self.shape in ("topk", "dynatree") else "iid"

    def label(self) -> str:
        return self._label() + ("+adaptive" if self.adaptive else "")

    def _label(self) -> str:
        if self.shape == "ar":
            return "ar"
        if self.shape == "chain":
            return f"chain:{self.depth}/{self.verifier}"
        if self.shape == "iid":
            return f"iid:{self.num_paths}x{self.depth}/{self.verifier}"
        if self.shape == "delayed":
            return f"delayed:{self.num_paths},{self.trunk},{self.depth - self.trunk}/{self.verifier}"
        if self.shape == "nde":
            return f"nde/{self.verifier}"
        if self.shape == "dynatree":
            return f"dynatree:{self.trunk},{self.depth - 1},{self.budget}/{self.verifier}"
        return f"topk:{self.depth},{self.top_k},{self.budget}/{self.verifier}"


def _ints(text: str, sep: str, count: int, spec: str) -> list[int]:
    parts = text.split(sep)
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"strategy {spec!r}: expected {count} integers separated by {sep!r}") from None
    if len(values) != count:
        raise ValueError(f"strategy {spec!r}: expected {count} integers separated by {sep!r}")
    return values


def parse_strategy(spec: str, verifier: str | None = None) -> Strategy:
    """``ar`` | ``chain:L`` | ``iid:KxL`` | ``delayed:K,L1,L2`` | ``topk:DEPTH,K,BUDGET`` -> :class:`Strategy`."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"strategy must be a non-empty string, got strategy={spec!r}")
    if spec.endswith("+adaptive"):
        base = parse_strategy(spec[: -len("+adaptive")], verifier)
        if not base.drafts:
            raise ValueError(f"strategy {spec!r}: '+adaptive' needs a drafting strategy")
        return Strategy(base.shape, base.depth, base.num_paths, base.trunk, base.top_k, base.budget, base.verifier, True)
    shape, _, args = spec.partition(":")
    v = verifier or ""
    if shape == "ar":
        return Strategy(shape="ar", depth=0, verifier="greedy")
    if shape == "chain":
        (depth,) = _ints(args or "4", ",", 1, spec)
        return Strategy(shape="chain", depth=depth, num_paths=1, verifier=v)
    if shape == "iid":
        k, depth = _ints(args or "2x4", "x", 2, spec)
        return Strategy(shape="iid", depth=depth, num_paths=k, verifier=v)
    if shape == "delayed":
        k, l1, l2 = _ints(args or "2,2,2", ",", 3, spec)
        if l2 < 1:
            raise ValueError(f"strategy {spec!r}: L2 must be >= 1")
        return Strategy(shape="delayed", depth=l1 + l2, num_paths=k, trunk=l1, verifier=v)
    if shape == "nde":
        if args and verifier and args != verifier:
            raise ValueError(f"strategy {spec!r} names verifier {args!r} but verifier={verifier!r} was given")
        k_max, l1_max, l2_max = NDE_BOUNDS
        return Strategy(shape="nde", depth=l1_max + l2_max, num_paths=k_max, trunk=l1_max, verifier=args or v)
    if shape == "topk":
        depth, k, budget = _ints(args or "4,2,8", ",", 3, spec)
        return Strategy(shape="topk", depth=depth, top_k=k, budget=budget, verifier=v)
    if shape == "dynatree":
        d0, dmax, budget = _ints(args or "5,8,64", ",", 3, spec)
        if not 1 <= d0 < dmax:
            raise ValueError(f"strategy {spec!r}: need 1 <= D0 < DMAX")
        return Strategy(shape="dynatree", depth=dmax + 1, trunk=d0, budget=budget, verifier=v)
    raise ValueError(
        f"unknown strategy {spec!r}; use ar, chain:L, iid:KxL, delayed:K,L1,L2, nde[:VERIFIER], topk:DEPTH,K,BUDGET or dynatree"
    )
