"""Decoding with the NDE selector (seed 002 (docs/papers.md) section 6): one delayed-tree shape per step.

Each step of ``--strategy nde`` (:class:`~spec_fast.engine.SpeculativeDecoder`):

1. the drafter consumes the row's pending tokens (ending with the root), as every builder does;
2. :meth:`NdeSelector.choose` computes the appendix-E root features (:func:`spec_fast.nde.selector.root_features`)
   from tensors the step already has -- no extra target pass (seed 002 footnote 4):

   * ``h_prev^p``, ``p_prev``: the target's final hidden state and law (:func:`spec_fast.nde.selector.feature_law`
     of its logits) at the token before the root, from the previous verification pass (the accepted
     path's last slot) or, on the first step, from the prefill;
   * ``h_prev^q``, ``q_prev``: the draft's at the token before the root: from this step's pending forward
     when the drafter had that token pending, else the last entry it committed
     (:class:`HiddenRecorder`); ``h_cur^q``, ``q_root``: the draft's at the root (pending forward);
   * ``|x|``, temperature, top-p, and ``t_q(|x|)``, ``t_p(|x|)`` of the warm-up latency model
     (:mod:`spec_fast.nde.latency`, measured on the machine in use);

   runs :class:`~spec_fast.nde.selector.SelectorNet` and takes the most probable tree (the policy summed over
   the actions of each distinct tree, :meth:`~spec_fast.nde.selector.SelectorNet.select`). A batch gets one
   shape per step: the most probable tree of the policy averaged over the active rows (the delayed
   builder drafts one shape for the whole batch);
3. the engine drafts that ``(K, L1, L2)`` delayed tree below the root logits of step 1 (L1 + L2 = 0: no
   draft token, a plain step) and verifies it with the strategy's OT verifier.

The shape is a function of the committed context only, fixed before any draft or verification draw of the
step, so every step is an exact OT verification of a fixed-shape delayed tree and the output law is the
target's (the sampling tests exercise per-step shape changes). The selector's own cost (features, network,
the choice read back to the host) is timed per step into ``GenerationMetrics.selector_s``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from spec_fast.decoding import SamplingParams
from spec_fast.drafts.batch import DraftBatch, DraftLaw, HeadTrack, draft_root_only, pending_forward
from spec_fast.drafts.delayed import draft_delayed_tree
from spec_fast.drafts.dual import DualDraft
from spec_fast.drafts.model import Drafter
from spec_fast.drafts.proposer import PlainProposer, ProposerRows, StepRows
from spec_fast.strategies import Strategy
from spec_fast.verify.tree import Verified
from spec_fast.nde.latency import LatencyModel
from spec_fast.nde.selector import SelectorNet, feature_law, root_features

__all__ = ["HiddenRecorder", "NdeSelector", "NdeChoice", "DEFAULT_SELECTOR_WEIGHTS", "load_nde_selector", "stored_latency",
           "check_nde_drafter", "draft_nde", "NdeProposer", "NdeRows"]

DEFAULT_SELECTOR_WEIGHTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "weights",
                                        "selector.safetensors")


def check_nde_drafter(drafter: Drafter | None) -> Drafter:
    """The drafter if it exposes its hidden states (``draft_hidden_size > 0``), else a ``ValueError``."""
    if drafter is None or int(getattr(drafter, "draft_hidden_size", 0)) < 1:
        name = type(drafter).__name__ if drafter is not None else "None"
        raise ValueError(
            f"strategy 'nde' reads the draft model's hidden states, which drafter {name} does not expose; "
            "use a model draft (e.g. --draft distilled or an early-exit/HF draft model)"
        )
    return drafter


class HiddenRecorder(Drafter):
    """A drafter wrapper made per ``generate`` call: forwards through :meth:`Drafter.forward_hidden` and
    keeps the logits and final hidden states of the block entries since the last commit; on commit it
    remembers each row's last kept entry (``last_logits [B, V]``, ``last_hidden [B, H]``), i.e. the last
    token the drafter holds in its context. Everything else is delegated."""

    def __init__(self, inner: Drafter) -> None:
        self.inner = check_nde_drafter(inner)
        self.vocab_size = inner.vocab_size
        self.draft_hidden_size = inner.draft_hidden_size
        # a trained head (rnn, eagle) advances from the verifier's hidden states: pass them through
        self.wants_target_hidden = bool(getattr(inner, "wants_target_hidden", False))
        self.chunks: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (first entry, logits, hidden)
        self.last_logits: torch.Tensor | None = None
        self.last_hidden: torch.Tensor | None = None

    def begin(self, batch_size: int, device: torch.device) -> Any:
        return self.inner.begin(batch_size, device)

    def observe_target(self, state: Any, target_hidden: torch.Tensor, keep: torch.Tensor | None = None,
                       counts: torch.Tensor | None = None) -> None:
        self.inner.observe_target(state, target_hidden, keep, counts)

    def forward(self, state: Any, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        base = self.inner.num_block(state)
        logits, hidden = self.inner.forward_hidden(state, tokens, parents)
        self.chunks.append((base, logits, hidden))
        return logits

    def forward_hidden(self, state: Any, tokens: torch.Tensor, parents: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        self.forward(state, tokens, parents)
        return self.chunks[-1][1], self.chunks[-1][2]

    def entry_outputs(self, entries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logits [B, V], hidden [B, H])`` at block entry ``entries[b]`` of each row (``entries [B]``,
        entries of this block only)."""
        logits_out: torch.Tensor | None = None
        hidden_out: torch.Tensor | None = None
        for base, logits, hidden in self.chunks:
            width = int(logits.shape[1])
            local = (entries - base).clamp(0, width - 1)
            inside = ((entries >= base) & (entries < base + width)).unsqueeze(1)
            got_l = logits.gather(1, local.view(-1, 1, 1).expand(-1, 1, logits.shape[2])).squeeze(1)
            got_h = hidden.gather(1, local.view(-1, 1, 1).expand(-1, 1, hidden.shape[2])).squeeze(1)
            logits_out = got_l if logits_out is None else torch.where(inside, got_l, logits_out)
            hidden_out = got_h if hidden_out is None else torch.where(inside, got_h, hidden_out)
        if logits_out is None or hidden_out is None:
            raise ValueError("the drafter has no block entries since its last commit")
        return logits_out, hidden_out

    def commit(self, state: Any, keep: torch.Tensor, counts: torch.Tensor, prefix_of_block: bool = False) -> None:
        if self.chunks:
            last = keep.gather(1, (counts - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
            logits, hidden = self.entry_outputs(last)
            kept = (counts > 0).unsqueeze(1)
            if self.last_logits is not None and self.last_hidden is not None:
                logits = torch.where(kept, logits, self.last_logits)
                hidden = torch.where(kept, hidden, self.last_hidden)
            self.last_logits, self.last_hidden = logits, hidden
        self.chunks = []
        self.inner.commit(state, keep, counts, prefix_of_block)

    def num_block(self, state: Any) -> int:
        return self.inner.num_block(state)

    def take_rows(self, state: Any, rows: list[int]) -> Any:
        if self.last_logits is not None and self.last_hidden is not None:
            index = torch.tensor(rows, dtype=torch.long, device=self.last_logits.device)
            self.last_logits = self.last_logits.index_select(0, index)
            self.last_hidden = self.last_hidden.index_select(0, index)
        return self.inner.take_rows(state, rows)

    def passes(self, state: Any) -> int:
        return self.inner.passes(state)


@dataclass(frozen=True)
class NdeChoice:
    """One step's choice: the action ``(K, L1, L2)``, its index in the selector's action space, the
    seconds the selector took."""

    action: tuple[int, int, int]
    index: int
    seconds: float


class NdeSelector:
    """A trained :class:`SelectorNet` plus the latency model of the machine in use (eq. 11's t_q, t_p)."""

    def __init__(self, net: SelectorNet, latency: LatencyModel) -> None:
        self.net = net.eval()
        self.latency = latency
        self.actions = net.config.actions

    def check_sizes(self, target_hidden_size: int, draft_hidden_size: int, bounds: tuple[int, int, int]) -> None:
        config = self.net.config
        if (config.target_hidden_size, config.draft_hidden_size) != (target_hidden_size, draft_hidden_size):
            raise ValueError(
                f"the selector expects hidden sizes (target {config.target_hidden_size}, draft "
                f"{config.draft_hidden_size}), the models have (target {target_hidden_size}, draft {draft_hidden_size})"
            )
        have = (config.max_branches, config.max_trunk, config.max_branch_length)
        if any(h > b for h, b in zip(have, bounds)):
            raise ValueError(f"the selector's action bounds (K, L1, L2) <= {have} exceed the strategy's {bounds}")

    @torch.no_grad()
    def choose(
        self,
        target_hidden_prev: torch.Tensor,
        target_logits_prev: torch.Tensor,
        draft_hidden_prev: torch.Tensor,
        draft_logits_prev: torch.Tensor,
        draft_hidden_root: torch.Tensor,
        draft_logits_root: torch.Tensor,
        context_lengths: Sequence[int],
        active: Sequence[bool],
        sampling: SamplingParams,
    ) -> NdeChoice:
        """The step's action from ``[B, H]`` hidden states and ``[B, V]`` logits (module docstring): the laws
        of the features are :func:`spec_fast.nde.selector.feature_law` of the logits (no decoding operator)."""
        start = time.perf_counter()
        device = target_logits_prev.device
        batch = int(target_logits_prev.shape[0])
        p_prev = feature_law(target_logits_prev, sampling.temperature)
        q_prev = feature_law(draft_logits_prev, sampling.temperature)
        q_root = feature_law(draft_logits_root, sampling.temperature)
        lengths = [int(n) for n in context_lengths]

        def column(values: Sequence[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32, device=device)

        features = root_features(
            target_hidden_prev, draft_hidden_prev, draft_hidden_root, p_prev, q_prev, q_root,
            column([float(n) for n in lengths]), column([sampling.temperature] * batch),
            column([sampling.top_p] * batch), column([self.latency.draft_time(n) for n in lengths]),
            column([self.latency.target_time(n) for n in lengths]), validate=False,
        )
        policy = self.net.tree_probs(self.net(features))  # [B, trees]
        rows = torch.tensor([b for b in range(batch) if active[b]] or [0], device=device)
        index = int(self.net.representative(policy.index_select(0, rows).mean(dim=0).argmax()))
        return NdeChoice(self.actions[index], index, time.perf_counter() - start)


def stored_latency(metadata: dict[str, str], key: str) -> LatencyModel | None:
    """The latency model the selector's training data was built with (in the weights' metadata), if it was
    measured on this machine, device and thread count with this warm-up version (``key``: a
    :func:`spec_fast.nde.latency.cache_key`); else None."""
    import json

    stored = json.loads(metadata.get("dataset_header", "{}")).get("latency_model")
    if not isinstance(stored, dict):
        return None
    model = LatencyModel.from_json(stored)
    have, want = model.key.split("|"), key.split("|")
    return model if len(have) == len(want) and have[:5] == want[:5] and have[-1] == want[-1] else None


def load_nde_selector(target: Any, drafter: Drafter, path: str | None = None,
                      latency_cache: str | None = "default", device: torch.device | str = "cpu",
                      prefer_stored: bool = True) -> NdeSelector:
    """The committed selector weights (``path``, default :data:`DEFAULT_SELECTOR_WEIGHTS`) and a latency
    model for the features ``t_q(|x|)``, ``t_p(|x|)``: with ``prefer_stored``, the one the training data
    was built with when that was measured on this machine (:func:`stored_latency`; the dataset comes from
    one machine, so the policy only ever saw that model's values, and a fresh warm-up under another load
    would shift two standardised features); else one measured here by the warm-up microbenchmark (cached
    per machine/configuration in ``~/.cache/spec_verify/latency.json``; ``latency_cache=None`` always
    measures)."""
    from spec_fast.drafts.model import ModelDrafter
    from spec_fast.nde.latency import cache_key, load_or_measure, measure_latency
    from spec_fast.nde.selector_training import load_selector

    check_nde_drafter(drafter)
    net, metadata = load_selector(path or DEFAULT_SELECTOR_WEIGHTS)
    if latency_cache == "default":
        latency_cache = os.path.join(os.path.expanduser("~"), ".cache", "spec_verify", "latency.json")
    vocab = int(target.get_output_embeddings().weight.shape[0])
    name = str(getattr(target.config, "_name_or_path", "") or type(target).__name__)
    key = cache_key(name, type(drafter).__name__ + f"/{drafter.draft_hidden_size}",
                    str(next(target.parameters()).dtype), device)
    latency = stored_latency(metadata, key) if prefer_stored else None
    if latency is None:
        latency = load_or_measure(latency_cache, key,
                                  lambda: measure_latency(ModelDrafter(target), drafter, vocab, device=device))
    return NdeSelector(net.to(device), latency)


def draft_nde(st: StepRows, head: HeadTrack, selector: NdeSelector, depth_caps: Sequence[int],
              draft_law: DraftLaw, device: torch.device) -> DraftBatch:
    """One ``nde`` draft: the selector picks (K, L1, L2) from the root features, then the delayed builder
    drafts that tree below the root logits of the pending forward (L1 + L2 = 0: the root alone). Sets
    ``head.pending_width`` and counts the choice in ``st.metrics``."""
    recorder = head.drafter
    previous = st.proposal
    assert isinstance(recorder, HiddenRecorder) and isinstance(previous, NdeRows) and previous.previous is not None
    root_logits, width = pending_forward(recorder, head.state, head.pending, device)
    batch = len(head.pending)
    draft_logits_root, draft_hidden_root = recorder.entry_outputs(
        torch.full((batch,), width - 1, dtype=torch.long, device=device))
    # the token before the root: pending (then this block's entry width - 2) or the last committed entry
    draft_logits_prev, draft_hidden_prev = (recorder.last_logits, recorder.last_hidden)
    if width >= 2:
        pending_logits, pending_hidden = recorder.entry_outputs(
            torch.full((batch,), width - 2, dtype=torch.long, device=device))
        in_block = torch.tensor([len(p) >= 2 for p in head.pending], device=device).unsqueeze(1)
        if draft_logits_prev is None or draft_hidden_prev is None:
            draft_logits_prev, draft_hidden_prev = pending_logits, pending_hidden
        else:
            draft_logits_prev = torch.where(in_block, pending_logits, draft_logits_prev)
            draft_hidden_prev = torch.where(in_block, pending_hidden, draft_hidden_prev)
    if draft_logits_prev is None or draft_hidden_prev is None:  # a one-token prompt: no token before it
        draft_logits_prev, draft_hidden_prev = draft_logits_root, draft_hidden_root
    target_logits_prev, target_hidden_prev = previous.previous
    choice = selector.choose(target_hidden_prev, target_logits_prev, draft_hidden_prev, draft_logits_prev,
                             draft_hidden_root, draft_logits_root, [len(c) for c in st.committed], st.active,
                             st.sampling)
    metrics = st.metrics
    metrics.selector_s += choice.seconds
    metrics.selector_steps += 1
    name = ",".join(str(v) for v in choice.action)
    metrics.nde_actions[name] = metrics.nde_actions.get(name, 0) + 1
    num_paths, trunk, branch = choice.action
    depths = [min(trunk + branch, cap) for cap in depth_caps]  # near max_new_tokens the tree is cut (branches first)
    depth = max(depths)
    head.pending_width = width
    if depth == 0:  # a plain step; the drafter has consumed its pending tokens, the root is entry width - 1
        plain = draft_root_only(st.roots, "iid", device)
        return replace(plain, entries=torch.full_like(plain.entries, width - 1), pending_width=width)
    return draft_delayed_tree(recorder, head.state, head.pending, st.roots, depths, num_paths, min(trunk, depth),
                              draft_law, st.draft_streams(), device, root=(root_logits, width))


@dataclass
class NdeRows:
    """Per row: the target's (logits ``[B, V]``, final hidden state ``[B, H]``) at the token before the root
    (from the prefill, then from each verification pass)."""

    previous: tuple[torch.Tensor, torch.Tensor] | None

    def take_rows(self, rows: list[int]) -> NdeRows:
        if self.previous is None:
            return self
        index = torch.tensor(rows, dtype=torch.long, device=self.previous[0].device)
        return NdeRows((self.previous[0].index_select(0, index), self.previous[1].index_select(0, index)))

    def join(self, other: ProposerRows) -> NdeRows:
        raise ValueError("strategy 'nde' decodes static batches: a request cannot join a running one")


class NdeProposer(PlainProposer):
    """``nde:VERIFIER``: the selector picks one delayed (K, L1, L2) shape per step (:func:`draft_nde`).

    Needs a drafter that exposes its hidden states (``ValueError`` otherwise); ``selector`` defaults to
    :func:`load_nde_selector` (the committed weights and a latency model measured on this machine)."""

    reads_target_hidden = True
    reads_previous = True

    def __init__(self, strategy: Strategy, target: Any, drafter: Drafter | None,
                 selector: NdeSelector | None = None) -> None:
        checked = check_nde_drafter(drafter)
        super().__init__(strategy)
        self.most_draws = strategy.num_paths  # the largest K the selector may pick
        self.nde_drafter = checked
        self.selector = selector if selector is not None else load_nde_selector(
            target, checked, device=next(target.parameters()).device)
        self.selector.check_sizes(int(target.get_output_embeddings().weight.shape[1]), checked.draft_hidden_size,
                                  (strategy.num_paths, strategy.trunk, strategy.depth - strategy.trunk))

    def drafters(self) -> tuple[Drafter, ...]:
        # per call: the recorder keeps this call's draft outputs
        return (HiddenRecorder(self.nde_drafter),)

    def begin(self, batch: int, device: torch.device,
              previous: tuple[torch.Tensor, torch.Tensor] | None) -> ProposerRows:
        return NdeRows(previous)

    def compatible(self, sampling: SamplingParams, running: Sequence[SamplingParams],
                   admitted: Sequence[SamplingParams]) -> bool:
        # static batches of one sampling law: the selector decides one shape for the whole batch
        return not running and all(s.law == sampling.law for s in admitted)

    def draft(self, rows: StepRows, depth_cap: int, law: DraftLaw, device: torch.device
              ) -> tuple[DraftBatch, DualDraft | None]:
        return draft_nde(rows, rows.heads[0], self.selector, rows.depth_caps, law, device), None

    def after_verify(self, rows: StepRows, draft: DraftBatch, dual: DualDraft | None, verified: Verified,
                     target_logits: torch.Tensor, target_hidden: torch.Tensor | None) -> DualDraft | None:
        state = rows.proposal
        assert isinstance(state, NdeRows)
        if target_hidden is not None:
            # the target at the new root's preceding token: the accepted path's last slot
            last = verified.accepted_slots.gather(1, verified.accepted_depth.unsqueeze(1))  # [B, 1]
            state.previous = (_take_slot(target_logits, last), _take_slot(target_hidden, last))
        return dual


def _take_slot(values: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``values [B, N, X]`` at ``slots [B, 1]`` -> ``[B, X]``."""
    return values.gather(1, slots.unsqueeze(2).expand(-1, 1, values.shape[2])).squeeze(1)
