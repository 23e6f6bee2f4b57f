"""One engine step's dual draft (:class:`~spec_fast.drafts.dual.DualDrafter`): both heads' trees, merged or
routed, with as little drafting as the route allows.

A ``chain:L`` head drafts its deterministic top-1 chain on the device (:class:`TopChain`: the decisions and
confidences of :func:`spec_fast.drafts.topk.draft_topk_tree` with ``k = 1``, budget ``L``, without its per-level
host reads and per-row Python trees). ``topk:...`` heads draft with :func:`~spec_fast.drafts.topk.draft_topk_tree`.

Routing a pair of chains stops drafting a head as soon as it cannot win (:func:`draft_dual`): along a chain
the confidences never grow (``c_{i+1} = c_i q_{i+1}``, and a calibrated factor is at most 1), so after
``j`` of ``L`` levels the head's score is at most the score of the chain whose last ``L - j`` nodes repeat
node ``j``'s value, computed by the same reduction (so the bound holds in floating point too). A model-free
head (retrieval, no pass) drafts first; the other head then drafts level by level and stops when its bound
loses to the first head's exact score (ties go to head 1). Before its first pass that bound is 1 (no chain
scores more): when the first head is a model-free head 1 and its chain scores exactly 1 (a retrieval match
with one follower at every level), the other head is not drafted at all (``DualDraft.skipped``) and, as on a
plain step, receives everything committed as pending tokens. So ``--draft retrieval,rnn`` costs no model-head
pass on the steps where retrieval is certain, whereas ``--draft rnn,retrieval`` (the model head wins ties)
drafts the model head's first level on every step. The choice is the one the full drafts give, so it is
still fixed by the drafts alone before any target draw (lossless at every temperature). A stopped head is
never verified; its cache keeps only its pending entries, as a losing head's does, and it stays in sync
through its pending tokens (seed 000 (docs/papers.md) section 7).

``route-calibrated`` also counts the losing head's nodes against the committed text. Nodes below the level
where a head stopped are offered only where its drafted chain equals the committed block so far; on such
steps :func:`finish_for_calibration` drafts the remaining levels before the commit (the same passes on the
same cache state, so the same nodes), and the counts equal those of full drafts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from spec_fast._sampling import first_max_index
from spec_fast.decoding import SamplingParams
from spec_fast.drafts.batch import DraftBatch, DraftLaw, HeadTrack, cap_rows, draft_root_only, pending_forward
from spec_fast.drafts.dual import (
    DualDraft, DualDrafter, RouteCalibration, calibrated_confidences, calibrated_route, confidence_mean,
    expected_accepted, merge_trees, node_match_lengths, observe_committed, route, select_heads, union_tree,
)
from spec_fast.drafts.dual_calibration import committed_block
from spec_fast.drafts.model import Drafter
from spec_fast.drafts.proposer import PlainProposer, ProposerRows, StepRows, batch_greedy
from spec_fast.drafts.retrieval import RetrievalDrafter
from spec_fast.drafts.topk import draft_topk_tree
from spec_fast.flat_tree import FlatTree
from spec_fast.strategies import Strategy
from spec_fast.verify.tree import Verified

__all__ = ["DualProposer", "RouteRows", "TopChain", "draft_dual", "finish_for_calibration"]


@dataclass(eq=False)
class TopChain:
    """One head's deterministic top-1 chain, drafted one level at a time on the device.

    ``logits [B, 1, V]``: the drafter's logits at the last drafted entry (the root after
    :meth:`start`); ``tokens``, ``probs``: per drafted level ``[B]`` the argmax token of ``softmax(logits)``
    (lowest id on ties, as :func:`spec_fast.drafts.batch.ranked_tokens`) and its float32 probability;
    ``entries``: the block entry of the root, then of each forwarded level.
    """

    drafter: Drafter
    state: Any
    depth: int
    width: int
    logits: torch.Tensor
    tokens: list[torch.Tensor] = field(default_factory=list)
    probs: list[torch.Tensor] = field(default_factory=list)
    entries: list[int] = field(default_factory=list)

    @staticmethod
    def start(drafter: Drafter, state: Any, pending: Sequence[Sequence[int]], depth: int,
              device: torch.device) -> TopChain:
        """Feed the pending tokens (:func:`~spec_fast.drafts.batch.pending_forward`) and draft level 1."""
        logits, width = pending_forward(drafter, state, pending, device)
        chain = TopChain(drafter, state, depth, width, logits, entries=[width - 1])
        chain._take()
        return chain

    @property
    def done(self) -> bool:
        return len(self.tokens) >= self.depth

    def _take(self) -> None:
        q = torch.softmax(self.logits[:, 0].float(), dim=-1)  # [B, V]
        token = first_max_index(q)  # first maximum: the lowest id on ties
        self.tokens.append(token)
        self.probs.append(torch.gather(q, 1, token.unsqueeze(1)).squeeze(1))

    def extend(self) -> None:
        """Forward the last drafted token and draft the next level (one drafter pass)."""
        batch = self.tokens[-1].shape[0]
        base = self.drafter.num_block(self.state)
        parent = torch.full((batch, 1), self.entries[-1], dtype=torch.long, device=self.logits.device)
        self.logits = self.drafter.forward(self.state, self.tokens[-1].unsqueeze(1), parent)
        self.entries.append(base)
        self._take()

    def finish(self) -> None:
        while not self.done:
            self.extend()

    def confidences(self) -> torch.Tensor:
        """``[B, j + 1]`` float32 path confidences of the drafted levels (root 1): the float64 running product
        of the float32 probabilities, rounded once, as :func:`~spec_fast.drafts.topk.draft_topk_tree` keeps them."""
        taken = torch.stack(self.probs, dim=1).double()
        ones = torch.ones_like(taken[:, :1])
        return torch.cat([ones, torch.cumprod(taken, dim=1)], dim=1).float()

    def batch(self, roots: Sequence[int]) -> DraftBatch:
        """The drafted levels as a deterministic chain (a chain stopped early is shorter than ``depth``)."""
        drafted = torch.stack(self.tokens, dim=1)  # [B, j]
        batch, levels = drafted.shape
        device = drafted.device
        pad = torch.full((batch, 1), -1, dtype=torch.long, device=device)
        steps = torch.arange(levels + 1, device=device).unsqueeze(0).expand(batch, levels + 1)
        tree = FlatTree(tokens=torch.cat([pad, drafted], dim=1), parents=steps - 1, depths=steps.clone(),
                        draws=torch.cat([drafted, pad], dim=1).unsqueeze(-1),
                        valid=torch.ones(batch, levels + 1, dtype=torch.bool, device=device), process="deterministic")
        entry_row = torch.tensor(self.entries[:levels] + [-1], dtype=torch.long, device=device)
        roots_in = torch.tensor(list(roots), dtype=torch.long, device=device).unsqueeze(1)
        return DraftBatch(tree, None, self.confidences(), entry_row.unsqueeze(0).expand(batch, levels + 1).contiguous(),
                          torch.cat([roots_in, drafted], dim=1), self.width, levels)


def _filled(values: torch.Tensor, depth: int) -> torch.Tensor:
    """``values [B, j + 1]`` widened to ``[B, depth + 1]`` by repeating the last column (the bound of a chain
    whose undrafted nodes keep the last drafted node's value)."""
    missing = depth + 1 - values.shape[1]
    return values if missing <= 0 else torch.cat([values, values[:, -1:].expand(-1, missing)], dim=1)


def _score(chain: TopChain, roots: Sequence[int], calibration: RouteCalibration | None, head: int
           ) -> tuple[torch.Tensor, DraftBatch | None, torch.Tensor | None]:
    """``(score [B] float64, draft, match lengths)`` of head ``head``'s chain so far: the mean confidence
    (no draft built), or the expected accepted length under ``calibration`` (with the draft and the head's
    :func:`node_match_lengths`, read before the commit clears the drafter's block); exact for a finished
    chain, else the upper bound of the module docstring."""
    if calibration is None:
        return _chain_mean(_filled(chain.confidences(), chain.depth)), None, None
    draft = chain.batch(roots)
    lengths = node_match_lengths(chain.drafter, chain.state, draft)
    conf = _filled(calibrated_confidences(draft, calibration, head, lengths), chain.depth)
    return conf[:, 1:].sum(dim=1), draft, lengths


def _draft_routed_chains(dual: DualDrafter, heads: Sequence[HeadTrack], roots: Sequence[int], depth: int,
                         calibration: RouteCalibration | None, device: torch.device) -> DualDraft:
    """Route between two top-1 chains, stopping the head drafted second once it cannot win."""
    # a model-free head costs no pass: draft it in full first, so that the other can stop early
    first = 1 if isinstance(dual.second, RetrievalDrafter) and not isinstance(dual.first, RetrievalDrafter) else 0
    later = 1 - first
    # a model head's probabilities are practically never exactly 1, so only a model-free head 1 (then drafted
    # first) is worth the host read that asks whether the other head can win at all
    certain_first = isinstance(dual.first, RetrievalDrafter)
    chains: dict[int, TopChain] = {}
    lengths: list[torch.Tensor | None] = [None, None]
    scores: list[torch.Tensor] = [torch.zeros(0), torch.zeros(0)]
    drafts: list[DraftBatch | None] = [None, None]
    for h in (first, later):
        track = heads[h]
        if h == later and calibration is None and certain_first:
            bound = _unstarted_bound(scores[first], depth)
            if _cannot_win(scores[first], bound, later + 1):  # not even a pass: the module docstring
                return _skip_second(heads, chains[first], roots, scores[first], bound, device)
        chain = TopChain.start(track.drafter, track.state, track.pending, depth, device)
        track.pending_width = chain.width
        chains[h] = chain
        if h == first:
            chain.finish()
        while True:
            scores[h], drafts[h], lengths[h] = _score(chain, roots, calibration, h + 1)
            if chain.done or _cannot_win(scores[first], scores[later], later + 1):
                break
            chain.extend()
    a, b = (d if d is not None else chains[h].batch(roots) for h, d in enumerate(drafts))
    stopped = [None if chains[h].done else chains[h] for h in range(2)]
    chosen = select_heads(a, b, scores[0] >= scores[1])
    if calibration is None:  # a stopped head's reported mean is the bound it lost with
        chosen = replace(chosen, mean_confidences=torch.stack(scores, dim=1))
    else:  # reported: each head's expected accepted length over the nodes it drafted
        expected = [scores[h] if stopped[h] is None else expected_accepted(d, calibration, h + 1, lengths[h])
                    for h, d in enumerate((a, b))]
        chosen = replace(chosen, expected_accepted=torch.stack(expected, dim=1),
                         head_match_lengths=(lengths[0], lengths[1]))
    return replace(chosen, stopped=(stopped[0], stopped[1]))


def _chain_mean(confidences: torch.Tensor) -> torch.Tensor:
    """``[B]`` float64: the mean of a chain's ``confidences [B, L + 1]`` over its nodes (the root excluded),
    by the reduction of :func:`~spec_fast.drafts.dual.mean_confidence`."""
    nodes = torch.ones_like(confidences, dtype=torch.bool)
    nodes[:, 0] = False
    return confidence_mean(confidences, nodes)


def _unstarted_bound(first_score: torch.Tensor, depth: int) -> torch.Tensor:
    """``[B]`` float64: the score bound of a chain not drafted yet, every confidence 1 (the root's)."""
    return _chain_mean(torch.ones(first_score.shape[0], depth + 1, dtype=torch.float32, device=first_score.device))


def _skip_second(heads: Sequence[HeadTrack], chain: TopChain, roots: Sequence[int], first_score: torch.Tensor,
                 bound: torch.Tensor, device: torch.device) -> DualDraft:
    """The routed draft when only head 1 drafted: its ``chain``, on every row. Head 2 gets a stand-in draft
    (the root alone, no block entry) and ``pending_width`` 0, and is marked skipped, so the commit queues
    everything committed as its pending tokens (:func:`spec_fast.engine.commit.advance_head`); its reported mean is
    the ``bound`` it lost with, as for a stopped head."""
    heads[1].pending_width = 0
    pick_first = torch.ones(len(roots), dtype=torch.bool, device=device)
    chosen = select_heads(chain.batch(roots), draft_root_only(roots, "deterministic", device), pick_first)
    return replace(chosen, mean_confidences=torch.stack((first_score, bound), dim=1), skipped=(False, True))


def _cannot_win(first_score: torch.Tensor, bound: torch.Tensor, head: int) -> bool:
    """True when, on every row, head ``head`` (1 or 2), whose score is at most ``bound [B]``, loses to the
    other head's exact ``first_score [B]``: head 1 wins ties, so head 1 loses only strictly below, head 2
    at or below. One host read."""
    loses = bound < first_score if head == 1 else bound <= first_score
    return bool(loses.all())


def draft_dual(dual: DualDrafter, heads: Sequence[HeadTrack], roots: Sequence[int], depth: int, chain: bool,
               top_k: int, budget: int, greedy: bool, calibration: RouteCalibration | None,
               device: torch.device) -> DualDraft:
    """This step's dual draft below ``roots``: each head's top-1 chain of ``depth`` (``chain``) or its top-k tree
    (``top_k``, ``budget``), merged (``merge_trees`` at T = 0, ``union_tree`` otherwise) or routed
    (``calibration``: the call's :class:`RouteCalibration` for ``route-calibrated``, else None)."""
    routed = dual.mode != "merge"
    if chain and routed:
        return _draft_routed_chains(dual, heads, roots, depth, calibration, device)
    drafts: list[DraftBatch] = []
    lengths: list[torch.Tensor | None] = []
    for track in heads:
        if chain:
            top = TopChain.start(track.drafter, track.state, track.pending, depth, device)
            top.finish()
            drafts.append(top.batch(roots))
        else:
            drafts.append(draft_topk_tree(track.drafter, track.state, track.pending, roots, depth, top_k, budget,
                                          device))
        track.pending_width = drafts[-1].pending_width
        if calibration is not None:  # read before the commit clears the drafter's block
            lengths.append(node_match_lengths(track.drafter, track.state, drafts[-1]))
    if dual.mode == "route":
        return route(drafts[0], drafts[1])
    if calibration is not None:
        return calibrated_route(drafts[0], drafts[1], calibration, (lengths[0], lengths[1]))
    return (merge_trees if greedy else union_tree)(drafts[0], drafts[1])


def finish_for_calibration(dual: DualDraft, verified: Verified, calibration: RouteCalibration,
                           active: Sequence[bool], roots: Sequence[int]) -> DualDraft:
    """Before the commit of a ``route-calibrated`` step: draft the remaining levels of every head that
    stopped early where its drafted chain matches the committed block and the block goes deeper (its next
    node is offered; module docstring). Returns ``dual`` with those heads' full drafts, scores and match
    lengths; at most one host read per stopped head."""
    if dual.head_drafts is None or all(c is None for c in dual.stopped):
        return dual
    block = committed_block(dual.batch.tree.tokens, verified.accepted_slots, verified.accepted_depth,
                            verified.next_token)  # [B, D + 1]
    rows = torch.tensor(list(active), dtype=torch.bool, device=block.device)
    drafts = list(dual.head_drafts)
    lengths = list(dual.head_match_lengths)
    expected = dual.expected_accepted
    stopped = list(dual.stopped)
    for h, chain in enumerate(dual.stopped):
        if not isinstance(chain, TopChain):
            continue
        levels = len(chain.tokens)
        drafted = torch.stack(chain.tokens, dim=1)  # [B, j]
        reaches = (block[:, levels:levels + 1] >= 0).squeeze(1) if block.shape[1] > levels else torch.zeros_like(rows)
        on_text = (drafted == block[:, :levels]).all(dim=1)
        if not bool((rows & reaches & on_text).any()):
            continue
        chain.finish()
        drafts[h] = chain.batch(roots)
        lengths[h] = node_match_lengths(chain.drafter, chain.state, drafts[h])
        if expected is not None:
            full = expected_accepted(drafts[h], calibration, h + 1, lengths[h])
            expected = expected.clone()
            expected[:, h] = full
        stopped[h] = None
    return replace(dual, head_drafts=(drafts[0], drafts[1]), head_match_lengths=(lengths[0], lengths[1]),
                   expected_accepted=expected, stopped=(stopped[0], stopped[1]))


@dataclass
class RouteRows:
    """``route-calibrated``: per row, the calibration of draft probability to acceptance (None otherwise)."""

    calibration: RouteCalibration | None

    def take_rows(self, rows: list[int]) -> RouteRows:
        if self.calibration is None:
            return self
        mine = self.calibration
        index = torch.tensor(rows, dtype=torch.long, device=mine.offers.device)
        return RouteRows(replace(mine, offers=mine.offers.index_select(0, index),
                                 matches=mine.matches.index_select(0, index)))

    def join(self, other: ProposerRows) -> RouteRows:
        assert isinstance(other, RouteRows)
        mine, theirs = self.calibration, other.calibration
        if mine is None or theirs is None:
            return self
        return RouteRows(replace(mine, offers=torch.cat([mine.offers, theirs.offers]),
                                 matches=torch.cat([mine.matches, theirs.matches])))


class DualProposer(PlainProposer):
    """Two drafters merged into one tree or routed (:class:`DualDrafter`), each drafting the strategy's
    deterministic ``chain`` or ``topk`` tree."""

    def __init__(self, strategy: Strategy, drafter: DualDrafter) -> None:
        if strategy.shape not in ("chain", "topk"):
            raise ValueError(f"a dual draft needs a deterministic 'chain' or 'topk' strategy per head, got "
                             f"strategy {strategy.label()!r}")
        super().__init__(strategy)
        self.dual = drafter
        self.most_draws = strategy.top_k if strategy.shape == "topk" else 1
        self.greedy_argmax = strategy.shape == "chain"

    def compatible(self, sampling: SamplingParams, running: Sequence[SamplingParams],
                   admitted: Sequence[SamplingParams]) -> bool:
        # merge or route decides for the whole batch whether it is greedy
        return all(s.greedy == sampling.greedy for s in [*running, *admitted])

    def drafters(self) -> tuple[Drafter, ...]:
        return self.dual.heads

    def begin(self, batch: int, device: torch.device,
              previous: tuple[torch.Tensor, torch.Tensor] | None) -> ProposerRows:
        if self.dual.mode != "route-calibrated":
            return RouteRows(None)
        return RouteRows(RouteCalibration.start(batch, device, self.dual.initial_calibration()))

    def draft(self, rows: StepRows, depth_cap: int, law: DraftLaw, device: torch.device
              ) -> tuple[DraftBatch, DualDraft | None]:
        state = rows.proposal
        assert isinstance(state, RouteRows)
        strategy = self.strategy
        dual = draft_dual(self.dual, rows.heads, rows.roots, depth_cap, strategy.shape == "chain", strategy.top_k,
                          strategy.budget, batch_greedy(rows.samplings), state.calibration, device)
        capped = cap_rows(dual.batch, rows.depth_caps)
        return capped, replace(dual, batch=capped)

    def after_verify(self, rows: StepRows, draft: DraftBatch, dual: DualDraft | None, verified: Verified,
                     target_logits: torch.Tensor, target_hidden: torch.Tensor | None) -> DualDraft | None:
        state = rows.proposal
        assert isinstance(state, RouteRows)
        if dual is None or state.calibration is None:
            return dual
        # the losing head's counts need its full chain
        return finish_for_calibration(dual, verified, state.calibration, rows.active, rows.roots)

    def after_commit(self, rows: StepRows, dual: DualDraft | None, verified: Verified, accepted: Sequence[int]
                     ) -> None:
        state = rows.proposal
        assert isinstance(state, RouteRows)
        if dual is not None and state.calibration is not None:  # both heads against the committed block
            state.calibration = observe_committed(state.calibration, dual, verified.accepted_slots,
                                                  verified.accepted_depth, verified.next_token, rows.active)
