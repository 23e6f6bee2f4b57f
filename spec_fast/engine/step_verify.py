"""One step's verification of a batch whose rows have their own sampling parameters and random streams.

:func:`verify_rows` sorts the rows into three kinds and verifies each kind on its rows only:

* greedy rows (temperature 0): the greedy walk (:func:`spec_fast.verify.verify_greedy`);
* sampled rows whose tree is the root alone (a plain step of that row): one inverse-CDF draw from G of the
  target logits at the root with the row's first verifier uniform;
* the other sampled rows: :func:`spec_fast.verify.verify_tree` with ``target_probs`` = G(target logits),
  each row its own G.

Row b's node u reads counters ``u * M + m`` of row b's verifier stream (:mod:`spec_fast.draws`), ``M`` fixed by
the strategy's proposer (``Proposer.most_draws``), so a row reads the same numbers whatever else shares its batch.
:func:`draft_law` is the per-row law the drafters sample from.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from spec_fast import _sampling
from spec_fast._sampling import _inverse_cdf, _residual_weights, first_max_index
from spec_fast.verify.tree import Verified
from spec_fast.engine.commit import verify_greedy_chain_on_host
from spec_fast.engine.decode_state import DecodeState
from spec_fast.decoding import SamplingParams, sampling_probs
from spec_fast.drafts.batch import DraftBatch, argmax_law
from spec_fast.flat_tree import FlatTree
from spec_fast.rng import counter_uniforms
from spec_fast.verify import TreeVerifyOutput, uniforms_per_node, verify_greedy, verify_tree

__all__ = ["VerifyStreams", "verify_rows", "verify_sampled", "verify_naive_chain_on_host", "draw_plain", "draft_law",
           "target_probs"]

Law = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True, eq=False)
class VerifyStreams:
    """Some rows' verifier streams: ``keys [R]`` and ``offsets [R]`` int64 (node u's uniform m of row r is
    counter ``offsets[r] + u * M + m``); ``streams + n`` moves every row ``n`` counters on."""

    keys: torch.Tensor
    offsets: torch.Tensor

    def __add__(self, counters: int) -> VerifyStreams:
        return VerifyStreams(self.keys, self.offsets + counters)

    def uniforms(self, shape: tuple[int, int, int]) -> torch.Tensor:
        """``[R, N, M]`` float32 uniforms."""
        return counter_uniforms(self.keys, self.offsets, shape, self.keys.device)


#: ``(draft of some rows, their target logits [R, N, V], draft_probs [R, N, V], their SamplingParams, their
#: VerifyStreams) -> Verified``: the tree verification of sampled rows
SampledVerifier = Callable[[DraftBatch, torch.Tensor, torch.Tensor, list[SamplingParams], VerifyStreams], Verified]


def verify_sampled(method: str, draws: int, draft: DraftBatch, target_logits: torch.Tensor,
                   draft_probs: torch.Tensor, samplings: Sequence[SamplingParams], streams: VerifyStreams
                   ) -> tuple[TreeVerifyOutput, VerifyStreams]:
    """``verify_tree(method)`` of ``draft``'s rows with p = G(target logits) (row r's own G) and their own
    uniforms (``M`` per node fixed by ``draws``, the most draws a node of the strategy has); returns the
    output and the streams past the uniforms it read. Naive verification of chains takes
    :func:`verify_naive_chain_on_host` (the same output)."""
    tree = draft.tree
    per_node = max(1, uniforms_per_node(method, max(tree.max_draws, draws)))
    uniforms = streams.uniforms((tree.batch_size, tree.num_slots, per_node))
    if method == "naive" and draft.chain:
        native = _native_naive_chain(draft, target_logits, draft_probs, samplings, uniforms)
        out = native if native is not None else verify_naive_chain_on_host(
            draft, target_probs(target_logits, samplings), draft_probs, uniforms)
    else:
        out = verify_tree(method, tree, target_probs(target_logits, samplings), draft_probs, uniforms,
                          max_depth=draft.max_depth, validate=False)
    return out, streams + tree.num_slots * per_node


def _native_temperatures(samplings: Sequence[SamplingParams], logits: torch.Tensor) -> torch.Tensor | None:
    """``[R]`` float32 temperatures (clamped as G clamps them) where the native sweeps can sample: CPU float32
    ``logits [R, ..., V]`` and every row sampling from its tempered softmax without top-k below V or top-p;
    else None."""
    vocab = int(logits.shape[-1])
    if (logits.device.type != "cpu" or logits.dtype != torch.float32
            or not all(s.temperature > 0 and not 0 < s.top_k < vocab and s.top_p >= 1.0 for s in samplings)):
        return None
    return _clamped_temperatures(samplings)


def _clamped_temperatures(samplings: Sequence[SamplingParams]) -> torch.Tensor:
    """``[R]`` float32 temperatures, clamped to float32's smallest normal as G clamps them."""
    temperature = torch.tensor([s.temperature for s in samplings], dtype=torch.float32)
    return temperature.clamp_min(torch.finfo(torch.float32).tiny)


def _native_naive_chain(draft: DraftBatch, target_logits: torch.Tensor, draft_probs: torch.Tensor,
                        samplings: Sequence[SamplingParams], uniforms: torch.Tensor) -> TreeVerifyOutput | None:
    """The naive verification of chains in the native library (:func:`spec_fast.lean.row_ops.naive_chain`:
    p the tempered softmax to float rounding, the accept tests of ``verify_tree`` on that p, its draws up to
    the rounding of running sums) for unfiltered sampled CPU float32 rows where it is loaded; None otherwise.
    G, the gathers and the draw over ``[R, N, V]`` tensors took ~1.2 ms of a chain:1 step on one thread."""
    native_chain = _sampling.native_naive_chain
    temperature = _native_temperatures(samplings, target_logits)
    if native_chain is None or temperature is None:
        return None
    tree = draft.tree
    second = min(1, int(uniforms.shape[2]) - 1)
    found = native_chain(target_logits, temperature, tree.draws[:, :, 0].contiguous(), draft_probs.float(),
                         uniforms[:, :, 0].contiguous(), uniforms[:, :, second].contiguous())
    if found is None:
        return None
    stop, next_token = found
    return _chain_output(draft, stop.tolist(), stop, next_token)


def _chain_output(draft: DraftBatch, stops: list[int], stop: torch.Tensor, next_token: torch.Tensor
                  ) -> TreeVerifyOutput:
    """The verification of chains whose row b stopped at slot ``stops[b]`` (``stop [R]``) and emits
    ``next_token [R]`` after it."""
    device = next_token.device
    width = draft.max_depth + 1
    rows_n = len(stops)
    every = torch.arange(rows_n, device=device)
    tokens = draft.tree.tokens.tolist()
    slots = [[i if i <= s else -1 for i in range(width)] for s in stops]
    emitted = [[int(tokens[b][i]) for i in range(1, s + 1)] + [-2] + [-1] * (width - s - 1)
               for b, s in enumerate(stops)]
    emitted_t = torch.tensor(emitted, dtype=torch.long, device=device)
    emitted_t[every, stop] = next_token
    return TreeVerifyOutput(torch.tensor(slots, dtype=torch.long, device=device), stop.clone(), next_token,
                            emitted_t, stop.clone())


def verify_naive_chain_on_host(draft: DraftBatch, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                               uniforms: torch.Tensor) -> TreeVerifyOutput:
    """``verify_tree("naive", ...)`` of chains (``draft.chain``: slot d at depth d, its drafted child in slot
    d + 1; a capped row's last slot has no draw) with the accept tests on the host: one read of p(x), q(x)
    and the node's uniforms at every slot finds where each row stops, then one batch of inverse-CDF draws
    (the residual ``Res(p, q)`` with u1 where a test failed, p itself with u0 at a leaf) gives the next tokens.
    The same tests on the same float32 values widened to float64 (``u0 * q(x) < p(x)``) and the same draws
    per row as the top-down driver makes, so the same output, without the driver's tensor operations per
    depth (a few dozen small ones, each dearer than its arithmetic on a chain of two or three slots).

    ``target_probs`` and ``draft_probs`` ``[R, N, V]`` float32; ``uniforms [R, N, M]`` (M >= 1)."""
    tree = draft.tree
    rows_n, slots_n = tree.tokens.shape
    child = tree.draws[:, :, 0]  # [R, N]: the drafted token below each slot, -1 at a leaf
    at_child = child.clamp(min=0).unsqueeze(2)
    second = min(1, int(uniforms.shape[2]) - 1)
    host = torch.cat([target_probs.gather(2, at_child).squeeze(2).double(),
                      draft_probs.gather(2, at_child).squeeze(2).double(),
                      uniforms[:, :, 0].double(), uniforms[:, :, second].double(), child.double()],
                     dim=1).tolist()
    stops: list[int] = []
    rejected: list[bool] = []
    draw_uniforms: list[float] = []
    for row in host:
        p_x, q_x, u0, u1 = (row[i * slots_n:(i + 1) * slots_n] for i in range(4))
        node = 0
        while node + 1 < slots_n and int(row[4 * slots_n + node]) >= 0:
            if not u0[node] * q_x[node] < p_x[node]:
                break
            node += 1
        leaf = int(row[4 * slots_n + node]) < 0
        stops.append(node)
        rejected.append(not leaf)
        draw_uniforms.append(u0[node] if leaf else u1[node])
    device = target_probs.device
    every = torch.arange(rows_n, device=device)
    stop = torch.tensor(stops, dtype=torch.long, device=device)
    weights = _residual_weights(target_probs[every, stop], draft_probs[every, stop],
                                torch.tensor(rejected, dtype=torch.bool, device=device))
    next_token = _inverse_cdf(weights, torch.tensor(draw_uniforms, dtype=torch.float32, device=device))
    return _chain_output(draft, stops, stop, next_token)


def verify_rows(st: DecodeState, draft: DraftBatch, target_logits: torch.Tensor, sampled: SampledVerifier,
                best: torch.Tensor | None = None) -> Verified:
    """Verify every row of ``draft`` against ``target_logits [B, N, V]`` (module docstring); ``sampled``
    verifies the sampled rows that drafted (e.g. :func:`verify_sampled`). Greedy chains are verified on the
    host (:func:`spec_fast.engine.commit.verify_greedy_chain_on_host`) from ``best [B, N]``, each slot's
    argmax, where the pass computed it with the logits."""
    tree = draft.tree
    kinds = ["greedy" if s.greedy else "plain" if tree.num_slots == 1 or st.depth_caps[b] < 1 else "tree"
             for b, s in enumerate(st.samplings)]
    if all(k == "greedy" for k in kinds):  # no uniforms needed
        if tree.num_slots == 1:  # a plain step: the root's argmax, what the greedy walk returns on a lone root
            return _root_only(first_max_index(target_logits[:, 0]), draft.max_depth)
        if draft.chain and tree.num_slots == draft.max_depth + 1:
            return verify_greedy_chain_on_host(draft, best if best is not None else first_max_index(target_logits),
                                               len(st.heads))
        out = verify_greedy(tree, target_logits, max_depth=draft.max_depth)
        return Verified(out.accepted_slots, out.accepted_depth, out.next_token)
    streams = VerifyStreams(st.verify_keys, st.verify_offsets())
    draft_probs = draft.draft_probs
    if draft_probs is None:  # deterministic trees: NSS reads no q
        draft_probs = torch.zeros(target_logits.shape, dtype=torch.float32, device=target_logits.device)

    def verify_kind(kind: str, index: torch.Tensor | None, samplings: list[SamplingParams]) -> Verified:
        def rows(t: torch.Tensor) -> torch.Tensor:
            return t if index is None else t.index_select(0, index)

        sub = tree if index is None else FlatTree(rows(tree.tokens), rows(tree.parents), rows(tree.depths),
                                                  rows(tree.draws), rows(tree.valid), tree.process)
        logits = rows(target_logits)
        if kind == "greedy":
            out = verify_greedy(sub, logits, max_depth=draft.max_depth)
            return Verified(out.accepted_slots, out.accepted_depth, out.next_token)
        own = VerifyStreams(rows(streams.keys), rows(streams.offsets))
        if kind == "plain":  # node 0's first uniform, as a drafted tree's root would read it
            token = draw_plain(logits[:, 0], samplings, own.uniforms((sub.batch_size, 1, 1))[:, 0, 0])
            return _root_only(token, draft.max_depth)
        sub_draft = draft if index is None else DraftBatch(
            sub, rows(draft_probs), rows(draft.confidences), rows(draft.entries), rows(draft.tokens_in),
            draft.pending_width, draft.max_depth, draft.chain)
        return sampled(sub_draft, logits, rows(draft_probs), samplings, own)

    if all(k == kinds[0] for k in kinds):
        return verify_kind(kinds[0], None, st.samplings)
    device = target_logits.device
    slots = torch.full((tree.batch_size, draft.max_depth + 1), -1, dtype=torch.long, device=device)
    depth = torch.zeros(tree.batch_size, dtype=torch.long, device=device)
    token = torch.zeros(tree.batch_size, dtype=torch.long, device=device)
    for kind in ("greedy", "plain", "tree"):
        members = [b for b, k in enumerate(kinds) if k == kind]
        if not members:
            continue
        index = torch.tensor(members, dtype=torch.long, device=device)
        part = verify_kind(kind, index, [st.samplings[b] for b in members])
        slots[index] = part.accepted_slots
        depth[index] = part.accepted_depth
        token[index] = part.next_token
    return Verified(slots, depth, token)


def draw_plain(logits: torch.Tensor, samplings: Sequence[SamplingParams], uniforms: torch.Tensor) -> torch.Tensor:
    """The next token of sampled rows that keep their root alone (a plain step): the inverse-CDF draw from
    G(``logits [R, V]``) with ``uniforms [R]``. Where every row samples from its tempered softmax unfiltered
    (no top-k below V, no top-p) and the logits are CPU float32 rows, the native library's one sweep
    (:func:`spec_fast.lean.row_ops.tempered_draw`, the same law up to float rounding) where it is loaded; G
    and the draw over ``[R, V]`` tensors cost ~0.7 ms of a plain step on one thread, the sweep ~0.1 ms.
    Sampled CPU float32 rows with top-k or top-p take the native filtered draw
    (:func:`spec_fast.lean.row_ops.filtered_draw`, G's law up to float rounding): G sorts the whole
    vocabulary, which cost a plain step ~5 ms on one thread. The plain step and :func:`verify_rows`' plain
    rows both draw here, so they give the same token."""
    native_draw = _sampling.native_tempered_draw
    temperature = _native_temperatures(samplings, logits)
    if native_draw is not None and temperature is not None:
        drawn = native_draw(logits, temperature, uniforms.to(torch.float32).contiguous())
        if drawn is not None:
            return drawn
    filtered_draw = _sampling.native_filtered_draw
    cuts = _native_cuts(samplings, logits) if filtered_draw is not None else None
    if filtered_draw is not None and cuts is not None:
        drawn = filtered_draw(logits, *cuts, uniforms.to(torch.float32).contiguous())
        if drawn is not None:
            return drawn
    return _inverse_cdf(target_probs(logits, samplings), uniforms)


def _native_cuts(samplings: Sequence[SamplingParams], logits: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``(temperature [R] float32, top_k [R] int64, top_p [R] float64)`` for the native filtered draw: CPU
    float32 ``logits [R, V]`` and every row sampling (T > 0); else None. ``top_p`` is rounded to float32 first,
    as G's ``[B]`` parameter tensor holds it."""
    if logits.device.type != "cpu" or logits.dtype != torch.float32 or not all(s.temperature > 0 for s in samplings):
        return None
    top_k = torch.tensor([s.top_k for s in samplings], dtype=torch.int64)
    top_p = torch.tensor([s.top_p for s in samplings], dtype=torch.float32).double()
    return _clamped_temperatures(samplings), top_k, top_p


def _root_only(token: torch.Tensor, max_depth: int) -> Verified:
    """The verification of rows that keep their root alone and emit ``token [R]`` after it."""
    slots = torch.full((int(token.shape[0]), max_depth + 1), -1, dtype=torch.long, device=token.device)
    slots[:, 0] = 0
    return Verified(slots, torch.zeros_like(token), token)


def target_probs(logits: torch.Tensor, samplings: Sequence[SamplingParams]) -> torch.Tensor:
    """G(logits) with row b's parameters (``logits [B, ..., V]``)."""
    return _per_row(samplings, lambda s: lambda x: sampling_probs(x, s), greedy_apart=False)(logits)


def draft_law(samplings: Sequence[SamplingParams] | SamplingParams, chain: bool) -> Law:
    """The distribution each row's drafter draws from (logits ``[B, F, V]`` -> ``[B, F, V]``): G(draft
    logits) at T > 0; at T = 0 the draft law is irrelevant to verification, so a ``chain`` follows the
    argmax and K paths sample ``softmax`` (distinct paths). One ``SamplingParams``: every row's."""

    def one(sampling: SamplingParams) -> Law:
        if not sampling.greedy:
            return lambda logits: sampling_probs(logits, sampling)
        if chain:
            return argmax_law
        return lambda logits: torch.softmax(logits.float(), dim=-1)

    if isinstance(samplings, SamplingParams):
        return one(samplings)
    return _per_row(samplings, one, greedy_apart=True)


def _per_row(samplings: Sequence[SamplingParams], make: Callable[[SamplingParams], Law], greedy_apart: bool) -> Law:
    """A function of ``[B, ..., V]`` logits applying ``make(samplings[b])`` to row b (one call per group of
    rows with the same law parameters; seeds do not matter)."""
    groups: dict[tuple[bool, float, int, float], list[int]] = {}
    for b, s in enumerate(samplings):
        groups.setdefault((s.greedy and greedy_apart, *s.law), []).append(b)
    if len(groups) == 1:
        return make(samplings[0])

    def apply(logits: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor | None = None
        for members in groups.values():
            index = torch.tensor(members, dtype=torch.long, device=logits.device)
            part = make(samplings[members[0]])(logits.index_select(0, index))
            if out is None:
                out = torch.zeros(logits.shape, dtype=part.dtype, device=logits.device)
            out[index] = part
        assert out is not None
        return out

    return apply
