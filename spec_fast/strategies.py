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

DynaTree parameters (seed 003 (docs/papers.md) Algorithm 1; :class:`spec_ref.dynatree.DynaTreeParams`)
follow the three positional numbers, or replace them, as comma-separated ``key=value`` pairs::

    dynatree:5,8,64,tau_high=0.8,tau_low=0.3
    dynatree:d0=5,dmax=8,budget=64,prune=0.01,window=8,high_acceptance=0.7

=====================  ===================  =========  ==============================================
key (alias)            seed 003 symbol      default    meaning
=====================  ===================  =========  ==============================================
``base_depth`` (d0)    D_0                  5          base depth; deeper only above ``rho_deep``
``max_depth`` (dmax)   D_max                8          hard depth limit (seed depth, u0 at 0)
``node_budget``        N_max                64         drafted nodes per tree, u0 included
(``budget``)
``branch_min``,        B_min, B_mid, B_max  1, 2, 3    children of a node at confidence >= tau_high,
``branch_mid``,                                        between, < tau_low
``branch_max``
``tau_high``,          tau_h, tau_l         0.9, 0.4   draft-confidence thresholds
``tau_low``
``rho_stop``,          rho_stop, rho_deep   0.01, 0.3  early stop / deep expansion on the path
``rho_deep``                                           probability p(u)
``prune_threshold``    tau                  0.005      a child with p(v) < tau is not drafted
(``prune``)
``window``             W                    4          history window (iterations)
``high_acceptance``,   --                   0.8, 0.3   window-mean acceptance at which the history
``low_acceptance``                                     adjustment turns aggressive / conservative
``threshold_step``,    --                   0.05, 1    how far it moves tau_h and tau_l / D_0
``depth_step``
=====================  ===================  =========  ==============================================

The seed fixes D_0, D_max, the branch bounds and the confidence thresholds (its appendix A) and leaves
the rest, including the history schedule, open; :mod:`spec_ref.dynatree` states the choices made here.
Every value is checked (``ValueError`` naming the key); a key given twice (also via its alias) is refused.
In Python, :meth:`Strategy.for_dynatree` builds the same strategy from a ``DynaTreeParams``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:  # imported where used: parsing a strategy must not pull in spec_ref's SciPy solvers
    from spec_ref.dynatree import DynaTreeParams

__all__ = ["Strategy", "parse_strategy", "SAMPLING_VERIFIERS", "DEFAULT_STRATEGY", "DEFAULT_RETRIEVAL_STRATEGY",
           "DEFAULT_SAMPLED_STRATEGY", "DEFAULT_UNTRAINED_STRATEGY"]

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
#: DynaTree keys of the strategy string besides the three structural ones (DynaTreeParams fields and the
#: history window), with their type; aliases map to the canonical key.
DYNATREE_INT_KEYS = ("branch_min", "branch_mid", "branch_max", "depth_step", "window")
DYNATREE_REAL_KEYS = ("tau_low", "tau_high", "rho_stop", "rho_deep", "prune_threshold", "high_acceptance",
                      "low_acceptance", "threshold_step")
DYNATREE_STRUCTURAL_KEYS = ("base_depth", "max_depth", "node_budget")
DYNATREE_ALIASES = {"d0": "base_depth", "dmax": "max_depth", "budget": "node_budget", "prune": "prune_threshold"}
#: The history window when none is given (spec_ref.dynatree.DynaTreeHistory's default).
DEFAULT_DYNATREE_WINDOW = 4
#: One DynaTree option value.
DynaTreeValue = Union[int, float]
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

#: The CLI default with a trained or retrieval draft: the best worst case over the chat, input-grounded and
#: long workloads of bench/results/defaults.md (tests/engine/test_api.py keeps the two equal), measured on
#: the default target (the GGUF blocks) at 932bf7d: ``chain:1`` ran at 0.92x / 1.09x / 1.04x plain decoding
#: there, ``chain:2`` at 0.85x / 1.13x / 1.04x. No speculative configuration beat plain decoding on chat:
#: the retrieval draft commits 1.3-1.4 tokens per pass there, while a speculative step costs about 1.5x a
#: plain one (a 2-token pass 1.15x a one-token pass, and ~3.7 ms of drafting, verification and commit on a
#: ~15 ms pass), so every extra drafted token widens the loss; ``+adaptive`` did not recover it within a
#: 48-token reply (0.89x).
DEFAULT_STRATEGY = "chain:1"
#: The CLI default with the retrieval draft alone, greedy: a chain of up to 2 tokens that goes past its first
#: token only where the row's earlier drafts behind such matches were mostly accepted
#: (:data:`spec_fast.drafts.retrieval.PATH_ACCEPTANCE`). Its first token rides on a pass over 2 tokens, which
#: costs about 1.11x a one-token pass on the Zen 4 machine of bench/results/pass_width_shared/pass_width.md.
#: Chosen by bench/results/defaults.md at c2758f9 (8 chat, 4 input-grounded and 4 long tuning prompts x 96
#: tokens; chat / input-grounded / long): ``chain:1`` 1.16x / 1.31x / 1.07x plain, ``chain:2`` 1.17x / 1.45x /
#: 1.10x, ``chain:4`` 1.13x / 1.47x / 1.13x, ``chain:8`` 1.11x / 1.53x / 1.17x: the three deeper chains are
#: within the noise of each other in the worst case and in the geometric mean (1.23, 1.23, 1.26), so the rule
#: takes the first listed. At 7cef297, before greedy chains were drafted, verified and committed on the host,
#: ``chain:8`` had won (1.01x / 1.39x / 1.20x; bench/results/defaults_7cef297/defaults.md), and at cc23301
#: ``chain:4`` (bench/results/defaults_cc23301/defaults.md). The rule (tests/engine/test_api.py): among the
#: configurations whose slowest workload is within 0.03 (the spread of repeated runs) of the best such, plain
#: decoding included, the highest geometric mean, means within 0.03 tying to the one listed first. Sampled,
#: deep chains gained nothing (scratch, tuning prompts: input-grounded 1.02x against 1.03x for ``chain:1``), so
#: sampling keeps :data:`DEFAULT_SAMPLED_STRATEGY`.
DEFAULT_RETRIEVAL_STRATEGY = "chain:2"
#: The CLI default with a trained or retrieval draft named at temperature > 0 (with none named, sampling
#: decodes plain: :data:`spec_fast.settings.DEFAULT_SAMPLED_DRAFT`): the best speculative worst case of
#: bench/results/defaults_sampled_9c34e49/ (chat and input-grounded prompts at T = 0.7), ``chain:1`` at
#: 0.92x / 1.02x plain decoding (``chain:1+adaptive`` 0.89x / 0.93x, ``chain:3`` 0.86x / 0.91x); at 208158e
#: (bench/results/defaults_sampled.md) 0.97x / 1.03x, ``chain:1+adaptive`` 1.03x / 1.01x, which decodes sampled
#: rows exactly as ``chain:1`` (``+adaptive`` steers greedy rows only), so their gap is the run's noise.
#: Sampled, a retrieval draft's proposal is accepted with the target's probability of it (1.29 tokens per pass
#: on chat for ``chain:1``), and longer chains gained nothing.
DEFAULT_SAMPLED_STRATEGY = "chain:1"
#: The CLI default with any other draft (early exit, HF model): ``+adaptive`` falls back to plain steps
#: where drafting does not pay, as with the untrained early-exit draft (bench/results/engine.md).
DEFAULT_UNTRAINED_STRATEGY = "chain:2+adaptive"


@dataclass(frozen=True)
class Strategy:
    """A tree shape plus a sampling verifier (greedy verification is used at temperature 0).

    ``num_paths`` K, ``trunk`` L1, ``depth`` total depth L (= L1 + L2 for delayed trees), ``top_k`` and
    ``budget`` for ``topk`` trees. DynaTree: ``trunk`` = D_0, ``depth`` = D_max + 1, ``budget`` = N_max and
    ``dynatree_options`` the other parameters that differ from their defaults, as sorted ``(key, value)``
    pairs (keys of :data:`DYNATREE_INT_KEYS` and :data:`DYNATREE_REAL_KEYS`).
    """

    shape: str = "chain"
    depth: int = 4
    num_paths: int = 1
    trunk: int = 0
    top_k: int = 0
    budget: int = 0
    verifier: str = ""
    adaptive: bool = False
    dynatree_options: tuple[tuple[str, DynaTreeValue], ...] = ()

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
        if self.dynatree_options and self.shape != "dynatree":
            raise ValueError(f"dynatree_options need shape 'dynatree', got shape={self.shape!r}")
        if self.shape == "nde" and self.adaptive:
            raise ValueError("strategy 'nde' chooses every step's tree itself; '+adaptive' does not apply to it")
        if self.shape == "dynatree":
            object.__setattr__(self, "dynatree_options", _canonical_options(self.dynatree_options))
            self.dynatree_params()  # validates every parameter (ValueError naming it)
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
        """The DynaTree parameters: ``trunk`` = D0, ``depth - 1`` = DMAX, ``budget`` = N_max, the options,
        and the defaults of :class:`spec_ref.dynatree.DynaTreeParams` for the rest."""
        from spec_ref.dynatree import DynaTreeParams

        options: dict[str, Any] = {k: v for k, v in self.dynatree_options if k != "window"}
        return DynaTreeParams(base_depth=self.trunk, max_depth=self.depth - 1, node_budget=self.budget, **options)

    @property
    def dynatree_window(self) -> int:
        """The DynaTree history window W (iterations)."""
        return int(dict(self.dynatree_options).get("window", DEFAULT_DYNATREE_WINDOW))

    @classmethod
    def for_dynatree(cls, params: DynaTreeParams, window: int = DEFAULT_DYNATREE_WINDOW, verifier: str = "",
                     adaptive: bool = False) -> Strategy:
        """The DynaTree strategy drafting with ``params`` and history window ``window``."""
        from spec_ref.dynatree import DynaTreeParams

        if not isinstance(params, DynaTreeParams):
            raise ValueError(f"params must be a spec_ref.dynatree.DynaTreeParams, got params={params!r}")
        options = [(f.name, getattr(params, f.name)) for f in fields(params) if f.name not in DYNATREE_STRUCTURAL_KEYS]
        return cls(shape="dynatree", depth=params.max_depth + 1, trunk=params.base_depth, budget=params.node_budget,
                   verifier=verifier, adaptive=adaptive, dynatree_options=tuple(options) + (("window", window),))

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
            extra = "".join(f",{k}={v}" for k, v in self.dynatree_options)
            return f"dynatree:{self.trunk},{self.depth - 1},{self.budget}{extra}/{self.verifier}"
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


def _number(key: str, text: str, spec: str) -> DynaTreeValue:
    try:
        return int(text) if key in DYNATREE_INT_KEYS or key in DYNATREE_STRUCTURAL_KEYS else float(text)
    except ValueError:
        kind = "an integer" if key in DYNATREE_INT_KEYS or key in DYNATREE_STRUCTURAL_KEYS else "a number"
        raise ValueError(f"strategy {spec!r}: {key} must be {kind}, got {key}={text!r}") from None


def _canonical_options(options: tuple[tuple[str, DynaTreeValue], ...]) -> tuple[tuple[str, DynaTreeValue], ...]:
    """Known keys only, each once, typed, defaults dropped, sorted: equal parameters give equal strategies."""
    from spec_ref.dynatree import DynaTreeParams

    defaults: dict[str, DynaTreeValue] = {f.name: f.default for f in fields(DynaTreeParams)}  # type: ignore[misc]
    defaults["window"] = DEFAULT_DYNATREE_WINDOW
    seen: dict[str, DynaTreeValue] = {}
    for item in options:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise ValueError(f"dynatree_options must hold (key, value) pairs, got {item!r}")
        key, value = item
        if key not in DYNATREE_INT_KEYS and key not in DYNATREE_REAL_KEYS:
            raise ValueError(f"unknown DynaTree option {key!r}; choose from "
                             f"{sorted(DYNATREE_INT_KEYS + DYNATREE_REAL_KEYS + DYNATREE_STRUCTURAL_KEYS)}")
        if key in seen:
            raise ValueError(f"DynaTree option {key} given twice")
        integer = key in DYNATREE_INT_KEYS
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
            raise ValueError(f"{key} must be {'an integer' if integer else 'a real number'}, got {key}={value!r}")
        seen[key] = value if integer else float(value)
    if "window" in seen and seen["window"] < 1:
        raise ValueError(f"window must be an integer >= 1, got window={seen['window']!r}")
    return tuple(sorted((k, v) for k, v in seen.items() if v != defaults[k]))


def _parse_dynatree(args: str, spec: str, verifier: str) -> Strategy:
    """``[D0,DMAX,BUDGET][,key=value...]`` -> a DynaTree :class:`Strategy` (module docstring)."""
    items = [item.strip() for item in args.split(",")] if args else []
    positional = [item for item in items if "=" not in item]
    if items[: len(positional)] != positional or len(positional) not in (0, 3):
        raise ValueError(f"strategy {spec!r}: expected dynatree:D0,DMAX,BUDGET (three integers), then "
                         "key=value pairs")
    values: dict[str, DynaTreeValue] = {}
    for key, text in zip(DYNATREE_STRUCTURAL_KEYS, positional):
        values[key] = _number(key, text, spec)
    for item in items[len(positional):]:
        name, _, text = item.partition("=")
        key = DYNATREE_ALIASES.get(name.strip(), name.strip())
        if key not in DYNATREE_STRUCTURAL_KEYS + DYNATREE_INT_KEYS + DYNATREE_REAL_KEYS:
            raise ValueError(
                f"strategy {spec!r}: unknown DynaTree parameter {name.strip()!r}; choose from "
                f"{sorted(DYNATREE_STRUCTURAL_KEYS + DYNATREE_INT_KEYS + DYNATREE_REAL_KEYS)} or the aliases "
                f"{sorted(DYNATREE_ALIASES)}"
            )
        if key in values:
            raise ValueError(f"strategy {spec!r}: DynaTree parameter {key} given twice")
        values[key] = _number(key, text.strip(), spec)
    d0 = int(values.pop("base_depth", 5))
    dmax = int(values.pop("max_depth", 8))
    budget = int(values.pop("node_budget", 64))
    if not 1 <= d0 < dmax:
        raise ValueError(f"strategy {spec!r}: need 1 <= D0 < DMAX, got base_depth={d0}, max_depth={dmax}")
    if budget < 1:
        raise ValueError(f"strategy {spec!r}: node_budget must be >= 1, got node_budget={budget}")
    try:
        return Strategy(shape="dynatree", depth=dmax + 1, trunk=d0, budget=budget, verifier=verifier,
                        dynatree_options=tuple(values.items()))
    except ValueError as err:
        raise ValueError(f"strategy {spec!r}: {err}") from None


def parse_strategy(spec: str, verifier: str | None = None) -> Strategy:
    """``ar`` | ``chain:L`` | ``iid:KxL`` | ``delayed:K,L1,L2`` | ``topk:DEPTH,K,BUDGET`` |
    ``dynatree[:D0,DMAX,BUDGET][,key=value...]`` -> :class:`Strategy` (module docstring)."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"strategy must be a non-empty string, got strategy={spec!r}")
    if spec.endswith("+adaptive"):
        base = parse_strategy(spec[: -len("+adaptive")], verifier)
        if not base.drafts:
            raise ValueError(f"strategy {spec!r}: '+adaptive' needs a drafting strategy")
        return replace(base, adaptive=True)
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
        return _parse_dynatree(args, spec, v)
    raise ValueError(
        f"unknown strategy {spec!r}; use ar, chain:L, iid:KxL, delayed:K,L1,L2, nde[:VERIFIER], topk:DEPTH,K,BUDGET or dynatree"
    )
