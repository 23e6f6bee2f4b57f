"""SpeculativeDecoder: real speculative decoding over HF causal LMs with tree attention and KV caches.

One step, batched over ``B`` rows (each row = one prompt):

1. **draft**: the drafter first consumes the row's *pending* tokens (committed tokens its cache lacks,
   ending with the *root token*, the last committed token), then grows the tree level by level; every
   draft forward is one batched pass over the new frontier with a tree attention mask.
2. **target**: one batched pass over the whole tree (slot 0 = root token, then the drafted nodes) with
   the ancestor mask and depth-based position ids -> logits ``[B, N, V]``. The prefill runs the whole
   prompt, so the first step takes the root's logits from it and forwards the drafted nodes only (a plain
   first step forwards nothing): N generated tokens by plain decoding cost the prefill plus N - 1 passes,
   as in HF ``generate``.
3. **verify**: greedy (ALGORITHMS.md section 8, exact argmax walk) at temperature 0, else the
   :mod:`spec_fast.verify` kernels with ``target_probs = G(target logits)`` and ``draft_probs`` = the very
   tensor the drafts were sampled from.
4. **commit**: target and draft caches keep exactly the accepted path by gathering its entries in place
   (:meth:`spec_fast.kv_cache.TreeKVCache.commit`); nothing accepted is re-run.

Randomness (temperature > 0): draft draws come from a ``torch.Generator`` seeded with ``seed``; the
verifier's uniforms are ``counter_uniforms(seed + 1, offset)`` with a per-step offset, so a fixed seed
reproduces the output exactly.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from spec_fast.decoding import decoding_operator
from spec_fast.drafters import Drafter
from spec_fast.flat_tree import FlatTree
from spec_fast.kv_cache import TreeKVCache
from spec_fast.metrics import GenerationMetrics, peak_memory_bytes
from spec_fast.strategies import Strategy
from spec_ref.dynatree import DynaTreeHistory, adjusted_params, branch_count, expands, update_history

__all__ = ["SamplingParams", "GenerationResult", "SpeculativeDecoder", "greedy_verify"]


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 = greedy; ``top_k`` 0 = off; ``top_p`` 1.0 = off; ``seed`` for reproducibility."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not (t >= 0 and t < float("inf")):
            raise ValueError(f"temperature must be a finite number >= 0, got temperature={t!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got top_k={self.top_k!r}")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1] (1 = off), got top_p={p!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**64 - 1:
            # seed seeds the draft's torch.Generator and seed + 1 the verifier's 64-bit counter stream
            raise ValueError(f"seed must be an integer in [0, 2**64 - 1), got seed={self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class GenerationResult:
    """``tokens[b]``: the generated token ids of row b (EOS included when hit)."""

    tokens: list[list[int]]
    metrics: GenerationMetrics = field(default_factory=GenerationMetrics)


def greedy_verify(tree: FlatTree, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact greedy tree verification (ALGORITHMS.md section 8).

    Walk from the root into the child whose token is the target argmax at the current node (lowest id on
    ties; children are merged by token, so there is at most one), and emit the argmax at the stop node.

    Args:
        tree: the drafted tree, ``[B, N]`` fields.
        target_logits: ``[B, N, V]`` raw target logits at every node.

    Returns:
        ``accepted [B, N]`` bool (the accepted path, root included), ``num_accepted [B]`` long (draft
        tokens accepted), ``next_token [B]`` long.
    """
    best = target_logits.argmax(dim=-1)  # [B, N]
    num_slots = tree.num_slots
    parent = tree.parents.clamp(min=0)
    matches = tree.valid & (tree.tokens == torch.gather(best, 1, parent))
    accepted = torch.zeros_like(tree.valid)
    accepted[:, 0] = True
    for i in range(1, num_slots):  # ancestors first: a parent is decided before its children
        accepted[:, i] = matches[:, i] & torch.gather(accepted, 1, parent[:, i : i + 1]).squeeze(1)
    depth = torch.where(accepted, tree.depths, torch.full_like(tree.depths, -1))
    stop = depth.argmax(dim=1)  # the deepest accepted node
    next_token = torch.gather(best, 1, stop.unsqueeze(1)).squeeze(1)
    return accepted, depth.max(dim=1).values, next_token


class _RowTree:
    """Python bookkeeping of one row's tree while it is drafted (host side, small)."""

    def __init__(self, root_entry: int) -> None:
        self.tokens: list[int] = [-1]
        self.parents: list[int] = [-1]
        self.depths: list[int] = [0]
        self.draws: list[list[int]] = [[]]
        self.entry: list[int] = [root_entry]
        self.paths: list[list[int]] = [[]]
        self.score: list[float] = [1.0]
        self.alive: list[bool] = [True]

    def add(self, parent: int, token: int, paths: list[int], score: float) -> int:
        for child in range(len(self.tokens)):
            if self.parents[child] == parent and self.tokens[child] == token and self.alive[child]:
                self.paths[child].extend(paths)
                return child
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.draws.append([])
        self.entry.append(-1)
        self.paths.append(list(paths))
        self.score.append(score)
        self.alive.append(True)
        return len(self.tokens) - 1

    def best_first(self, budget: int) -> set[int]:
        """The ``budget`` best alive non-root nodes, closed under ancestors, chosen best-first exactly as
        :func:`spec_ref.draft_topk_tree` does: from the root's children, repeatedly the best available node
        (higher confidence, then lower token id, then earlier pushed; children are pushed in rank order
        when their parent is kept). A plain sort would be the same without ties, but a law with
        probability 1 (a retrieval draft) gives a child its parent's confidence, and a lower token id must
        not let it overtake its own parent."""
        children: dict[int, list[int]] = {}
        for i in range(1, len(self.tokens)):
            if self.alive[i]:
                children.setdefault(self.parents[i], []).append(i)
        heap: list[tuple[float, int, int, int]] = []
        pushed = 0

        def push(node: int) -> None:
            nonlocal pushed
            for child in sorted(children.get(node, []), key=lambda c: (-self.score[c], self.tokens[c])):
                heapq.heappush(heap, (-self.score[child], self.tokens[child], pushed, child))
                pushed += 1

        push(0)
        kept: set[int] = set()
        while heap and len(kept) < budget:
            node = heapq.heappop(heap)[3]
            kept.add(node)
            push(node)
        return kept


class SpeculativeDecoder:
    """Speculative decoding of an HF causal LM ``target`` with a ``drafter`` under a :class:`Strategy`.

    ``drafter`` may be None only for ``Strategy(shape="ar")``. Target and drafter must share the
    vocabulary (same output size). ``generate`` takes a batch of token-id prompts (ragged allowed).
    """

    def __init__(self, target: Any, drafter: Drafter | None, strategy: Strategy) -> None:
        if strategy.drafts and drafter is None:
            raise ValueError(f"strategy {strategy.label()!r} needs a drafter, got drafter=None")
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
        #: when True, ``generate`` appends every drafted :class:`FlatTree` to ``recorded_trees`` (tests)
        self.record_trees = False
        #: ``+adaptive`` controllers by ``sampling.greedy``, kept across ``generate`` calls
        self._controllers: dict[bool, _AdaptiveController] = {}
        self.recorded_trees: list[FlatTree] = []
        self.context_length = int(
            getattr(target.config, "max_position_embeddings", 0) or getattr(target.config, "n_positions", 0) or 0
        )

    # ------------------------------------------------------------------ helpers
    def _probs(self, logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
        """``[..., V]`` logits -> G(logits) ``[..., V]`` float32."""
        flat = logits.reshape(-1, logits.shape[-1])
        rows = flat.shape[0]
        # float64: a tiny T (1e-300) must not flush to 0 (greedy) before the operator sees it
        t = torch.full((rows,), float(sampling.temperature), dtype=torch.float64, device=flat.device)
        k = torch.full((rows,), int(sampling.top_k), dtype=torch.long, device=flat.device)
        p = torch.full((rows,), float(sampling.top_p), device=flat.device)
        return decoding_operator(flat, t, k, p, validate=False).reshape(logits.shape)  # SamplingParams checked

    def _check_inputs(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> None:
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got max_new_tokens={max_new_tokens!r}")
        if len(prompts) == 0:
            raise ValueError("prompts must hold at least one prompt, got an empty batch")
        for b, prompt in enumerate(prompts):
            if len(prompt) == 0:
                raise ValueError(f"prompt {b} is empty: give at least one token")
            bad = [t for t in prompt if not 0 <= int(t) < self.vocab_size]
            if bad:
                raise ValueError(f"prompt {b} has token ids outside [0, {self.vocab_size}): {bad[:5]}")
            if self.context_length and len(prompt) + max_new_tokens > self.context_length:
                raise ValueError(
                    f"prompt {b} has {len(prompt)} tokens; with max_new_tokens={max_new_tokens} it exceeds "
                    f"the model context of {self.context_length} tokens"
                )

    # ------------------------------------------------------------------ main loop
    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[Sequence[int]] | torch.Tensor,
        max_new_tokens: int = 64,
        sampling: SamplingParams | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        on_tokens: Callable[[list[list[int]]], bool | None] | None = None,
    ) -> GenerationResult:
        """Generate up to ``max_new_tokens`` tokens for every prompt (token ids, ``[B, P]`` or ragged).

        ``on_tokens(new_tokens_per_row)`` is called after every step (streaming); when it returns True,
        generation ends after that step (stop strings).
        """
        sampling = sampling or SamplingParams()
        if isinstance(prompts, torch.Tensor):
            prompts = prompts.tolist()
        prompt_lists = [[int(t) for t in p] for p in prompts]
        self._check_inputs(prompt_lists, max_new_tokens)
        if not sampling.greedy and self.strategy.drafts and self.strategy.verifier == "greedy":
            raise ValueError("verifier 'greedy' needs temperature 0; choose a sampling verifier")
        eos = set([eos_token_id] if isinstance(eos_token_id, int) else (eos_token_id or []))
        device = self.device
        batch = len(prompt_lists)
        label = self.strategy.label()
        if sampling.greedy and self.strategy.drafts:
            label = label.replace(f"/{self.strategy.verifier}", "/greedy")
        metrics = GenerationMetrics(strategy=label, batch_size=batch,
                                    prompt_tokens=sum(len(p) for p in prompt_lists))
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        generator = torch.Generator(device=device).manual_seed(sampling.seed)
        uniform_offset = 0

        # trained heads read the verifier's hidden states of every committed entry (seeds/000 section 7)
        wants_hidden = self.strategy.drafts and bool(getattr(self.drafter, "wants_target_hidden", False))
        target_state = TreeKVCache(self.target, batch, device)
        # the prefill runs every prompt token, the root included: its logits at the root serve the first
        # step, which then forwards only its draft nodes (a plain first step forwards nothing)
        prefilled = self._prefill(target_state, prompt_lists, wants_hidden)
        root_logits: torch.Tensor | None = prefilled[0]
        root_hidden: torch.Tensor | None = prefilled[1]
        prefill_out = prefilled[2]
        # +adaptive: one controller per decoder and sampling kind, kept across generate calls (what it
        # measured on earlier prompts decides the first steps of this one)
        controller = self._controllers.setdefault(sampling.greedy, _AdaptiveController()) if self.strategy.adaptive else None
        # a controller that currently prefers plain steps skips the draft prefill: the prompt waits in
        # `pending` and is fed to the drafter by the first speculative step (trained heads, which read the
        # target's prefill states, always prefill)
        lazy_draft = controller is not None and not wants_hidden and not controller.peek()
        draft_state = None
        self._prefilled_draft = False
        if self.strategy.drafts:
            assert self.drafter is not None
            draft_state = self.drafter.begin(batch, device)
            if prefill_out is not None:
                self.drafter.observe_target(draft_state, *prefill_out)
            if not lazy_draft:
                self._prefill_drafter(draft_state, prompt_lists)
        roots = [p[-1] for p in prompt_lists]
        pending: list[list[int]] = [list(p) if lazy_draft else [p[-1]] for p in prompt_lists]
        outputs: list[list[int]] = [[] for _ in range(batch)]
        committed = [list(p) for p in prompt_lists]  # prompt + every committed token (untruncated)
        active = [True] * batch
        first_token_time: float | None = None
        self._dyna_history = [DynaTreeHistory() for _ in range(batch)]
        steps = 0

        while any(active):
            remaining = max(max_new_tokens - len(outputs[b]) for b in range(batch) if active[b])
            depth_cap = min(self.strategy.depth, remaining - 1)
            speculate = controller.speculate() if controller is not None else True
            if not speculate:
                depth_cap = 0
            step_start = time.perf_counter()
            draft_probs: torch.Tensor | None
            if self.strategy.shape == "dynatree" and depth_cap >= 1:
                tree, draft_probs, entries, tokens_in = self._draft_dynatree(draft_state, pending, roots, depth_cap, active)
            elif self.strategy.shape == "chain" and depth_cap >= 1:
                tree, draft_probs, entries, tokens_in = self._draft_chain(
                    draft_state, pending, roots, depth_cap, sampling, generator)
            elif self.strategy.drafts and depth_cap >= 1:
                tree, draft_probs, entries, tokens_in = self._draft(draft_state, pending, roots, depth_cap, sampling, generator)
            else:
                tree, draft_probs, entries, tokens_in = self._root_only(roots)
            if self.record_trees:
                self.recorded_trees.append(tree)
            step_hidden: torch.Tensor | None = None
            root_in_cache = root_logits is not None
            if root_logits is not None:
                # first step: slot 0 (the root) is already in the cache with its logits; forward the draft
                # nodes only, slot s > 0 becoming block entry s - 1 (children of the root hang below the context)
                target_logits = root_logits.unsqueeze(1)  # [B, 1, V]
                step_hidden = root_hidden
                if tree.num_slots > 1:
                    block_parents = torch.where(tree.parents > 0, tree.parents - 1, torch.full_like(tree.parents, -1))
                    out = target_state.forward(tokens_in[:, 1:], block_parents[:, 1:], output_hidden_states=wants_hidden)
                    target_logits = torch.cat([target_logits, out.logits], dim=1)  # [B, N, V]
                    if wants_hidden and root_hidden is not None:
                        step_hidden = torch.cat([root_hidden, out.hidden_states[-1]], dim=1)
                root_logits = root_hidden = None
            else:
                out = target_state.forward(tokens_in, tree.parents, output_hidden_states=wants_hidden)
                target_logits = out.logits  # [B, N, V]
                if wants_hidden:
                    step_hidden = out.hidden_states[-1]
            steps += 1
            if sampling.greedy:
                accepted, num_accepted, next_token = greedy_verify(tree, target_logits)
            elif tree.num_slots == 1:
                probs = self._probs(target_logits[:, 0], sampling)
                next_token = torch.multinomial(probs, 1, generator=generator).squeeze(1)
                accepted = tree.valid.clone()
                num_accepted = torch.zeros(batch, dtype=torch.long, device=device)
            else:
                accepted, num_accepted, next_token, uniform_offset = self._verify_sampling(
                    tree, target_logits, draft_probs, sampling, uniform_offset
                )
            # ---- bookkeeping (host side: one sync per step for stopping and streaming)
            acc_list = accepted.tolist()
            tok_list = tree.tokens.tolist()
            nxt_list = next_token.tolist()
            entry_list = entries.tolist()
            num_list = num_accepted.tolist()
            new_tokens: list[list[int]] = [[] for _ in range(batch)]
            keep_t: list[list[int]] = []
            keep_d: list[list[int]] = []
            counts_t: list[int] = []
            counts_d: list[int] = []
            depths_list = tree.depths.max(dim=1).values.tolist()
            step_acc: list[int] = []
            step_depth: list[int] = []
            for b in range(batch):
                if not active[b]:
                    keep_t.append([])
                    keep_d.append([])
                    counts_t.append(0)
                    counts_d.append(0)
                    continue
                path = [i for i, a in enumerate(acc_list[b]) if a]  # ancestors first = path order
                emitted = [tok_list[b][i] for i in path[1:]] + [nxt_list[b]]
                step_acc.append(int(num_list[b]))
                if self._dyna_history[b].pending_depth is not None:
                    self._dyna_history[b] = update_history(self._dyna_history[b], int(num_list[b]))
                step_depth.append(int(depths_list[b]))
                keep_t.append(path)
                counts_t.append(len(path))
                # draft cache: all pending entries, then the accepted nodes it has entries for
                n_pend = len(pending[b])
                width = self._pending_width
                dkeep = list(range(width - n_pend, width)) if depth_cap >= 1 and self.strategy.drafts else []
                missing: list[int] = []
                for i in path[1:]:
                    if entry_list[b][i] >= 0 and not missing:
                        dkeep.append(entry_list[b][i])
                    else:
                        missing.append(tok_list[b][i])
                if self.strategy.drafts and depth_cap >= 1:
                    pending[b] = missing + [nxt_list[b]]
                else:
                    pending[b] = pending[b] + [tok_list[b][i] for i in path[1:]] + [nxt_list[b]]
                keep_d.append(dkeep)
                counts_d.append(len(dkeep))
                roots[b] = nxt_list[b]
                committed[b].extend(emitted)
                for t in emitted:
                    if len(outputs[b]) >= max_new_tokens:
                        break
                    outputs[b].append(t)
                    new_tokens[b].append(t)
                    if t in eos:
                        break
                if len(outputs[b]) >= max_new_tokens or (outputs[b] and outputs[b][-1] in eos):
                    active[b] = False
            metrics.record_step(step_acc, step_depth)
            if controller is not None and not root_in_cache:  # the first step's timing is not a step's
                emitted_rows = [num_list[b] + 1 for b in range(batch) if counts_t[b] > 0]
                controller.observe(depth_cap >= 1, sum(emitted_rows) / max(len(emitted_rows), 1),
                                   time.perf_counter() - step_start)
            if root_in_cache:  # the root is committed already; slot s > 0 is block entry s - 1
                keep_block = [[i - 1 for i in k[1:]] for k in keep_t]
                counts_block = [max(c - 1, 0) for c in counts_t]
            else:
                keep_block, counts_block = keep_t, counts_t
            if target_state.num_block > 0:
                target_state.commit(_pad(keep_block, device), torch.tensor(counts_block, device=device),
                                    _is_block_prefix(keep_block, counts_block, self._aligned(target_state)))
            if wants_hidden and step_hidden is not None and draft_state is not None and self.drafter is not None:
                self.drafter.observe_target(draft_state, step_hidden, _pad(keep_t, device),
                                            torch.tensor(counts_t, device=device))
            if draft_state is not None and self.drafter is not None and self.drafter.num_block(draft_state) > 0:
                self.drafter.commit(draft_state, _pad(keep_d, device), torch.tensor(counts_d, device=device),
                                    _is_block_prefix(keep_d, counts_d, self._aligned(draft_state)))
            if first_token_time is None:
                first_token_time = time.perf_counter() - start
            if on_tokens is not None and on_tokens(new_tokens):
                break

        metrics.wall_s = time.perf_counter() - start
        metrics.ttft_s = first_token_time or 0.0
        metrics.generated_tokens = sum(len(o) for o in outputs)
        # one verification per step (the first step's root logits come from the prefill pass)
        metrics.target_passes = steps
        if draft_state is not None and self.drafter is not None:
            metrics.draft_passes = self.drafter.passes(draft_state) - (1 if self._prefilled_draft else 0)
        metrics.peak_memory_bytes = peak_memory_bytes(device)
        self.last_target_state = target_state
        self.last_draft_state = draft_state
        self.last_committed = committed
        self.last_pending = pending
        return GenerationResult(tokens=outputs, metrics=metrics)

    # ------------------------------------------------------------------ phases
    @staticmethod
    def _aligned(state: Any) -> bool:
        """True when every row's context fills the physical context (no padding slots)."""
        lengths = getattr(state, "lengths", None)
        if lengths is None:
            return False
        return bool((lengths == state.context_size).all().item())

    _pending_width = 0
    _prefilled_draft = False

    def _chain_block(self, prompts: list[list[int]], drop_last: bool = True
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """Each prompt (all but its last token with ``drop_last``) as a right-padded chain block."""
        cut = 1 if drop_last else 0
        lengths = [len(p) - cut for p in prompts]
        width = max(lengths)
        tokens = torch.zeros(len(prompts), width, dtype=torch.long)
        parents = torch.full((len(prompts), width), -1, dtype=torch.long)
        for b, p in enumerate(prompts):
            if lengths[b] > 0:
                tokens[b, : lengths[b]] = torch.tensor(p[: len(p) - cut], dtype=torch.long)
                parents[b, 1 : lengths[b]] = torch.arange(lengths[b] - 1)
        return tokens.to(self.device), parents.to(self.device), torch.tensor(lengths, device=self.device), width

    def _prefill(
        self, state: TreeKVCache, prompts: list[list[int]], hidden: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None, tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None]:
        """Prefill the target with every prompt token and commit them.

        Returns ``(root_logits [B, V], root_hidden [B, 1, H] or None, observe)``: the logits (and, with
        ``hidden``, the final hidden state) at each prompt's last token, the root of the first step; and
        ``observe = (hidden [B, W, H], keep [B, W], counts [B])`` of the entries before the root for
        :meth:`Drafter.observe_target` (None without ``hidden`` or when no prompt has an entry before it).
        Only the logits from the shortest prompt's root onwards are computed (HF ``logits_to_keep``).
        """
        tokens, parents, lengths, width = self._chain_block(prompts, drop_last=False)
        root_index = lengths - 1  # [B]
        lowest_root = min(len(p) for p in prompts) - 1
        out = state.forward(tokens, parents, output_hidden_states=hidden, logits_to_keep=width - lowest_root)
        keep = torch.arange(width, device=self.device).expand(len(prompts), width)
        state.commit(keep, lengths)
        rows = torch.arange(len(prompts), device=self.device)
        root_logits = out.logits[rows, root_index - lowest_root]  # [B, V]
        if not hidden:
            return root_logits, None, None
        states = out.hidden_states[-1]  # [B, W, H]
        root_hidden = states[rows, root_index].unsqueeze(1)
        observe = (states, keep, root_index) if width > 1 else None  # root_index = entries before the root
        return root_logits, root_hidden, observe

    def _prefill_drafter(self, state: Any, prompts: list[list[int]]) -> None:
        assert self.drafter is not None
        tokens, parents, lengths, width = self._chain_block(prompts)
        self._prefilled_draft = width > 0
        if width > 0:
            self.drafter.forward(state, tokens, parents)
            self.drafter.commit(state, torch.arange(width, device=self.device).expand(len(prompts), width), lengths)

    def _root_only(self, roots: list[int]) -> tuple[FlatTree, torch.Tensor | None, torch.Tensor, torch.Tensor]:
        batch = len(roots)
        dev = self.device
        tree = FlatTree(
            tokens=torch.full((batch, 1), -1, dtype=torch.long, device=dev),
            parents=torch.full((batch, 1), -1, dtype=torch.long, device=dev),
            depths=torch.zeros(batch, 1, dtype=torch.long, device=dev),
            draws=torch.full((batch, 1, 1), -1, dtype=torch.long, device=dev),
            valid=torch.ones(batch, 1, dtype=torch.bool, device=dev),
            process=self.strategy.process,
        )
        tokens_in = torch.tensor(roots, dtype=torch.long, device=dev).unsqueeze(1)
        self._pending_width = 0
        return tree, None, torch.full((batch, 1), -1, dtype=torch.long, device=dev), tokens_in

    def _draft_q(self, logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
        """The distribution the drafter samples from, ``[B, F, V]``."""
        st = self.strategy
        if st.shape == "topk" or (sampling.greedy and st.shape in ("iid", "delayed")):
            return torch.softmax(logits.float(), dim=-1)
        if sampling.greedy:
            return torch.zeros_like(logits, dtype=torch.float32).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        return self._probs(logits, sampling)

    def _draft(
        self,
        state: Any,
        pending: list[list[int]],
        roots: list[int],
        depth_cap: int,
        sampling: SamplingParams,
        generator: torch.Generator,
    ) -> tuple[FlatTree, torch.Tensor, torch.Tensor, torch.Tensor]:
        assert self.drafter is not None
        st = self.strategy
        dev = self.device
        batch = len(pending)
        logits = self._pending_forward(state, pending)  # [B, 1, V] at the root
        width = self._pending_width
        trees = [_RowTree(width - 1) for _ in range(batch)]
        frontier: list[list[int]] = [[0] for _ in range(batch)]
        q_of: list[dict[int, torch.Tensor]] = [{} for _ in range(batch)]
        k_paths = st.num_paths
        for b in range(batch):
            trees[b].paths[0] = list(range(k_paths))
        for depth in range(depth_cap):
            q = self._draft_q(logits, sampling)  # [B, F, V]
            fmax = q.shape[1]
            new_frontier: list[list[int]] = [[] for _ in range(batch)]
            if st.shape == "topk":
                top_vals, top_ids = _topk_lowest_id(q, min(st.top_k, q.shape[-1]))
                tv, ti = top_vals.tolist(), top_ids.tolist()
                for b in range(batch):
                    tr = trees[b]
                    for f, node in enumerate(frontier[b]):
                        q_of[b][node] = q[b, f]
                        for val, tok in zip(tv[b][f], ti[b][f]):
                            if val > 0:
                                tr.add(node, tok, [], tr.score[node] * val)
                    keep = tr.best_first(st.budget)
                    for i in range(1, len(tr.tokens)):
                        if tr.alive[i] and i not in keep:
                            tr.alive[i] = False
                    new_frontier[b] = [i for i in range(1, len(tr.tokens)) if tr.alive[i] and tr.depths[i] == depth + 1]
            else:
                draws_needed = 1 if depth < st.trunk else k_paths
                flat_q = q.reshape(batch * fmax, -1)
                samples = torch.multinomial(flat_q, draws_needed, replacement=True, generator=generator)
                drawn: list[list[list[int]]] = samples.reshape(batch, fmax, draws_needed).tolist()
                for b in range(batch):
                    tr = trees[b]
                    for f, node in enumerate(frontier[b]):
                        q_of[b][node] = q[b, f]
                        if depth < st.trunk:
                            token = drawn[b][f][0]
                            tr.draws[node].append(token)
                            new_frontier[b].append(tr.add(node, token, tr.paths[node], 0.0))
                        else:
                            for j, path in enumerate(tr.paths[node]):
                                token = drawn[b][f][j]
                                tr.draws[node].append(token)
                                child = tr.add(node, token, [path], 0.0)
                                if child not in new_frontier[b]:
                                    new_frontier[b].append(child)
            frontier = new_frontier
            if depth + 1 >= depth_cap or all(len(f) == 0 for f in frontier):
                break
            # forward the new frontier through the drafter (one batched tree pass)
            fw = max(len(f) for f in frontier)
            base = self.drafter.num_block(state)
            ftoks = torch.zeros(batch, fw, dtype=torch.long)
            fpar = torch.full((batch, fw), -1, dtype=torch.long)
            for b in range(batch):
                for j, node in enumerate(frontier[b]):
                    ftoks[b, j] = trees[b].tokens[node]
                    fpar[b, j] = trees[b].entry[trees[b].parents[node]]
                    trees[b].entry[node] = base + j
                if not frontier[b]:
                    fpar[b, :] = -1
            logits = self.drafter.forward(state, ftoks.to(dev), fpar.to(dev))
            # padding entries hang below the context and are never kept
        return self._flatten(trees, q_of, roots)

    def _draft_chain(
        self,
        state: Any,
        pending: list[list[int]],
        roots: list[int],
        depth_cap: int,
        sampling: SamplingParams,
        generator: torch.Generator,
    ) -> tuple[FlatTree, torch.Tensor, torch.Tensor, torch.Tensor]:
        """A single path of ``depth_cap`` draft tokens, drafted without reading anything back to the host.

        Same draws as :meth:`_draft` on a chain (argmax at T = 0, else one ``multinomial`` draw per row
        and level from the same generator); the tree's shape is known in advance, so the
        :class:`FlatTree` is assembled from device tensors.
        """
        assert self.drafter is not None
        dev = self.device
        batch = len(pending)
        logits = self._pending_forward(state, pending)  # [B, 1, V] at the root
        root_entry = self._pending_width - 1
        tokens: list[torch.Tensor] = []  # [B] per depth
        qs: list[torch.Tensor] = []  # [B, V] per depth
        entries = [root_entry]
        for depth in range(depth_cap):
            q = self._draft_q(logits, sampling)[:, 0]
            if sampling.greedy:  # one-hot q: the draw is its argmax
                token = q.argmax(dim=-1)
            else:
                token = torch.multinomial(q, 1, replacement=True, generator=generator).squeeze(1)
            tokens.append(token)
            qs.append(q)
            if depth + 1 >= depth_cap:
                break
            base = self.drafter.num_block(state)
            parent = torch.full((batch, 1), entries[-1], dtype=torch.long, device=dev)
            logits = self.drafter.forward(state, token.unsqueeze(1), parent)
            entries.append(base)
        drafted = torch.stack(tokens, dim=1)  # [B, D]
        depth = drafted.shape[1]
        pad = torch.full((batch, 1), -1, dtype=torch.long, device=dev)
        steps = torch.arange(depth + 1, device=dev).unsqueeze(0).expand(batch, depth + 1)
        tree = FlatTree(
            tokens=torch.cat([pad, drafted], dim=1),
            parents=steps - 1,
            depths=steps.clone(),
            draws=torch.cat([drafted, pad], dim=1).unsqueeze(-1),
            valid=torch.ones(batch, depth + 1, dtype=torch.bool, device=dev),
            process=self.strategy.process,
        )
        draft_probs = torch.cat([torch.stack(qs, dim=1), torch.zeros_like(qs[0]).unsqueeze(1)], dim=1)
        entry_row = torch.tensor(entries + [-1], dtype=torch.long, device=dev)
        tokens_in = torch.cat([torch.tensor(roots, dtype=torch.long, device=dev).unsqueeze(1), drafted], dim=1)
        return tree, draft_probs.float(), entry_row.unsqueeze(0).expand(batch, depth + 1), tokens_in

    def _pending_forward(self, state: Any, pending: list[list[int]]) -> torch.Tensor:
        """Feed each row's pending tokens (left-padded chain ending at the root token) -> root logits [B, 1, V]."""
        assert self.drafter is not None
        batch = len(pending)
        width = max(len(p) for p in pending)
        self._pending_width = width
        ptoks = torch.zeros(batch, width, dtype=torch.long)
        ppar = torch.full((batch, width), -1, dtype=torch.long)
        for b, p in enumerate(pending):
            off = width - len(p)
            ptoks[b, off:] = torch.tensor(p, dtype=torch.long)
            ppar[b, off + 1 :] = torch.arange(off, width - 1)
        return self.drafter.forward(state, ptoks.to(self.device), ppar.to(self.device))[:, -1:]

    def _draft_dynatree(
        self, state: Any, pending: list[list[int]], roots: list[int], depth_cap: int, active: list[bool]
    ) -> tuple[FlatTree, torch.Tensor, torch.Tensor, torch.Tensor]:
        """DynaTree drafting (the decisions of :func:`spec_ref.draft_dynatree`), one draft pass per level.

        The reference pops a FIFO frontier; all nodes of one depth precede the next depth in it, so
        expanding level by level in creation order makes the same decisions. Each level forwards its
        expandable nodes in one batched pass; the budget is checked node by node as in the reference.
        ``depth_cap`` (tokens left) lowers D_max for this step only.
        """
        assert self.drafter is not None
        batch = len(pending)
        logits = self._pending_forward(state, pending)
        width = self._pending_width
        params = []
        for b in range(batch):
            p = adjusted_params(self.strategy.dynatree_params(), self._dyna_history[b])
            params.append(p)
        q = torch.softmax(logits.float(), dim=-1)  # [B, 1, V]
        u0 = q[:, 0].argmax(dim=-1).tolist()  # first maximum = lowest id on ties
        p0 = q[:, 0].max(dim=-1).values.tolist()
        trees = [_RowTree(width - 1) for _ in range(batch)]
        size = [1] * batch
        level: list[list[int]] = []
        for b, tr in enumerate(trees):
            tr.draws[0].append(u0[b])
            level.append([tr.add(0, u0[b], [], p0[b])])
        depth = 1  # DraftTree depth of `level`; seed depth d(u) = depth - 1
        while depth < depth_cap:
            expand: list[list[int]] = []
            for b, tr in enumerate(trees):
                prm = params[b]
                rows = []
                if active[b] and size[b] < prm.node_budget:
                    rows = [u for u in level[b] if expands(prm, tr.score[u], depth - 1)]
                expand.append(rows)
            if not any(expand):
                break
            fw = max(len(e) for e in expand)
            base = self.drafter.num_block(state)
            ftoks = torch.zeros(batch, fw, dtype=torch.long)
            fpar = torch.full((batch, fw), -1, dtype=torch.long)
            for b, tr in enumerate(trees):
                for j, u in enumerate(expand[b]):
                    ftoks[b, j] = tr.tokens[u]
                    fpar[b, j] = tr.entry[tr.parents[u]]
                    tr.entry[u] = base + j
            q = torch.softmax(self.drafter.forward(state, ftoks.to(self.device), fpar.to(self.device)).float(), dim=-1)
            bmax = max(max(p.branch_max, p.branch_mid, p.branch_min) for p in params)
            top_vals, top_ids = _topk_lowest_id(q, min(bmax, q.shape[-1]))
            tv, ti = top_vals.tolist(), top_ids.tolist()
            next_level: list[list[int]] = [[] for _ in range(batch)]
            for b, tr in enumerate(trees):
                prm = params[b]
                for j, u in enumerate(expand[b]):
                    if size[b] >= prm.node_budget:
                        break
                    branches = branch_count(prm, tv[b][j][0])
                    for val, tok in zip(tv[b][j][:branches], ti[b][j][:branches]):
                        if size[b] >= prm.node_budget or val <= 0:
                            break
                        p_v = tr.score[u] * val
                        if p_v < prm.prune_threshold:
                            break
                        tr.draws[u].append(tok)
                        next_level[b].append(tr.add(u, tok, [], p_v))
                        size[b] += 1
            level = next_level
            depth += 1
        for b, tr in enumerate(trees):
            if active[b]:
                self._dyna_history[b] = DynaTreeHistory(
                    window=self._dyna_history[b].window,
                    acceptance=self._dyna_history[b].acceptance,
                    pending_depth=max(tr.depths),
                )
        return self._flatten(trees, [{} for _ in range(batch)], roots)

    def _flatten(
        self, trees: list[_RowTree], q_of: list[dict[int, torch.Tensor]], roots: list[int]
    ) -> tuple[FlatTree, torch.Tensor, torch.Tensor, torch.Tensor]:
        st = self.strategy
        dev = self.device
        batch = len(trees)
        kept = [[i for i in range(len(tr.tokens)) if tr.alive[i]] for tr in trees]
        if st.shape == "topk":  # draws = kept children in rank order (decreasing confidence, then id)
            for b, tr in enumerate(trees):
                for i in kept[b]:
                    tr.draws[i] = []
                for i in sorted(kept[b][1:], key=lambda i: (-tr.score[i], tr.tokens[i], i)):
                    tr.draws[tr.parents[i]].append(tr.tokens[i])
        n = max(len(k) for k in kept)
        kmax = max(1, max(len(tr.draws[i]) for b, tr in enumerate(trees) for i in kept[b]))
        tokens = torch.full((batch, n), -1, dtype=torch.long)
        tokens_in = torch.zeros(batch, n, dtype=torch.long)
        parents = torch.full((batch, n), -1, dtype=torch.long)
        depths = torch.full((batch, n), -1, dtype=torch.long)
        draws = torch.full((batch, n, kmax), -1, dtype=torch.long)
        valid = torch.zeros(batch, n, dtype=torch.bool)
        entries = torch.full((batch, n), -1, dtype=torch.long)
        draft_probs = torch.zeros(batch, n, self.vocab_size, dtype=torch.float32, device=dev)
        for b, tr in enumerate(trees):
            slot = {node: s for s, node in enumerate(kept[b])}
            for s, node in enumerate(kept[b]):
                tokens[b, s] = tr.tokens[node]
                tokens_in[b, s] = tr.tokens[node] if s > 0 else roots[b]
                parents[b, s] = slot[tr.parents[node]] if s > 0 else -1
                depths[b, s] = tr.depths[node]
                if tr.draws[node]:
                    draws[b, s, : len(tr.draws[node])] = torch.tensor(tr.draws[node])
                valid[b, s] = True
                entries[b, s] = tr.entry[node]
                if node in q_of[b]:
                    draft_probs[b, s] = q_of[b][node]
        tree = FlatTree(tokens.to(dev), parents.to(dev), depths.to(dev), draws.to(dev), valid.to(dev), st.process)
        return tree, draft_probs, entries.to(dev), tokens_in.to(dev)

    def _verify_sampling(
        self,
        tree: FlatTree,
        target_logits: torch.Tensor,
        draft_probs: torch.Tensor | None,
        sampling: SamplingParams,
        offset: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        from spec_fast.rng import counter_uniforms
        from spec_fast.verify import uniforms_per_node, verify_tree

        assert draft_probs is not None
        target_probs = self._probs(target_logits, sampling)
        method = self.strategy.verifier
        per_node = uniforms_per_node(method, tree.max_draws)
        shape = (tree.batch_size, tree.num_slots, per_node)
        uniforms = counter_uniforms(sampling.seed + 1, offset, shape, self.device)
        result = verify_tree(method, tree, target_probs, draft_probs, uniforms, validate=False)
        slots = result.accepted_slots  # [B, D+1], -1 padded, root first
        n = tree.num_slots
        # padding (-1) goes to an extra column that is dropped: a clamp to 0 would clear the root
        accepted = torch.zeros(tree.batch_size, n + 1, dtype=torch.bool, device=slots.device)
        accepted.scatter_(1, torch.where(slots >= 0, slots, torch.full_like(slots, n)), True)
        accepted = accepted[:, :n]
        return accepted, result.num_accepted, result.next_token, offset + tree.num_slots * per_node


class _AdaptiveController:
    """Chooses speculative or plain steps by measured throughput (``Strategy.adaptive``).

    Keeps exponential moving averages of tokens per step and seconds per step for both kinds of step
    (the wall time of the whole step, drafting and the drafter's catch-up on tokens of plain steps
    included). Starts with one speculative and one plain step, then runs whichever kind has the higher
    tokens/s, probing the other kind after ``probe_every`` steps; every probe that confirms the choice
    multiplies the interval by 2, or by 4 when the loser reached less than ``clear_margin`` of the winner's
    rate, up to ``max_interval`` (so a losing kind costs O(log n) probes but a change of regime is still
    noticed); a probe that flips the choice resets the interval to ``probe_every``. A decoder keeps its
    controllers across ``generate`` calls. Both kinds of step are exact, so this changes speed only, never
    the output law.
    """

    def __init__(self, probe_every: int = 8, decay: float = 0.7, max_interval: int = 1024,
                 clear_margin: float = 0.75) -> None:
        self.clear_margin = clear_margin
        self.initial_interval = probe_every
        self.probe_every = probe_every
        self.max_interval = max_interval
        self.decay = decay
        self.tokens: dict[bool, float] = {}
        self.seconds: dict[bool, float] = {}
        self.steps = 0
        self.since_probe = 0
        self.probing = False
        self.best = True

    def rate(self, spec: bool) -> float:
        return self.tokens[spec] / max(self.seconds[spec], 1e-9)

    def peek(self) -> bool:
        """The kind of the next step, without counting it."""
        if True not in self.tokens:
            return True
        if False not in self.tokens:
            return False
        best = self.rate(True) >= self.rate(False)
        return (not best) if self.since_probe >= self.probe_every else best

    def speculate(self) -> bool:
        if True not in self.tokens or False not in self.tokens:
            return self.peek()
        self.best = self.rate(True) >= self.rate(False)
        if self.since_probe >= self.probe_every:
            self.since_probe = 0
            self.probing = True
            return not self.best
        self.since_probe += 1
        return self.best

    def observe(self, spec: bool, tokens: float, seconds: float) -> None:
        self.steps += 1
        if spec not in self.tokens:
            self.tokens[spec], self.seconds[spec] = tokens, seconds
        else:
            d = self.decay
            self.tokens[spec] = d * self.tokens[spec] + (1 - d) * tokens
            self.seconds[spec] = d * self.seconds[spec] + (1 - d) * seconds
        if self.probing and True in self.tokens and False in self.tokens:
            self.probing = False
            confirmed = (self.rate(True) >= self.rate(False)) == self.best
            loser, winner = sorted((self.rate(True), self.rate(False)))
            factor = 4 if loser < self.clear_margin * winner else 2
            self.probe_every = min(factor * self.probe_every, self.max_interval) if confirmed else self.initial_interval


def _topk_lowest_id(q: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk(q, k)`` over the last dim of ``q [..., V]`` with ties broken towards the lower token id
    (``spec_ref``'s ``ranked_tokens`` rule; ``torch.topk`` leaves that unspecified, and retrieval drafts
    produce exact ties): the first ``k`` entries of a stable descending sort, without sorting all of V."""
    kth = torch.topk(q, k, dim=-1).values[..., -1:]
    above = q > kth
    tied = q == kth
    room = k - above.sum(dim=-1, keepdim=True)
    chosen = above | (tied & (torch.cumsum(tied.long(), dim=-1) <= room))
    # exactly k chosen per row: take them, then order by (value desc, id asc) with two stable sorts
    ids = torch.topk(torch.where(chosen, q, torch.full_like(q, -1.0)), k, dim=-1).indices
    ids = torch.sort(ids, dim=-1).values
    vals = torch.gather(q, -1, ids)
    vals, order = torch.sort(vals, dim=-1, descending=True, stable=True)
    return vals, torch.gather(ids, -1, order)


def _is_block_prefix(keep: list[list[int]], counts: list[int], aligned: bool) -> bool:
    """Host-side check for :meth:`TreeKVCache.commit`'s truncation fast path."""
    if not aligned or not counts or any(c != counts[0] for c in counts):
        return False
    return all(row[: counts[0]] == list(range(counts[0])) for row in keep)


def _pad(rows: list[list[int]], device: torch.device) -> torch.Tensor:
    width = max(1, max((len(r) for r in rows), default=1))
    out = torch.zeros(len(rows), width, dtype=torch.long)
    for b, r in enumerate(rows):
        if r:
            out[b, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out.to(device)
