"""Shared design of the engine-level statistical tests (docs/testing.md section 4.4, "engine").

What is sampled: the joint law of the first two generated tokens of a tiny random Llama with V = 4
(``TOKENS = 2`` so ``CELLS = 16`` chi-square cells before pooling) under G = (T 0.9, top-p 0.95), one prompt
token, ``max_new_tokens = 3`` so the first step drafts a tree of depth 2; generation stops as soon as every
row has two tokens (rows that emitted one token take a second step, so the test also covers the state
carried between steps). The expected law is the exact autoregressive law of G(target), enumerated over the
16 token pairs in float64 from the model's logits; it never comes from the engine.

Error rates: ``ALPHA_FAMILY = 1e-4`` is the probability, over the choice of the fixed seeds, that a correct
engine fails at least one configuration; it is split evenly (Bonferroni) over the ``NUM_CONFIGS``
configurations of the two engine test files, so each configuration's chi-square test runs at
``ALPHA_CONFIG = ALPHA_FAMILY / NUM_CONFIGS``. Seeds are fixed (``zlib.crc32`` of the configuration name), so
CI is deterministic: a given code version always passes or always fails.

Power: ``rows_for(config)`` rows give, by the chi-square bound ``chi2 >= 4 TV^2``, power >= 0.99 against
every two-token law at total variation ``detectable_tv(rows)`` from the exact one. ``FULL_POWER_ROWS`` (the
rows for TV 0.02 at 15 degrees of freedom) is what docs/testing.md section 4.4 asks for; the configurations
whose engine path is too slow for it on the 2-core CI machine run at fewer rows (``ROWS``), and their
detectable TV is printed by the tests and listed in docs/testing.md.

Negative controls: every configuration has its own lossy mutant of the same engine (a test-only subclass,
:class:`MutantDecoder`), run with the same rows and seed, that the same chi-square test must reject.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from spec_fast.drafts.dual import DualDrafter
from spec_fast.drafts.model import EarlyExitDrafter
from spec_fast.drafts.retrieval import RetrievalDrafter, SuffixIndex
from spec_fast.engine import SamplingParams, SpeculativeDecoder
from spec_fast.strategies import parse_strategy
from spec_ref.decoding import decoding_operator as reference_operator
from spec_ref.goodness_of_fit import POWER, power_at, required_noncentrality, samples_for_power
from tests.engine.models import tiny_llama
from tests.stats import chi2_gof, config_seed

VOCAB = 4
TOKENS = 2
CELLS = VOCAB**TOKENS
PROMPT = [1]
SAMPLING = {"temperature": 0.9, "top_k": 0, "top_p": 0.95}
TARGET = tiny_llama(vocab_size=VOCAB, layers=2, seed=3, hidden=16)
DRAFTER = EarlyExitDrafter(TARGET, 1)
#: a retrieval draft: sparse laws with exact zeros and point masses, far from the target
RETRIEVAL = RetrievalDrafter(SuffixIndex([[1, 2, 3, 0, 0, 1], [3, 0, 2], [2, 3, 1, 1, 0], [0, 0, 0]], VOCAB, 4),
                             VOCAB, 4)
#: the same draft when its chain goes past the first level only behind matches of 2 tokens or more: each row's
#: depth then depends on its text and its own draws (RetrievalDrafter.chain_depths)
RETRIEVAL_DEEP = RetrievalDrafter(RETRIEVAL.index, VOCAB, 4, deep_match=2)
#: the same draft when a chain's depth follows the acceptance the row's earlier chains met: the second token's
#: step drafts a tree shaped by the first step's verification
RETRIEVAL_LEARNED = RetrievalDrafter(RETRIEVAL.index, VOCAB, 4, path_acceptance=0.3)

#: the total variation docs/testing.md section 4.4 asks every engine configuration to detect with power POWER
TARGET_TV = 0.02


@dataclass(frozen=True)
class EngineConfig:
    """One engine configuration: strategy spec, verifier (None for dual drafts: NSS), drafter kind
    (``early-exit`` | ``retrieval`` | ``retrieval-deep`` | ``retrieval-learned`` | ``dual-merge`` | ``dual-route`` | ``dual-route-calibrated``), its negative control
    (``wrong-q`` | ``parent-row`` | ``best-of-two``) and its row tier (``full`` | ``tree`` | ``small``)."""

    strategy: str
    verifier: str | None
    drafter: str
    control: str
    tier: str

    @property
    def name(self) -> str:
        return f"{self.strategy}/{self.verifier or 'nss'}/{self.drafter}"


def _c(strategy: str, verifier: str | None, drafter: str = "early-exit", control: str = "wrong-q",
       tier: str = "tree") -> EngineConfig:
    return EngineConfig(strategy, verifier, drafter, control, tier)


#: controls: wrong-q for the verifiers that read q; parent-row for NSS on the early-exit drafter (NSS reads
#: no q); best-of-two sampled paths for dual drafts (docs/algorithms.md section 8) and for top-k NSS on the
#: retrieval drafter, whose point-mass laws make the parent-row mutant too close to the target at 4096 rows
SINGLE_CONFIGS = [
    _c("chain:2", "naive", tier="full"),
    _c("chain:2", "bv", tier="full"),
    _c("chain:2", "traversal", tier="full"),
    _c("chain:2+adaptive", "naive", tier="full"),
    *[_c("iid:2x2", v, control="parent-row" if v == "nss" else "wrong-q")
      for v in ("naive_tree", "nss", "spectr", "specinfer", "khisti", "traversal")],
    *[_c("delayed:2,1,1", v, control="parent-row" if v == "nss" else "wrong-q")
      for v in ("naive_tree", "nss", "spectr", "specinfer", "khisti", "traversal")],
    _c("topk:2,2,4", "nss", control="parent-row"),
    _c("dynatree:1,2,6", "nss", control="parent-row"),
    _c("chain:2", "naive", "retrieval", tier="small"),
    _c("chain:2", "traversal", "retrieval", tier="small"),
    _c("chain:3", "naive", "retrieval-deep", tier="small"),
    _c("chain:3", "naive", "retrieval-learned", tier="small"),
    _c("iid:2x2", "specinfer", "retrieval", tier="small"),
    _c("topk:2,2,4", "nss", "retrieval", control="best-of-two", tier="small"),
]
DUAL_CONFIGS = [
    _c("chain:2", None, "dual-merge", control="best-of-two", tier="small"),
    _c("topk:2,2,4", None, "dual-merge", control="best-of-two", tier="small"),
    _c("chain:2", None, "dual-route", control="best-of-two", tier="small"),
    _c("topk:2,2,4", None, "dual-route", control="best-of-two", tier="small"),
    _c("chain:2", None, "dual-route-calibrated", control="best-of-two", tier="small"),
    _c("topk:2,2,4", None, "dual-route-calibrated", control="best-of-two", tier="small"),
]
NUM_CONFIGS = len(SINGLE_CONFIGS) + len(DUAL_CONFIGS)
ALPHA_FAMILY = 1e-4
ALPHA_CONFIG = ALPHA_FAMILY / NUM_CONFIGS
#: rows for power 0.99 at TV 0.02 with CELLS - 1 degrees of freedom (the worst case: pooling only lowers df)
FULL_POWER_ROWS = samples_for_power(CELLS - 1, TARGET_TV, ALPHA_CONFIG, POWER)
#: rows per tier: ``full`` reaches TV 0.02; ``tree`` (sampled and top-k trees, whose host-side drafting
#: costs about three times a chain's per row) and ``small`` (retrieval drafts, host-side NumPy per row,
#: and dual drafts, two drafters per row) are what the 2-core CI budget affords (detectable TV printed
#: by the tests and listed in docs/testing.md)
ROWS = {"full": FULL_POWER_ROWS, "tree": 12288, "small": 4096}


def rows_for(config: EngineConfig) -> int:
    return ROWS[config.tier]


def detectable_tv(rows: int, df: int = CELLS - 1, alpha: float = ALPHA_CONFIG, power: float = POWER) -> float:
    """The smallest TV detected with ``power`` at ``rows`` samples: ``sqrt(lambda / (4 N))``."""
    return math.sqrt(required_noncentrality(df, alpha, power) / (4.0 * rows))


def power_at_target(rows: int, df: int = CELLS - 1) -> float:
    return power_at(rows, df, TARGET_TV, ALPHA_CONFIG)


def g(logits: torch.Tensor) -> np.ndarray:
    return np.asarray(reference_operator(logits.double().numpy(), SAMPLING["temperature"], None, SAMPLING["top_p"]))


def next_probs(model: Any, prefix: list[int]) -> np.ndarray:
    with torch.no_grad():
        return g(model(torch.tensor([prefix])).logits[0, -1])


def ar_law() -> np.ndarray:
    """Exact law of the first two tokens of G(target) after PROMPT, ``[CELLS]`` (index y1 * V + y2)."""
    first = next_probs(TARGET, PROMPT)
    law = np.zeros((VOCAB, VOCAB))
    for y in range(VOCAB):
        if first[y] > 0:
            law[y] = first[y] * next_probs(TARGET, PROMPT + [y])
    return law.ravel()


def drafter_for(kind: str) -> Any:
    if kind == "early-exit":
        return DRAFTER
    if kind == "retrieval":
        return RETRIEVAL
    if kind == "retrieval-deep":
        return RETRIEVAL_DEEP
    if kind == "retrieval-learned":
        return RETRIEVAL_LEARNED
    return DualDrafter(DRAFTER, RETRIEVAL, kind.removeprefix("dual-"))


class MutantDecoder(SpeculativeDecoder):
    """Lossy engine variants (test only, never flags in the product):

    * ``wrong-q``: the verifier sees a uniform q instead of the law the drafts were sampled from;
    * ``parent-row``: every node is verified with its parent's target row (the off-by-one gather of
      docs/testing.md section 7);
    * ``best-of-two``: the tree is verified twice with independent uniforms and the run that accepted more
      is kept (best of two sampled paths, lossy by design: docs/algorithms.md section 8).
    """

    def __init__(self, target: Any, drafter: Any, strategy: Any, mutant: str) -> None:
        super().__init__(target, drafter, strategy)
        self.mutant = mutant

    def _verify_sampling(self, method: str, draft: Any, target_logits: Any, draft_probs: Any, sampling: Any,
                         offset: int) -> Any:
        if self.mutant == "wrong-q":
            draft_probs = torch.full_like(draft_probs, 1.0 / draft_probs.shape[-1])
        elif self.mutant == "parent-row":
            parents = draft.tree.parents.clamp(min=0)  # the root (parent -1) keeps its own row
            target_logits = torch.gather(target_logits, 1, parents.unsqueeze(-1).expand_as(target_logits))
        elif self.mutant == "best-of-two":
            one, _ = super()._verify_sampling(method, draft, target_logits, draft_probs, sampling, offset)
            two, end = super()._verify_sampling(method, draft, target_logits, draft_probs, sampling,
                                                offset + 10**6)
            pick_two = two.accepted_depth > one.accepted_depth
            fields = {}
            for name in ("accepted_slots", "accepted_depth", "next_token", "emitted", "accepted_node"):
                a, b = getattr(one, name), getattr(two, name)
                fields[name] = torch.where(pick_two.view(-1, *([1] * (a.dim() - 1))), b, a)
            return type(one)(**fields), end
        else:
            raise ValueError(f"unknown mutant {self.mutant!r}")
        return super()._verify_sampling(method, draft, target_logits, draft_probs, sampling, offset)


def decoder_for(config: EngineConfig, mutant: str | None = None) -> SpeculativeDecoder:
    strategy = parse_strategy(config.strategy, config.verifier)
    if mutant is None:
        return SpeculativeDecoder(TARGET, drafter_for(config.drafter), strategy)
    return MutantDecoder(TARGET, drafter_for(config.drafter), strategy, mutant)


def sample_counts(decoder: SpeculativeDecoder, seed_name: str, rows: int, tokens: int = TOKENS) -> np.ndarray:
    """Counts ``[V**tokens]`` of the first ``tokens`` tokens over ``rows`` rows of one batched ``generate``
    (seed ``config_seed(seed_name)``); generation ends once every row has ``tokens`` tokens."""
    emitted = np.zeros(rows, dtype=np.int64)

    def enough(new_tokens: list[list[int]]) -> bool:
        emitted[:] += np.fromiter((len(t) for t in new_tokens), dtype=np.int64, count=rows)
        return bool(emitted.min() >= tokens)

    sampling = SamplingParams(seed=config_seed(seed_name), **SAMPLING)  # type: ignore[arg-type]
    result = decoder.generate([PROMPT] * rows, max_new_tokens=TOKENS + 1, sampling=sampling, on_tokens=enough)
    first = np.array([row[:tokens] for row in result.tokens], dtype=np.int64)
    index = np.zeros(rows, dtype=np.int64)
    for j in range(tokens):
        index = index * VOCAB + first[:, j]
    return np.bincount(index, minlength=VOCAB**tokens).astype(np.float64)


def check_law(config: EngineConfig) -> None:
    """The configuration's first two tokens follow the exact AR law at its rows (chi-square at ALPHA_CONFIG)."""
    rows = rows_for(config)
    result = chi2_gof(sample_counts(decoder_for(config), config.name, rows), ar_law(), ALPHA_CONFIG)
    print(f"{config.name}: {rows} rows, chi2 {result.statistic:.1f} (df {result.df}, critical "
          f"{result.critical:.1f}), TV detected with power {POWER}: {detectable_tv(rows, result.df):.4f}")
    assert not result.rejected, result


def check_control_rejected(config: EngineConfig) -> None:
    """The same test, same rows and seed, rejects the configuration's own lossy mutant."""
    rows = rows_for(config)
    result = chi2_gof(sample_counts(decoder_for(config, config.control), config.name, rows), ar_law(),
                      ALPHA_CONFIG)
    print(f"{config.name} with mutant {config.control}: chi2 {result.statistic:.1f} (critical "
          f"{result.critical:.1f}), support violations {len(result.support_violations)}")
    assert result.rejected, result
