"""The state of one running batch: one row per request, and the caches the rows share.

:class:`DecodeState` holds what decoding changes: per row (per request) its sampling parameters, token
budget, random streams (:mod:`spec_fast.draws`), committed text and outputs; per batch the target cache
and each drafter's state (:class:`~spec_fast.drafts.batch.HeadTrack`), all with the same rows. Between steps the
rows can change: :meth:`DecodeState.take_rows` keeps a subset (finished requests leave and free their
cache rows at once) and :meth:`DecodeState.join` appends the rows of a freshly prefilled state (new
requests join); no remaining row is recomputed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from spec_fast.engine.adaptive import AdaptiveController
from spec_fast.engine.batch_depth import DepthEvidence, PassCost
from spec_fast.drafts.batch import HeadTrack
from spec_fast.decoding import SamplingParams
from spec_fast.draws import STEP_STRIDE, RowStreams
from spec_fast.drafts.proposer import ProposerRows
from spec_fast.flat_tree import FlatTree
from spec_fast.kv_cache import TreeKVCache
from spec_fast.metrics import GenerationMetrics

__all__ = ["DecodeState"]


@dataclass
class DecodeState:
    """Everything decoding changes, for ``B`` rows (row b = one request).

    Per row: ``samplings``, ``max_new`` (token budget), ``outputs`` (generated ids), ``committed`` (prompt
    + generated), ``roots`` (last committed token), ``active``; ``proposal``: the proposer's own per-row
    state (:class:`~spec_fast.drafts.proposer.ProposerRows`, e.g. DynaTree's histories); ``draft_keys`` /
    ``verify_keys`` ``[B]`` int64 (:func:`spec_fast.draws.stream_keys`) and ``row_steps [B]`` int64 (steps
    the row took part in: its streams' position); ``fresh[b]``: the row's root is already in the target
    cache, its logits in ``root_logits [B, V]`` (a row prefilled since the last step); ``step_accepted`` /
    ``step_drafted``: the last step's accepted draft tokens and drafted nodes per row (-1: sat out).
    """

    samplings: list[SamplingParams]
    max_new: list[int]
    eos: set[int]
    target_cache: TreeKVCache
    heads: list[HeadTrack]
    metrics: GenerationMetrics
    controller: AdaptiveController | None
    wants_hidden: bool
    roots: list[int]
    outputs: list[list[int]]
    committed: list[list[int]]
    active: list[bool]
    draft_keys: torch.Tensor
    verify_keys: torch.Tensor
    row_steps: torch.Tensor
    fresh: list[bool]
    proposal: ProposerRows
    root_logits: torch.Tensor | None = None
    root_hidden: torch.Tensor | None = None
    steps: int = 0
    trees: list[FlatTree] | None = None
    #: set: each step's depth is chosen from the batch's size and this measured cost of a step by rows and
    #: depth (:func:`spec_fast.engine.batch_depth.choose_depth`); None: the strategy's depth
    step_cost: PassCost | None = None
    #: the acceptance counts that choice reads (faded step by step)
    depth_evidence: DepthEvidence = field(default_factory=DepthEvidence)
    #: this step's deepest draft per row (:meth:`spec_fast.engine.SpeculativeDecoder.depth_caps`)
    depth_caps: list[int] = field(default_factory=list)
    step_accepted: list[int] = field(default_factory=list)
    step_drafted: list[int] = field(default_factory=list)
    #: per row: the prompt tokens whose cache entries its prefill reused (:mod:`spec_fast.engine.prefix_cache`)
    cached_prompt: list[int] = field(default_factory=list)

    @property
    def batch_size(self) -> int:
        return len(self.roots)

    @property
    def max_new_tokens(self) -> int:
        return max(self.max_new, default=0)

    @property
    def sampling(self) -> SamplingParams:
        """The rows' sampling parameters when every row has the same (seeds aside); a ``ValueError`` when
        they differ (for parts that decide for the whole batch, e.g. the NDE selector)."""
        first = self.samplings[0]
        if any(s.law != first.law for s in self.samplings[1:]):
            raise ValueError("the rows of this batch have different sampling parameters")
        return first

    def draft_streams(self) -> RowStreams:
        """This step's draft stream of every row."""
        return RowStreams(self.draft_keys, self.row_steps * STEP_STRIDE)

    def verify_offsets(self) -> torch.Tensor:
        """``[B]`` int64: this step's first verifier counter of every row."""
        return self.row_steps * STEP_STRIDE

    # ------------------------------------------------------------------ rows (between steps only)
    def take_rows(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in that order); their cache rows stay, every other row's are freed."""
        index = torch.tensor(rows, dtype=torch.long, device=self.draft_keys.device)
        self.target_cache.take_rows(rows)
        self.depth_evidence.take_rows(rows)
        for head in self.heads:
            head.state = head.drafter.take_rows(head.state, rows)
            head.pending = [head.pending[b] for b in rows]
        for name in ("samplings", "max_new", "roots", "outputs", "committed", "active", "fresh",
                     "step_accepted", "step_drafted", "depth_caps", "cached_prompt"):
            values = getattr(self, name)
            setattr(self, name, [values[b] for b in rows] if values else values)
        self.draft_keys = self.draft_keys.index_select(0, index)
        self.verify_keys = self.verify_keys.index_select(0, index)
        self.row_steps = self.row_steps.index_select(0, index)
        if self.root_logits is not None:
            self.root_logits = self.root_logits.index_select(0, index)
        if self.root_hidden is not None:
            self.root_hidden = self.root_hidden.index_select(0, index)
        self.proposal = self.proposal.take_rows(rows)

    def join(self, other: DecodeState) -> None:
        """Append ``other``'s rows (a state just prefilled by the same decoder) behind this state's."""
        if len(other.heads) != len(self.heads) or self.wants_hidden != other.wants_hidden:
            raise ValueError("join needs a state of the same decoder")
        self.proposal = self.proposal.join(other.proposal)  # first: a proposer may refuse (ValueError)
        self.depth_evidence.join(other.depth_evidence, self.batch_size, other.batch_size)
        self.target_cache.append_rows(other.target_cache)
        for head, joining in zip(self.heads, other.heads):
            head.state = head.drafter.join_rows(head.state, joining.state)
            head.pending = head.pending + joining.pending
            head.prefilled = head.prefilled or joining.prefilled
        for name in ("samplings", "max_new", "roots", "outputs", "committed", "active", "fresh", "cached_prompt"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.step_accepted = self.step_accepted + [-1] * other.batch_size
        self.step_drafted = self.step_drafted + [-1] * other.batch_size
        self.depth_caps = []
        self.metrics.prompt_tokens += other.metrics.prompt_tokens
        self.metrics.cached_prompt_tokens += other.metrics.cached_prompt_tokens
        self.draft_keys = torch.cat([self.draft_keys, other.draft_keys])
        self.verify_keys = torch.cat([self.verify_keys, other.verify_keys])
        self.row_steps = torch.cat([self.row_steps, other.row_steps])
        self.root_logits = _join_optional(self.root_logits, other.root_logits, self.batch_size - other.batch_size,
                                          other.batch_size)
        self.root_hidden = _join_optional(self.root_hidden, other.root_hidden, self.batch_size - other.batch_size,
                                          other.batch_size)
        if self.controller is not other.controller:
            self.controller = None  # a sampled request joined: the step kind must not depend on timing


def _join_optional(mine: torch.Tensor | None, theirs: torch.Tensor | None, rows_mine: int, rows_theirs: int
                   ) -> torch.Tensor | None:
    """Row-wise concatenation of two per-row tensors where either side may be absent (zeros stand in)."""
    if mine is None and theirs is None:
        return None
    like = mine if mine is not None else theirs
    assert like is not None
    if mine is None:
        mine = like.new_zeros((rows_mine,) + tuple(like.shape[1:]))
    if theirs is None:
        theirs = like.new_zeros((rows_theirs,) + tuple(like.shape[1:]))
    return torch.cat([mine, theirs])
