"""SpeculativeDecoder: the step loop of speculative decoding over HF causal LMs (tree attention, KV caches).

One step, batched over ``B`` rows (each row = one request), one method per phase:

1. **draft** (:meth:`SpeculativeDecoder._draft_phase`): each drafter first consumes the row's *pending*
   tokens (committed tokens its cache lacks, ending with the *root token*, the last committed token), then
   the strategy's proposer (:func:`spec_fast.engine.proposers.make_proposer`; e.g.
   :class:`spec_fast.drafts.chain.ChainProposer`, or :class:`spec_fast.drafts.dual_drafting.DualProposer`,
   which drafts with both heads of a :class:`~spec_fast.drafts.dual.DualDrafter` and merges or routes their
   trees) grows the tree. Row b's tree is at most ``min(depth, tokens it may still emit - 1)`` deep, whatever
   the other rows need. The proposer also reads the verification and the commit (its ``after_verify`` and
   ``after_commit`` hooks) for the per-request state it keeps in ``DecodeState.proposal``.
2. **target** (:meth:`~SpeculativeDecoder._target_phase`): one batched pass over the whole tree (slot 0 =
   root token, then the drafted nodes) with the ancestor mask and depth positions -> logits ``[B, N, V]``.
   The prefill runs the whole prompt, so a row's first step takes the root's logits from it and forwards
   the drafted nodes only: N generated tokens by plain decoding cost the prefill plus N - 1 passes, as HF
   ``generate``.
3. **verify** (:meth:`~SpeculativeDecoder._verify_phase`): :func:`spec_fast.verify.verify_greedy` for rows
   at temperature 0 (docs/algorithms.md section 8), else :func:`spec_fast.verify.verify_tree` with
   ``target_probs = G(target logits)`` (each row its own G) and ``draft_probs`` = the very tensor the
   drafts were sampled from.
4. **commit** (:meth:`~SpeculativeDecoder._commit_phase`): target and draft caches keep exactly the
   accepted path by gathering its entries in place (:meth:`spec_fast.kv_cache.TreeKVCache.commit`);
   nothing accepted is re-run; a drafter lacking entries of the path gets them as pending tokens.

All per-request state lives in a :class:`~spec_fast.engine.decode_state.DecodeState`, whose rows may change between
steps (:class:`spec_fast.engine.batch_engine.BatchEngine` adds and removes requests); the decoder holds the models,
the strategy and (``+adaptive``) the greedy speed controller, whose choices never change greedy tokens. One
decoder may serve several threads at once, each with its own state.

Randomness (temperature > 0): every draw of a row comes from its own counter-based streams
(:mod:`spec_fast.draws`), keyed by the request's seed and advanced by its own steps, so a fixed seed
reproduces a request's output exactly, whatever else shares its batch (under a fixed strategy).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from spec_fast.decoding import SamplingParams
from spec_fast.drafts.batch import DraftBatch, HeadTrack, draft_root_only
from spec_fast.drafts.dual import DualDraft, DualDrafter
from spec_fast.drafts.model import Drafter
from spec_fast.draws import DRAFT, VERIFY, stream_keys
from spec_fast.engine.adaptive import AdaptiveController, match_hint
from spec_fast.engine.batch_depth import TIMED_ROWS, PassCost, choose_depth, measure_pass_cost, measure_step_cost
from spec_fast.engine.batch_engine import BatchEngine
from spec_fast.engine.commit import advance_head, aligned, is_block_prefix, pad_rows, read_back
from spec_fast.engine.decode_state import DecodeState
from spec_fast.engine.plain_step import plain_step
from spec_fast.engine.prefill import prefill_drafter, prefill_target, prefill_target_reusing
from spec_fast.engine.prefix_cache import PrefixCache
from spec_fast.engine.proposers import make_proposer
from spec_fast.engine.step_verify import VerifyStreams, draft_law, verify_rows, verify_sampled
from spec_fast.flat_tree import FlatTree
from spec_fast.kv_cache import TreeKVCache
from spec_fast.metrics import GenerationMetrics, peak_memory_bytes
from spec_fast.nde.proposer import NdeSelector
from spec_fast.strategies import Strategy
from spec_fast.verify.tree import TreeVerifyOutput, Verified

__all__ = ["SamplingParams", "GenerationResult", "SpeculativeDecoder", "DecodeState", "HeadTrack"]


@dataclass
class GenerationResult:
    """``tokens[b]``: the generated token ids of row b (EOS included when hit); ``trees``: the verified tree
    of every step (``generate(record_trees=True)``); ``state``: the final :class:`DecodeState`."""

    tokens: list[list[int]]
    metrics: GenerationMetrics = field(default_factory=GenerationMetrics)
    trees: list[FlatTree] = field(default_factory=list)
    state: DecodeState | None = None


class SpeculativeDecoder:
    """Speculative decoding of an HF causal LM ``target`` with a ``drafter`` under a :class:`Strategy`.

    ``drafter`` may be None only for ``Strategy(shape="ar")``; a :class:`~spec_fast.drafts.dual.DualDrafter`
    needs a ``chain`` or ``topk`` strategy (each head drafts that deterministic tree). Target and drafter
    must share the vocabulary. ``generate`` takes a batch of token-id prompts (ragged allowed).

    ``strategy.shape == "nde"`` needs a drafter that exposes its hidden states (``ValueError`` otherwise)
    and uses ``selector`` (default: :func:`spec_fast.nde.load_nde_selector`, the committed weights and a
    latency model measured on this machine).
    """

    def __init__(self, target: Any, drafter: Drafter | None, strategy: Strategy,
                 selector: NdeSelector | None = None) -> None:
        if strategy.drafts and drafter is None:
            raise ValueError(f"strategy {strategy.label()!r} needs a drafter, got drafter=None")
        #: the strategy's drafting side (:func:`spec_fast.engine.proposers.make_proposer`)
        self.proposer = make_proposer(strategy, target, drafter, selector)
        self.target = target
        self.drafter = drafter
        self.strategy = strategy
        self.vocab_size = int(target.get_output_embeddings().weight.shape[0])
        if drafter is not None and drafter.vocab_size != self.vocab_size:
            raise ValueError(
                f"target and draft vocabularies differ: target has {self.vocab_size} tokens, "
                f"draft has {drafter.vocab_size}"
            )
        self.device = next(target.parameters()).device
        #: ``+adaptive`` controller for greedy calls, kept across calls (it never changes greedy tokens)
        self.controller = AdaptiveController() if strategy.adaptive else None
        self._step_costs: dict[tuple[int, tuple[int, ...]], PassCost] = {}
        self.context_length = int(
            getattr(target.config, "max_position_embeddings", 0) or getattr(target.config, "n_positions", 0) or 0
        )

    def step_cost(self, max_rows: int = 8) -> PassCost:
        """The measured cost of one decoding step by (rows, draft depth + 1) that the ``cost`` depth policy reads
        (:func:`spec_fast.engine.batch_depth.measure_step_cost`; without drafts, the target pass's cost by rows
        and tokens, :func:`~spec_fast.engine.batch_depth.measure_pass_cost`), measured on first use at the
        current torch thread count (a few seconds) and kept. The row counts of
        :data:`~spec_fast.engine.batch_depth.TIMED_ROWS` are timed up to the first that holds ``max_rows`` (a
        batch engine's largest batch; the table scales the largest beyond it)."""
        rows = tuple(r for r in TIMED_ROWS if r < max_rows) + tuple(r for r in TIMED_ROWS if r >= max_rows)[:1]
        key = (torch.get_num_threads(), rows)
        if key not in self._step_costs:
            self._step_costs[key] = (measure_step_cost(self, self.strategy.depth, rows) if self.strategy.drafts
                                     else measure_pass_cost(self.target, self.device, rows))
        return self._step_costs[key]

    @property
    def dual(self) -> DualDrafter | None:
        return self.drafter if isinstance(self.drafter, DualDrafter) else None

    def _check_inputs(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> None:
        if len(prompts) == 0:
            raise ValueError("prompts must hold at least one prompt, got an empty batch")
        for b, prompt in enumerate(prompts):
            self.check_request(prompt, max_new_tokens, name=f"prompt {b}")

    def check_request(self, prompt: Sequence[int], max_new_tokens: int, sampling: SamplingParams | None = None,
                      name: str = "prompt") -> None:
        """A one-line ``ValueError`` naming the argument for a request this decoder cannot decode."""
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got max_new_tokens={max_new_tokens!r}")
        if len(prompt) == 0:
            raise ValueError(f"{name} is empty: give at least one token")
        bad = [t for t in prompt if not 0 <= int(t) < self.vocab_size]
        if bad:
            raise ValueError(f"{name} has token ids outside [0, {self.vocab_size}): {bad[:5]}")
        if self.context_length and len(prompt) + max_new_tokens > self.context_length:
            raise ValueError(
                f"{name} has {len(prompt)} tokens; with max_new_tokens={max_new_tokens} it exceeds "
                f"the model context of {self.context_length} tokens"
            )
        if sampling is not None:
            if not isinstance(sampling, SamplingParams):
                raise ValueError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
            if not sampling.greedy and self.strategy.drafts and self.strategy.verifier == "greedy":
                raise ValueError("verifier 'greedy' needs temperature 0; choose a sampling verifier")

    def label(self, sampling: SamplingParams) -> str:
        label = self.strategy.label()
        if self.strategy.drafts and sampling.greedy:
            label = label.replace(f"/{self.strategy.verifier}", "/greedy")
        elif self.dual is not None:
            label = label.replace(f"/{self.strategy.verifier}", "/nss")
        return label + (f"[dual {self.dual.mode}]" if self.dual is not None else "")

    # ------------------------------------------------------------------ main loop
    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[Sequence[int]] | torch.Tensor,
        max_new_tokens: int = 64,
        sampling: SamplingParams | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        on_tokens: Callable[[list[list[int]]], bool | None] | None = None,
        record_trees: bool = False,
    ) -> GenerationResult:
        """Generate up to ``max_new_tokens`` tokens for every prompt (token ids, ``[B, P]`` or ragged).

        ``on_tokens(new_tokens_per_row)`` is called after every step (streaming); when it returns True,
        generation ends after that step (stop strings). ``record_trees`` keeps every verified tree in
        ``result.trees``. A static batch on :class:`spec_fast.engine.batch_engine.BatchEngine`: every prompt is
        one request (row b draws from stream b of ``sampling.seed``), all admitted at once, and finished
        rows stay in the batch until the last ends (``result.state`` holds every row).
        """
        sampling = sampling or SamplingParams()
        if isinstance(prompts, torch.Tensor):
            prompts = prompts.tolist()
        prompt_lists = [[int(t) for t in p] for p in prompts]
        self._check_inputs(prompt_lists, max_new_tokens)
        self.check_request(prompt_lists[0], max_new_tokens, sampling)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        start = time.perf_counter()
        engine = BatchEngine(self, max_batch_size=len(prompt_lists), eos_token_id=eos_token_id, depth_policy="fixed",
                             static=True, record_trees=record_trees)
        ids = [engine.add_request(p, sampling, max_new_tokens, stream=b) for b, p in enumerate(prompt_lists)]
        row_of = {rid: b for b, rid in enumerate(ids)}
        first_token_time: float | None = None
        while engine.has_unfinished():
            new_tokens: list[list[int]] = [[] for _ in prompt_lists]
            for out in engine.step():
                new_tokens[row_of[out.request_id]] = out.new_tokens
            if first_token_time is None:
                first_token_time = time.perf_counter() - start
            if on_tokens is not None and on_tokens(new_tokens):
                break
        state = engine.state
        assert state is not None
        metrics = state.metrics
        metrics.wall_s = time.perf_counter() - start
        metrics.ttft_s = first_token_time or 0.0
        metrics.generated_tokens = sum(len(o) for o in state.outputs)
        metrics.target_passes = state.steps  # one verification per step (the prefill serves the first root)
        metrics.draft_passes = sum(h.drafter.passes(h.state) - (1 if h.prefilled else 0) for h in state.heads)
        metrics.peak_memory_bytes = peak_memory_bytes(self.device)
        return GenerationResult(tokens=state.outputs, metrics=metrics, trees=state.trees or [], state=state)

    def begin(self, prompts: list[list[int]], max_new: list[int], samplings: list[SamplingParams],
              streams: list[int], eos: set[int], record_trees: bool = False,
              prefix_cache: PrefixCache | None = None) -> DecodeState:
        """A state of ``len(prompts)`` new rows: the target (and the drafters, unless the controller starts
        with plain steps) prefilled, reusing cached prompt prefixes from ``prefix_cache`` where the strategy
        needs no target states of the prompt. Row b decodes ``prompts[b]`` with ``samplings[b]`` from stream
        ``streams[b]`` of its seed (:func:`spec_fast.draws.stream_keys`)."""
        batch = len(prompts)
        proposer = self.proposer
        drafters = proposer.drafters() if self.strategy.drafts else ()
        # trained heads read the verifier's hidden states of every committed entry (seed 000 (docs/papers.md)
        # section 7); the NDE selector reads the target's at the token before each root
        wants_hidden = proposer.reads_target_hidden or any(
            bool(getattr(d, "wants_target_hidden", False)) for d in drafters)
        target_cache = TreeKVCache(self.target, batch, self.device)
        if prefix_cache is not None and not wants_hidden and not proposer.reads_previous:
            root_logits, cached = prefill_target_reusing(target_cache, prompts, self.device, prefix_cache)
            root_hidden = observe = previous = None
        else:
            root_logits, root_hidden, observe, previous = prefill_target(target_cache, prompts, self.device,
                                                                         wants_hidden, proposer.reads_previous)
            cached = [0] * batch
        # +adaptive steers greedy rows only: at T > 0 the kind of a step changes which sample a seed gives
        controller = self.controller if all(s.greedy for s in samplings) else None
        # a controller that prefers plain steps skips the draft prefill: the prompt waits as pending tokens
        # (trained heads, which read the target's prefill states, always prefill)
        lazy = controller is not None and not wants_hidden and not controller.peek()
        heads = []
        for drafter in drafters:
            track = HeadTrack(drafter, drafter.begin(batch, self.device),
                              [list(p) if lazy else [p[-1]] for p in prompts])
            if observe is not None:
                drafter.observe_target(track.state, *observe)
            if not lazy:
                track.prefilled = prefill_drafter(drafter, track.state, prompts, self.device)
            heads.append(track)
        metrics = GenerationMetrics(strategy=self.label(samplings[0]), batch_size=batch,
                                    prompt_tokens=sum(len(p) for p in prompts), cached_prompt_tokens=sum(cached))
        if self.dual is not None:
            metrics.head_accepted_tokens = [0, 0]
            metrics.head_selected = [0, 0]

        return DecodeState(
            samplings=list(samplings), max_new=list(max_new), eos=set(eos), target_cache=target_cache, heads=heads,
            metrics=metrics, controller=controller, wants_hidden=wants_hidden, roots=[p[-1] for p in prompts],
            outputs=[[] for _ in range(batch)], committed=[list(p) for p in prompts], active=[True] * batch,
            draft_keys=stream_keys([s.seed for s in samplings], streams, DRAFT, self.device),
            verify_keys=stream_keys([s.seed for s in samplings], streams, VERIFY, self.device),
            row_steps=torch.zeros(batch, dtype=torch.long, device=self.device), fresh=[True] * batch,
            root_logits=root_logits, root_hidden=root_hidden, trees=[] if record_trees else None,
            proposal=proposer.begin(batch, self.device, previous), step_accepted=[-1] * batch,
            step_drafted=[-1] * batch, cached_prompt=cached,
        )

    def depth_caps(self, st: DecodeState) -> list[int]:
        """Row b's deepest draft this step: the strategy's depth, less where the row may emit fewer tokens
        (a function of the row alone, so its tree does not depend on its neighbours); with
        ``st.step_cost``, at most the depth :func:`spec_fast.engine.batch_depth.choose_depth` picks for the batch;
        0 where the proposer forecasts that the row's draft would not pay (:meth:`~spec_fast.drafts.proposer.
        Proposer.gate_caps`)."""
        depth = self.strategy.depth
        if st.step_cost is not None and self.strategy.drafts:
            evidence = st.depth_evidence
            depth = choose_depth(st.step_cost, sum(st.active), depth, evidence.reached, evidence.accepted)
        caps = [max(0, min(depth, st.max_new[b] - len(st.outputs[b]) - 1)) if st.active[b] else 0
                for b in range(st.batch_size)]
        return self.proposer.gate_caps(st, caps) if self.strategy.drafts and any(caps) else caps

    def step(self, st: DecodeState) -> list[list[int]]:
        """One speculative (or plain) step for every active row; returns the new tokens per row."""
        caps = self.depth_caps(st)
        if st.step_cost is not None and self.strategy.drafts:  # once a step, after the choice: this step's
            st.depth_evidence.fade()  # counts (recorded at its commit) enter the next choice in full
        hint = match_hint(st.heads, st.active, self.dual is not None) if st.controller is not None else 0
        speculate = st.controller.speculate(hint) if st.controller is not None else True
        if not speculate or not self.strategy.drafts:
            caps = [0] * len(caps)
        depth_cap = max(caps, default=0)
        step_start = time.perf_counter()
        st.depth_caps = caps
        fresh = list(st.fresh)
        plain = plain_step(st, self.proposer, self.device) if depth_cap == 0 else None
        if plain is not None:  # the same step without the tree machinery (spec_fast.engine.plain_step)
            new_tokens, emitted_per_row = plain
        else:
            draft, dual = self._draft_phase(st, depth_cap)
            if st.trees is not None:
                st.trees.append(draft.tree)
            target_logits, hidden, best = self._target_phase(st, draft)
            verified = self._verify_phase(st, draft, dual, target_logits, best)
            dual = self.proposer.after_verify(st, draft, dual, verified, target_logits, hidden)
            new_tokens, emitted_per_row = self._commit_phase(st, draft, dual, verified, hidden, fresh, depth_cap)
        st.row_steps += 1
        if st.controller is not None and not any(fresh):  # the first step's timing is not a step's
            st.controller.observe(depth_cap >= 1, sum(emitted_per_row) / max(len(emitted_per_row), 1),
                                  time.perf_counter() - step_start, hint)
        return new_tokens

    _step = step
    _begin = begin

    # ------------------------------------------------------------------ phase 1: draft
    def _draft_phase(self, st: DecodeState, depth_cap: int) -> tuple[DraftBatch, DualDraft | None]:
        """The proposer's trees below the current roots (a root-only batch on plain steps); row b at most
        ``st.depth_caps[b]`` deep."""
        if depth_cap < 1:
            for head in st.heads:
                head.pending_width = 0
            return draft_root_only(st.roots, self.strategy.process, self.device), None
        return self.proposer.draft(st, depth_cap, self._draft_law(st.samplings), self.device)

    # ------------------------------------------------------------------ phase 2: target
    def _target_phase(self, st: DecodeState, draft: DraftBatch
                      ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """One target pass over the tree -> (logits ``[B, N, V]``, final hidden states ``[B, N, H]`` or None,
        each slot's argmax ``[B, N]`` where the model computed it with the logits, else None)."""
        tree = draft.tree
        st.steps += 1
        fresh = st.fresh
        if not any(fresh):
            out = st.target_cache.forward(draft.tokens_in, tree.parents, output_hidden_states=st.wants_hidden,
                                          chain=draft.chain)
            return (out.logits, (out.hidden_states[-1] if st.wants_hidden else None),
                    getattr(out, "first_max", None))
        assert st.root_logits is not None
        # a fresh row's root is already in the cache with its logits (the prefill's)
        logits, hidden = st.root_logits.unsqueeze(1), st.root_hidden  # [B, 1, V]
        st.root_logits = st.root_hidden = None
        st.fresh = [False] * len(fresh)
        if all(fresh):
            # forward the draft nodes only, slot s > 0 becoming block entry s - 1 (children of the root hang
            # below the context)
            if tree.num_slots > 1:
                block_parents = torch.where(tree.parents > 0, tree.parents - 1, torch.full_like(tree.parents, -1))
                out = st.target_cache.forward(draft.tokens_in[:, 1:], block_parents[:, 1:],
                                              output_hidden_states=st.wants_hidden)
                logits = torch.cat([logits, out.logits], dim=1)
                if st.wants_hidden and hidden is not None:
                    hidden = torch.cat([hidden, out.hidden_states[-1]], dim=1)
            return logits, hidden, None
        # some rows fresh: their slot 0 becomes a placeholder entry nobody attends (never kept), their root's
        # children hang below the context; slot 0's outputs are the prefill's
        fresh_rows = torch.tensor(fresh, device=self.device).unsqueeze(1)  # [B, 1]
        parents = torch.where(fresh_rows & (tree.parents == 0), torch.full_like(tree.parents, -1), tree.parents)
        out = st.target_cache.forward(draft.tokens_in, parents, output_hidden_states=st.wants_hidden)
        first = torch.where(fresh_rows.unsqueeze(2), logits.to(out.logits.dtype), out.logits[:, :1])
        all_logits = torch.cat([first, out.logits[:, 1:]], dim=1)
        if not st.wants_hidden:
            return all_logits, None, None
        states = out.hidden_states[-1]
        if hidden is not None:
            states = torch.cat([torch.where(fresh_rows.unsqueeze(2), hidden.to(states.dtype), states[:, :1]),
                                states[:, 1:]], dim=1)
        return all_logits, states, None

    # ------------------------------------------------------------------ phase 3: verify
    def _verify_phase(self, st: DecodeState, draft: DraftBatch, dual: DualDraft | None,
                      target_logits: torch.Tensor, best: torch.Tensor | None = None) -> Verified:
        """Every row's verification (:func:`spec_fast.engine.step_verify.verify_rows`; ``best [B, N]``: each
        slot's argmax where the pass computed it, which greedy chains are verified from)."""
        method = "nss" if dual is not None else self.strategy.verifier

        def sampled(rows: DraftBatch, logits: torch.Tensor, draft_probs: torch.Tensor,
                    samplings: list[SamplingParams], streams: VerifyStreams) -> Verified:
            out, _ = self._verify_sampling(method, rows, logits, draft_probs, samplings, streams)
            return Verified(out.accepted_slots, out.accepted_depth, out.next_token)

        return verify_rows(st, draft, target_logits, sampled, best)

    def _verify_sampling(self, method: str, draft: DraftBatch, target_logits: torch.Tensor,
                         draft_probs: torch.Tensor, sampling: Sequence[SamplingParams], offset: VerifyStreams
                         ) -> tuple[TreeVerifyOutput, VerifyStreams]:
        """:func:`spec_fast.engine.step_verify.verify_sampled` for this strategy (a method so a test can wrap it)."""
        return verify_sampled(method, self.proposer.most_draws, draft, target_logits, draft_probs, sampling, offset)

    def _draft_law(self, samplings: Sequence[SamplingParams] | SamplingParams
                   ) -> Callable[[torch.Tensor], torch.Tensor]:
        """:func:`spec_fast.engine.step_verify.draft_law` of this strategy's proposer."""
        return draft_law(samplings, self.proposer.greedy_argmax)

    # ------------------------------------------------------------------ phase 4: commit
    def _commit_phase(self, st: DecodeState, draft: DraftBatch, dual: DualDraft | None, verified: Verified,
                      hidden: torch.Tensor | None, fresh: list[bool], depth_cap: int
                      ) -> tuple[list[list[int]], list[int]]:
        """Emit the accepted tokens, gather every cache to the accepted path, queue what a drafter lacks."""
        batch = len(st.active)
        entries = dual.head_entries if dual is not None else (draft.entries,) * len(st.heads)
        # host side: one read of this step's small tensors (stopping, streaming, cache bookkeeping)
        slots, tokens, nxt, nacc, depths, choice, head_of, entry_lists = read_back(verified, draft, dual, entries)
        self.proposer.after_commit(st, dual, verified, nacc)
        drafted = depth_cap >= 1
        new_tokens: list[list[int]] = [[] for _ in range(batch)]
        keep_t: list[list[int]] = [[] for _ in range(batch)]
        keep_d: list[list[list[int]]] = [[[] for _ in range(batch)] for _ in st.heads]
        step_acc, step_depth, emitted_rows = [], [], []
        for b in range(batch):
            st.step_accepted[b] = st.step_drafted[b] = -1
            if not st.active[b]:
                continue
            path = [s for s in slots[b] if s >= 0]
            emitted = [tokens[b][i] for i in path[1:]] + [nxt[b]]
            step_acc.append(nacc[b])
            step_depth.append(depths[b])
            emitted_rows.append(nacc[b] + 1)
            st.step_accepted[b] = nacc[b]
            st.step_drafted[b] = sum(1 for t in tokens[b][1:] if t >= 0)
            st.depth_evidence.record(b, depths[b], nacc[b])
            if dual is not None:
                # route: the head whose tree was verified; merge: the head that supplied the accepted path
                supplier = choice[b] if dual.choice is not None else head_of[b][path[-1]]
                if supplier > 0:
                    st.metrics.head_selected[supplier - 1] += 1
                    st.metrics.head_accepted_tokens[supplier - 1] += nacc[b]
            keep_t[b] = path
            for h, head in enumerate(st.heads):
                keep_d[h][b] = advance_head(head, b, path, tokens[b], entry_lists[h][b], nxt[b],
                                            drafted and not (dual is not None and dual.skipped[h]))
            st.roots[b] = nxt[b]
            st.committed[b].extend(emitted)
            for t in emitted:
                if len(st.outputs[b]) >= st.max_new[b]:
                    break
                st.outputs[b].append(t)
                new_tokens[b].append(t)
                if t in st.eos:
                    break
            if len(st.outputs[b]) >= st.max_new[b] or (st.outputs[b] and st.outputs[b][-1] in st.eos):
                st.active[b] = False
        st.metrics.record_step(step_acc, step_depth)
        self._gather_caches(st, keep_t, keep_d, hidden, fresh)
        return new_tokens, emitted_rows

    def _gather_caches(self, st: DecodeState, keep_t: list[list[int]], keep_d: list[list[list[int]]],
                       hidden: torch.Tensor | None, fresh: list[bool]) -> None:
        device = self.device
        counts_t = [len(k) for k in keep_t]
        # a fresh row's root is committed already: it keeps the path below it, at block entry s - 1 when
        # every row was fresh (the pass skipped slot 0), else at entry s (slot 0 was a placeholder)
        shift = 1 if all(fresh) else 0
        keep_block = [[i - shift for i in k[1:]] if fresh[b] else k for b, k in enumerate(keep_t)]
        counts_block = [len(k) for k in keep_block]
        if st.target_cache.num_block > 0:
            if is_block_prefix(keep_block, counts_block, aligned(st.target_cache)):
                st.target_cache.keep_block_prefix(counts_block[0])
            else:
                st.target_cache.commit(pad_rows(keep_block, device), torch.tensor(counts_block, device=device))
        for h, head in enumerate(st.heads):
            if st.wants_hidden and hidden is not None:
                head.drafter.observe_target(head.state, hidden, pad_rows(keep_t, device),
                                            torch.tensor(counts_t, device=device))
            if head.drafter.num_block(head.state) == 0:
                continue
            commit_rows = getattr(head.drafter, "commit_rows", None)  # a host-side drafter takes the lists
            if commit_rows is not None:
                commit_rows(head.state, keep_d[h])
                continue
            counts = [len(k) for k in keep_d[h]]
            head.drafter.commit(head.state, pad_rows(keep_d[h], device), torch.tensor(counts, device=device),
                                is_block_prefix(keep_d[h], counts, aligned(head.state)))

