"""The proposer protocol: one strategy's whole drafting side, with the per-request state it keeps.

One engine step is draft -> target pass -> verify -> commit (:mod:`spec_fast.engine.decoder`). A
:class:`Proposer` owns the draft side of it for one strategy, and one module holds each strategy's proposer
with its tree builder:

=================  ===================================================  ====================================
strategy           proposer                                             per-request state
=================  ===================================================  ====================================
``ar``             :class:`PlainProposer` (this module)                 none
``chain``          :class:`spec_fast.drafts.chain.ChainProposer`        none
``iid, delayed``   :class:`spec_fast.drafts.delayed.DelayedProposer`    none
``topk``           :class:`spec_fast.drafts.topk.TopKProposer`          none
``dynatree``       :class:`spec_fast.drafts.dynatree.DynaTreeProposer`  the acceptance history
``nde``            :class:`spec_fast.nde.proposer.NdeProposer`          the target at the token before the root
dual drafts        :class:`spec_fast.drafts.dual_drafting.DualProposer` the route calibration counts
=================  ===================================================  ====================================

:func:`spec_fast.engine.proposers.make_proposer` is the one place that maps a strategy (and a dual drafter) to
its proposer. The hooks, in step order:

* :meth:`Proposer.drafters` (per call) and :meth:`Proposer.begin` (per batch of new requests): the drafters
  the call runs and the proposer's rows for freshly prefilled requests, kept by the engine in
  ``DecodeState.proposal`` and reordered with the batch (:meth:`ProposerRows.take_rows` when requests leave,
  :meth:`ProposerRows.join` when requests join);
* :meth:`Proposer.gate_caps`: which rows draft at all this step (a chain's drafter may forecast a loss);
* :meth:`Proposer.draft`: the step's trees below the roots, row b at most ``rows.depth_caps[b]`` deep;
* :meth:`Proposer.after_verify`: what the proposer reads of the verification before the commit;
* :meth:`Proposer.after_commit`: what it learns from the committed counts (host-side, no device read).

A proposer fixes the step's tree shape from the committed context alone, before any target draw: that is what
keeps every strategy lossless (docs/algorithms.md section 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from spec_fast.decoding import SamplingParams
from spec_fast.drafts.batch import DraftBatch, DraftLaw, HeadTrack
from spec_fast.drafts.dual import DualDraft
from spec_fast.drafts.model import Drafter
from spec_fast.draws import RowStreams
from spec_fast.metrics import GenerationMetrics
from spec_fast.strategies import Strategy
from spec_fast.verify.tree import Verified

__all__ = ["StepRows", "ProposerRows", "NoRows", "NO_ROWS", "Proposer", "PlainProposer", "SingleHeadProposer",
           "batch_greedy"]


class ProposerRows(Protocol):
    """A proposer's per-request state, one entry per row of the running batch."""

    def take_rows(self, rows: list[int]) -> ProposerRows:
        """The state of ``rows`` only, in that order (requests left the batch)."""
        ...

    def join(self, other: ProposerRows) -> ProposerRows:
        """This state's rows, then ``other``'s (requests of a fresh state joined the batch)."""
        ...


class StepRows(Protocol):
    """What a proposer reads of the running batch (:class:`spec_fast.engine.decode_state.DecodeState`)."""

    samplings: list[SamplingParams]
    roots: list[int]
    committed: list[list[int]]
    active: list[bool]
    heads: list[HeadTrack]
    metrics: GenerationMetrics
    depth_caps: list[int]
    proposal: ProposerRows

    def draft_streams(self) -> RowStreams: ...

    @property
    def sampling(self) -> SamplingParams: ...


class NoRows:
    """The per-request state of a proposer that keeps none."""

    def take_rows(self, rows: list[int]) -> NoRows:
        return self

    def join(self, other: ProposerRows) -> NoRows:
        return self


NO_ROWS = NoRows()


class Proposer(Protocol):
    """One strategy's drafting (module docstring)."""

    #: the proposer reads the target's final hidden states (the engine then runs every pass with them)
    reads_target_hidden: bool
    #: the proposer needs the target at the token before each root from the prefill
    reads_previous: bool
    #: the most draws a node of this proposer's trees has; the verifier reads that many uniforms per node, so
    #: a row reads the same numbers whatever else shares its batch
    most_draws: int
    #: greedy rows' drafters follow their argmax (one path); otherwise they sample softmax (distinct paths)
    greedy_argmax: bool

    def compatible(self, sampling: SamplingParams, running: Sequence[SamplingParams],
                   admitted: Sequence[SamplingParams]) -> bool:
        """Whether a request with ``sampling`` may join a batch whose ``running`` rows decode and whose
        ``admitted`` requests join with it."""
        ...

    def drafters(self) -> tuple[Drafter, ...]:
        """The drafters of one call, in head order (made per call: a wrapper may keep the call's outputs)."""
        ...

    def begin(self, batch: int, device: torch.device,
              previous: tuple[torch.Tensor, torch.Tensor] | None) -> ProposerRows:
        """The proposer's rows for ``batch`` freshly prefilled requests; ``previous``: the target's
        (logits ``[B, V]``, final hidden state ``[B, H]``) at the token before each root when
        :attr:`reads_previous`, else None."""
        ...

    def gate_caps(self, rows: StepRows, caps: list[int]) -> list[int]:
        """The step's depth cap per row after the proposer's own forecast (``caps``: the engine's): a row
        whose draft would not pay, judged from its text and past steps alone, gets 0 (a plain step)."""
        ...

    def draft(self, rows: StepRows, depth_cap: int, law: DraftLaw, device: torch.device
              ) -> tuple[DraftBatch, DualDraft | None]:
        """This step's trees below ``rows.roots`` (``depth_cap >= 1``: the deepest ``rows.depth_caps``);
        ``law``: the per-row law drafters sample from. Sets each head's ``pending_width``."""
        ...

    def after_verify(self, rows: StepRows, draft: DraftBatch, dual: DualDraft | None, verified: Verified,
                     target_logits: torch.Tensor, target_hidden: torch.Tensor | None) -> DualDraft | None:
        """Read the step's verification before the commit (``target_logits [B, N, V]``, ``target_hidden
        [B, N, H]`` or None); returns the dual draft the commit uses."""
        ...

    def after_commit(self, rows: StepRows, dual: DualDraft | None, verified: Verified, accepted: Sequence[int]
                     ) -> None:
        """Learn from the step, before the commit changes the rows: ``accepted[b]``, row b's accepted draft
        tokens on the host (read only for rows active during the step)."""
        ...


class PlainProposer:
    """``ar``: no draft; every step is a plain step (the engine drafts the root alone)."""

    reads_target_hidden = False
    reads_previous = False
    most_draws = 1
    greedy_argmax = False

    def __init__(self, strategy: Strategy) -> None:
        self.strategy = strategy

    def compatible(self, sampling: SamplingParams, running: Sequence[SamplingParams],
                   admitted: Sequence[SamplingParams]) -> bool:
        return True

    def drafters(self) -> tuple[Drafter, ...]:
        return ()

    def begin(self, batch: int, device: torch.device,
              previous: tuple[torch.Tensor, torch.Tensor] | None) -> ProposerRows:
        return NO_ROWS

    def gate_caps(self, rows: StepRows, caps: list[int]) -> list[int]:
        return caps

    def draft(self, rows: StepRows, depth_cap: int, law: DraftLaw, device: torch.device
              ) -> tuple[DraftBatch, DualDraft | None]:
        raise ValueError("strategy 'ar' drafts nothing")

    def after_verify(self, rows: StepRows, draft: DraftBatch, dual: DualDraft | None, verified: Verified,
                     target_logits: torch.Tensor, target_hidden: torch.Tensor | None) -> DualDraft | None:
        return dual

    def after_commit(self, rows: StepRows, dual: DualDraft | None, verified: Verified, accepted: Sequence[int]
                     ) -> None:
        return None


class SingleHeadProposer(PlainProposer):
    """Base of the proposers that draft with one drafter and keep no per-request state."""

    def __init__(self, strategy: Strategy, drafter: Drafter | None) -> None:
        if drafter is None:
            raise ValueError(f"strategy {strategy.label()!r} needs a drafter, got drafter=None")
        super().__init__(strategy)
        self.head_drafter: Drafter = drafter

    def drafters(self) -> tuple[Drafter, ...]:
        return (self.head_drafter,)

    def head_args(self, rows: StepRows) -> tuple[Drafter, Any, list[list[int]], list[int]]:
        """``(drafter, its state, pending tokens per row, roots)``: the first arguments of every builder."""
        head = rows.heads[0]
        return head.drafter, head.state, head.pending, rows.roots


def batch_greedy(samplings: Sequence[SamplingParams]) -> bool:
    """Whether the batch is greedy, for parts that decide for the whole batch (a ``ValueError`` when its
    rows mix greedy and sampled requests)."""
    greedy = {s.greedy for s in samplings}
    if len(greedy) > 1:
        raise ValueError("this strategy cannot mix greedy and sampled requests in one batch")
    return greedy.pop()
