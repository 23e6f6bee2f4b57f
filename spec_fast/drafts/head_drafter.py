"""A trained feature head (:class:`spec_fast.drafts.heads.FeatureHead`) as a drafter that advances from the
verifier's accepted hidden states (seed 000 (docs/papers.md) section 7).

The ``eagle`` head attends over its own KV cache (a :class:`~spec_fast.kv_cache.TreeKVCache` of one layer).
The ``rnn`` head attends to nothing, so its per-step state is the features alone: its block bookkeeping is a
:class:`FeatureBlocks` counter, and a greedy chain's level runs on the host (:meth:`HeadDrafter.greedy_next_rows`:
one native call per level where the head has one, :meth:`FeatureHead.level
<spec_fast.drafts.heads.FeatureHead.level>`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from spec_fast.drafts.model import Drafter
from spec_fast.kv_cache import TreeKVCache

if TYPE_CHECKING:
    from spec_fast.drafts.feature_head import FeatureHead

__all__ = ["FeatureBlocks", "HeadDrafter", "HeadState", "path_depth"]


def path_depth(estimates: Sequence[float], path_acceptance: float) -> int:
    """How many levels of a chain to draft given each level's estimated acceptance (NaN: certain): the first,
    then each next one while the product of the estimates so far stays at least ``path_acceptance``."""
    path, depth = 1.0, 0
    for estimate in estimates:
        path *= 1.0 if math.isnan(estimate) else estimate
        if depth >= 1 and path < path_acceptance:
            break
        depth += 1
    return max(depth, 1)


class FeatureBlocks:
    """The block bookkeeping of a head that attends to nothing (``rnn``), in place of a
    :class:`~spec_fast.kv_cache.TreeKVCache`: how many block entries this step appended and how many passes
    ran. Its entries' features live in :attr:`HeadState.block_features`, so a commit only ends the block, and
    rows leave or join without anything to move."""

    def __init__(self) -> None:
        self.num_block = 0
        self.passes = 0

    def extend(self, count: int) -> None:
        """``count`` block entries per row appended by one pass."""
        self.num_block += count
        self.passes += 1

    def commit(self, keep: torch.Tensor, counts: torch.Tensor, prefix_of_block: bool = False) -> None:
        self.num_block = 0

    def take_rows(self, rows: list[int]) -> None:
        return None

    def append_rows(self, joining: FeatureBlocks) -> None:
        return None


@dataclass
class HeadState:
    """Per-generation state of a :class:`HeadDrafter` (``B`` rows)."""

    #: the head's cache (``eagle``) or block bookkeeping (``rnn``)
    cache: TreeKVCache | FeatureBlocks
    #: ``[B, E, H]`` feature predicted at every block entry of this step (fed to the entry's children)
    block_features: torch.Tensor
    #: per row, the target's features of committed entries (oldest first; a zero feature stands for
    #: "before the first token"); only the last ``history`` rows are kept
    history: list[torch.Tensor] = field(default_factory=list)
    prefill_observed: bool = False
    #: the prompt was committed (by a prefill pass or, for ``rnn``, taken without one): later features the
    #: engine hands over are a step's, whose history keeps only the newest rows
    prompt_committed: bool = False
    #: per row, the top probability of each block entry's law where the ``rnn`` head scored it (NaN where it
    #: did not), recorded only for a drafter with ``path_acceptance``
    confidences: list[list[float]] = field(default_factory=list)


class HeadDrafter(Drafter):
    """A :class:`FeatureHead` as a drafter that advances from the verifier's accepted hidden states.

    Protocol with the engine (in addition to :class:`~spec_fast.drafts.model.Drafter`):
    ``wants_target_hidden = True``, and after every target pass that commits entries the engine calls
    ``observe_target(state, target_hidden [B, N, H], keep [B, C], counts [B])`` with the target's final
    normed hidden states of that pass and the committed entries ``keep[b, :counts[b]]`` in order (the
    prompt chain at prefill, the accepted path root-first after a step). Pending tokens (the committed
    tokens the drafter has not seen, ending with the root token) then read the features of the entries
    right before them; draft-tree nodes read their parent's predicted feature.
    """

    wants_target_hidden = True

    def __init__(self, head: FeatureHead, history: int = 64, path_acceptance: float | None = None) -> None:
        if path_acceptance is not None and not (head.kind == "rnn" and 0.0 < path_acceptance < 1.0):
            raise ValueError(f"path_acceptance needs an rnn head and a value in (0, 1), got kind={head.kind!r}, "
                             f"path_acceptance={path_acceptance!r}")
        self.head = head
        #: chains go on while the product of their levels' top probabilities stays at least this (None: to
        #: the strategy's depth); :meth:`chain_depths`
        self.path_acceptance = path_acceptance
        self.vocab_size = head.head.vocab_size
        self.kind = head.kind
        self.history = history
        self.hidden_size = int(head.config.hidden_size)
        # the NDE selector reads a draft's final hidden states: here the predicted features f_j
        self.draft_hidden_size = self.hidden_size
        self._staging = threading.Lock()
        #: a greedy chain's level drafted on the host (:func:`spec_fast.drafts.chain.draft_chain`): the
        #: recurrent head's, which needs no cache; None for ``eagle``
        self.greedy_next_rows: Callable[..., list[int]] | None = (
            self._recurrent_next_rows if self.kind == "rnn" else None)
        #: committed tokens taken without a pass (the prefill's prompt, a plain step's tokens): the recurrent
        #: head's, whose state between steps is the target's features alone; None for ``eagle``, whose
        #: cache needs every entry
        self.absorb: Callable[[Any, Sequence[Sequence[int]]], None] | None = (
            self._recurrent_absorb if self.kind == "rnn" else None)

    def begin(self, batch_size: int, device: torch.device) -> HeadState:
        dtype = next(self.head.parameters()).dtype
        zero = torch.zeros(1, self.hidden_size, dtype=dtype, device=device)
        cache = FeatureBlocks() if self.kind == "rnn" else TreeKVCache(self.head, batch_size, device)
        return HeadState(
            cache=cache,
            block_features=torch.zeros(batch_size, 0, self.hidden_size, dtype=dtype, device=device),
            history=[zero.clone() for _ in range(batch_size)],
            confidences=[[] for _ in range(batch_size)],
        )

    def observe_target(self, state: Any, target_hidden: torch.Tensor, keep: torch.Tensor | None = None,
                       counts: torch.Tensor | None = None) -> None:
        """Append the features of the committed entries (``target_hidden [B, N, H]``, ``keep [B, C]``,
        ``counts [B]``; without ``keep`` every entry counts)."""
        batch = target_hidden.shape[0]
        if keep is None or counts is None:
            keep = torch.arange(target_hidden.shape[1], device=target_hidden.device).expand(batch, -1)
            counts = torch.full((batch,), target_hidden.shape[1], dtype=torch.long)
        count_list = counts.tolist()
        gathered = torch.gather(
            target_hidden, 1, keep.clamp(min=0).unsqueeze(-1).expand(-1, -1, target_hidden.shape[-1])
        ).to(state.block_features.dtype)
        prefill = not state.prompt_committed
        for b in range(batch):
            rows = torch.cat([state.history[b], gathered[b, : count_list[b]]], dim=0)
            # the prefill chain reads its whole history once; afterwards only the newest rows matter
            state.history[b] = rows if prefill else rows[-self.history :]
        if prefill:
            state.prefill_observed = True

    def _entry_features(self, state: Any, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """The feature each new entry reads (``[B, Q, H]``): the target's for a prefill or pending chain, the
        parent's predicted one for draft-tree entries."""
        batch, num_query = tokens.shape
        feats = torch.zeros(batch, num_query, self.hidden_size, dtype=state.block_features.dtype,
                            device=tokens.device)
        if state.cache.num_block == 0 and state.prefill_observed and state.cache.passes == 0:
            # prefill chain (left-aligned): entry i reads the feature of entry i-1 (zero for i = 0)
            for b in range(batch):
                hist = state.history[b]
                n = min(num_query, hist.shape[0])
                feats[b, :n] = hist[:n]
        elif state.cache.num_block == 0:
            # pending chain (right-aligned, ends with the root): the features of the committed entries
            # right before the pending tokens are the newest history rows
            for b in range(batch):
                hist = state.history[b]
                n = min(num_query, hist.shape[0])
                feats[b, num_query - n :] = hist[hist.shape[0] - n :]
        else:
            # tree entries: the parent's predicted feature (-1 = padding below the context: zeros)
            index = parents.clamp(min=0).unsqueeze(-1).expand(-1, -1, self.hidden_size)
            parent_feats = torch.gather(state.block_features, 1, index)
            feats = torch.where((parents >= 0).unsqueeze(-1), parent_feats, feats)
        return feats

    def forward(self, state: Any, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        feats = self._entry_features(state, tokens, parents)
        if self.kind == "rnn":
            batch, num_query = tokens.shape
            _, scores, _ = self._recurrent(state, tokens, feats, list(range(batch * num_query)))
            assert scores is not None
            return self.head.head.dense(scores).view(batch, num_query, -1)
        with self._staging:  # the staged features live on the shared module: one forward at a time
            self.head.staged_features = feats
            try:
                out = state.cache.forward(tokens, parents)
            finally:
                self.head.staged_features = None
        state.block_features = torch.cat([state.block_features, out.features], dim=1)
        logits: torch.Tensor = out.logits
        return logits

    def forward_hidden(self, state: Any, tokens: torch.Tensor, parents: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward` plus the features it predicted (``[B, Q, H]``, what the LM head read)."""
        logits = self.forward(state, tokens, parents)
        return logits, state.block_features[:, -tokens.shape[1]:]

    def forward_last(self, state: Any, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        if self.kind != "rnn":
            return super().forward_last(state, tokens, parents)
        batch, num_query = tokens.shape
        feats = self._entry_features(state, tokens, parents)
        _, scores, _ = self._recurrent(state, tokens, feats, [b * num_query + num_query - 1 for b in range(batch)])
        assert scores is not None
        return self.head.head.dense(scores).unsqueeze(1)

    def _recurrent(self, state: Any, tokens: torch.Tensor, feats: torch.Tensor, head_rows: list[int]
                   ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """The ``rnn`` head over ``tokens [B, Q]`` reading ``feats [B, Q, H]``: appends the predicted features
        to the block and returns them with the subset scores and first maxima of the flat rows ``head_rows``
        (row ``b * Q + q``), as :meth:`FeatureHead.level <spec_fast.drafts.heads.FeatureHead.level>` gives."""
        batch, num_query = tokens.shape
        # a drafter never trains: without the shared embedding's gradient the native level serves any caller
        embeds = self.head.embed[0](tokens.clamp(min=0)).detach().to(feats.dtype)
        features, scores, first = self.head.level(embeds.reshape(-1, self.hidden_size),
                                                  feats.reshape(-1, self.hidden_size), head_rows)
        state.block_features = torch.cat([state.block_features, features.view(batch, num_query, -1)], dim=1)
        state.cache.extend(num_query)
        if self.path_acceptance is not None:
            tops = [math.nan] * (batch * num_query)
            if scores is not None and head_rows:
                top_probabilities = torch.softmax(scores.float(), dim=-1).amax(dim=-1).tolist()
                for row, top in zip(head_rows, top_probabilities, strict=True):
                    tops[row] = top
            for b in range(batch):
                state.confidences[b].extend(tops[b * num_query:(b + 1) * num_query])
        return features, scores, first

    def _recurrent_next_rows(self, state: Any, tokens: list[list[int]], parents: list[list[int]],
                             rows: Sequence[int] | None = None) -> list[int]:
        """``first_max_index`` of :meth:`forward_last`'s logits for host-side ``tokens``/``parents`` rows (``B``
        lists of ``Q``), for the rows ``rows`` (default every row; 0 for the others), recording the same
        features: the subset's ids ascend, so the first maximum of the subset scores is the dense argmax."""
        device = state.block_features.device
        token_rows = torch.tensor(tokens, dtype=torch.long, device=device)
        feats = self._entry_features(state, token_rows, torch.tensor(parents, dtype=torch.long, device=device))
        num_query = len(tokens[0]) if tokens else 0
        asked = list(range(len(tokens))) if rows is None else list(rows)
        _, _, first = self._recurrent(state, token_rows, feats, [b * num_query + num_query - 1 for b in asked])
        out = [0] * len(tokens)
        if first is not None:
            for b, token in zip(asked, self.head.head.vocab_ids[first.to(device)].tolist(), strict=True):
                out[b] = int(token)
        return out

    def _recurrent_absorb(self, state: Any, tokens: Sequence[Sequence[int]]) -> None:
        """Committed ``tokens`` (per row) that need no pass: a recurrent level reads only the target's feature of
        the entry before it (:meth:`observe_target` recorded it), so the prompt's features (which a prefill
        pass would compute and the commit drop) and those of a plain step's tokens are never needed; only
        the history is cut, as a commit cuts it."""
        state.prefill_observed = False
        state.prompt_committed = True
        state.history = [rows[-self.history :] for rows in state.history]

    def chain_depths(self, state: Any, law_entries: Sequence[int]) -> list[int] | None:
        """With ``path_acceptance``: row b's chain takes its first level, then each next one while the product
        of the top probabilities of the laws its levels are drawn from stays at least ``path_acceptance`` (the
        law's shape, read before its draw; an entry the head did not score counts as certain)."""
        if self.path_acceptance is None:
            return None
        return [path_depth([rows[entry] for entry in law_entries], self.path_acceptance)
                for rows in state.confidences]

    def commit(self, state: Any, keep: torch.Tensor, counts: torch.Tensor, prefix_of_block: bool = False) -> None:
        state.cache.commit(keep, counts, prefix_of_block)
        state.block_features = state.block_features[:, :0]
        state.confidences = [[] for _ in state.confidences]
        state.prefill_observed = False
        state.prompt_committed = True
        state.history = [rows[-self.history :] for rows in state.history]

    def num_block(self, state: Any) -> int:
        return int(state.cache.num_block)

    def take_rows(self, state: Any, rows: list[int]) -> Any:
        state.cache.take_rows(rows)
        index = torch.tensor(rows, dtype=torch.long, device=state.block_features.device)
        state.block_features = state.block_features.index_select(0, index)
        state.history = [state.history[b] for b in rows]
        state.confidences = [state.confidences[b] for b in rows]
        return state

    def join_rows(self, state: Any, joining: Any) -> Any:
        state.cache.append_rows(joining.cache)
        state.block_features = torch.cat([state.block_features, joining.block_features], dim=0)
        state.history = state.history + joining.history
        state.confidences = state.confidences + joining.confidences
        state.prefill_observed = False
        return state

    def passes(self, state: Any) -> int:
        return int(state.cache.passes)
