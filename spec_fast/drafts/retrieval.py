"""Retrieval drafting: next-token laws from suffix matches, no draft model (prompt lookup + a datastore).

A :class:`RetrievalDrafter` drafts from two token sources and needs no forward pass at all:

* the row's own text (prompt + everything committed + the draft path to the entry): the longest suffix of
  the context that occurred earlier in it, and what followed it there (prompt-lookup decoding, loops and
  copied spans);
* a :class:`SuffixIndex` over a datastore of token sequences (for the default target: its own greedy
  responses to the training prompts, ``spec_fast/weights/datastore.npz``, written by
  ``scripts/train_drafts.py``): the longest suffix of the context found in the datastore, and the counts of
  the tokens that followed its occurrences.

The longer of the two matches wins (the row's own text on a tie); its next-token counts are the draft
law, ``logits = log(count)`` (``-inf`` for tokens never seen after the match, so the law is a proper
distribution over the target vocabulary and every verifier stays lossless). The empty match is the
datastore's unigram law, so every entry gets a distribution. :attr:`RetrievalState.match_lengths` keeps
the match length of every block entry (:class:`spec_fast.drafts.hybrid.HybridDrafter` falls back to a model where
it is short).

The index is host-side (NumPy): a forward reads its block tokens back from the device. That is one sync
per draft level, the price of drafting without a model.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from spec_fast.drafts.model import Drafter

__all__ = ["SuffixIndex", "RetrievalState", "RetrievalDrafter", "DATASTORE_PATH", "PATH_ACCEPTANCE",
           "FIRST_ACCEPTANCE", "MATCH_CLASSES", "match_class",
           "save_datastore", "load_datastore", "load_retrieval_drafter", "context_match", "datastore_sequences",
           "ASSISTANT_HEADER_TOKENS"]

#: prompt tokens kept before each response in the datastore (SmolLM2's ``<|im_start|>assistant\n`` is 3 of
#: them, plus the end of the user turn), so a response's first tokens match the start of a reply
ASSISTANT_HEADER_TOKENS = 4


def datastore_sequences(pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[list[int]]:
    """The datastore of ``(prompt_ids, response_ids)`` pairs: each response behind the last
    :data:`ASSISTANT_HEADER_TOKENS` prompt tokens (the user's text is left out)."""
    return [list(p[len(p) - min(len(p), ASSISTANT_HEADER_TOKENS):]) + list(r) for p, r in pairs]


DATASTORE_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "weights", "datastore.npz")

_NONE = -1  # key value before the start of a sequence (never a token id)


_INT32_MIN, _INT32_MAX = int(np.iinfo(np.int32).min), int(np.iinfo(np.int32).max)


class SuffixIndex:
    """Every position of a set of token sequences, sorted by its reversed left context (up to ``max_match``
    tokens), so the occurrences of any context suffix form one contiguous range found by binary search.

    ``sequences``: token-id sequences (ids ``>= 0``); matches never cross a sequence boundary.
    """

    def __init__(self, sequences: Sequence[Sequence[int]], vocab_size: int, max_match: int = 16) -> None:
        if isinstance(max_match, bool) or not isinstance(max_match, int) or max_match < 1:
            raise ValueError(f"max_match must be a positive integer, got max_match={max_match!r}")
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive integer, got vocab_size={vocab_size!r}")
        self.max_match = max_match
        self.vocab_size = vocab_size
        keys: list[np.ndarray] = []
        nexts: list[np.ndarray] = []
        for s, seq in enumerate(sequences):
            arr = np.asarray(seq, dtype=np.int64)
            if arr.ndim != 1:
                raise ValueError(f"sequences[{s}] must be a flat token sequence, got shape {arr.shape}")
            if arr.size and (arr.min() < 0 or arr.max() >= vocab_size):
                raise ValueError(f"sequences[{s}] has token ids outside [0, {vocab_size}): "
                                 f"min {arr.min()}, max {arr.max()}")
            if arr.size < 2:
                continue
            # key[i, m] = the token m + 1 places before position i (i >= 1), _NONE before the start
            padded = np.concatenate([np.full(max_match, _NONE, dtype=np.int64), arr])
            idx = np.arange(1, arr.size)[:, None] + max_match - 1 - np.arange(max_match)[None, :]
            keys.append(padded[idx])
            nexts.append(arr[1:])
        key = np.concatenate(keys) if keys else np.zeros((0, max_match), dtype=np.int64)
        nxt = np.concatenate(nexts) if nexts else np.zeros(0, dtype=np.int64)
        order = np.lexsort(key.T[::-1]) if key.shape[0] else np.zeros(0, dtype=np.int64)
        # columns stored contiguously: keys[m] is the (m+1)-th token to the left of every sorted position,
        # so each binary search below reads a contiguous slice
        self.keys = np.ascontiguousarray(key[order].T).astype(np.int32)  # [max_match, N]
        self.next_tokens = nxt[order].astype(np.int64)  # [N]
        self._unigram_ids, unigram_counts = np.unique(self.next_tokens, return_counts=True)
        self._unigram_counts = unigram_counts.astype(np.float64)

    def __len__(self) -> int:
        return int(self.next_tokens.shape[0])

    def match_range(self, context: Sequence[int]) -> tuple[int, int, int]:
        """``(m, lo, hi)``: the longest match length ``m`` of :meth:`match` and its sorted positions ``lo:hi``."""
        lo, hi = 0, len(self)
        m = 0
        limit = min(self.max_match, len(context))
        while m < limit and hi > lo:
            token = int(context[len(context) - 1 - m])
            if not _INT32_MIN <= token <= _INT32_MAX:  # not in the int32 keys
                break
            # searched as an int32: with a Python int, numpy cast the whole int32 column to int64 first, on
            # every search
            value = np.int32(token)
            column = self.keys[m, lo:hi]
            new_lo = lo + int(np.searchsorted(column, value, side="left"))
            new_hi = lo + int(np.searchsorted(column, value, side="right"))
            if new_lo == new_hi:
                break
            lo, hi, m = new_lo, new_hi, m + 1
        return m, lo, hi

    def match(self, context: Sequence[int]) -> tuple[int, np.ndarray, np.ndarray]:
        """``(m, ids, counts)``: the longest ``m <= max_match`` such that ``context[-m:]`` occurs in the
        datastore followed by a token, and the distinct following tokens ``ids`` (ascending) with their
        counts (``m = 0``: the unigram law of every position)."""
        m, lo, hi = self.match_range(context)
        return (m, *self.followers(m, lo, hi))

    def followers(self, m: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, counts)`` of :meth:`match` for the match ``(m, lo, hi)`` that :meth:`match_range` found."""
        if m == 0:
            return self._unigram_ids, self._unigram_counts
        ids, counts = np.unique(self.next_tokens[lo:hi], return_counts=True)
        return ids, counts.astype(np.float64)


def context_match(context: Sequence[int], max_match: int) -> tuple[int, np.ndarray, np.ndarray]:
    """``(m, ids, counts)`` for the row's own text: the longest ``m <= max_match`` such that
    ``context[-m:]`` also ends at an earlier position of ``context``, the distinct tokens ``ids``
    (ascending) that followed those earlier occurrences and their counts, plus one half for the most
    recent one (so it wins a tie). ``m = 0`` (no earlier occurrence): empty ``ids``."""
    arr = np.asarray(context, dtype=np.int64)
    n = arr.size
    empty = np.zeros(0, dtype=np.int64)
    if n < 2:
        return 0, empty, empty.astype(np.float64)
    # candidates: ends j < n - 1 of earlier occurrences (the follower is arr[j + 1])
    ends = np.nonzero(arr[: n - 1] == arr[n - 1])[0]
    if not ends.size:
        return 0, empty, empty.astype(np.float64)
    # every candidate's match length at once: offsets 0 .. max_match - 1 back from its end and from the
    # context's end, equal while the run lasts (one array pass instead of a loop of array passes per offset)
    back = np.arange(max_match)
    earlier = ends[:, None] - back[None, :]  # [ends, max_match]
    inside = earlier >= 0
    equal = inside & (arr[np.where(inside, earlier, 0)] == arr[np.maximum(n - 1 - back, 0)][None, :])
    lengths = np.cumprod(equal, axis=1).sum(axis=1)
    m = int(lengths.max())
    ends = ends[lengths == m]
    ids, counts = np.unique(arr[ends + 1], return_counts=True)
    weights = counts.astype(np.float64)
    weights[np.searchsorted(ids, arr[ends[-1] + 1])] += 0.5
    return m, ids, weights


def save_datastore(path: str, sequences: Sequence[Sequence[int]], metadata: dict[str, str] | None = None) -> None:
    """Write token sequences (ids < 65536) as a compressed ``.npz``: ``tokens`` (uint16, concatenated),
    ``offsets`` (int64, ``len + 1``) and one ``meta_<key>`` string array per metadata entry."""
    lengths = [len(s) for s in sequences]
    flat = np.concatenate([np.asarray(s, dtype=np.int64) for s in sequences]) if sequences else np.zeros(0, np.int64)
    if flat.size and (flat.min() < 0 or flat.max() >= 2**16):
        raise ValueError(f"datastore token ids must lie in [0, 65536), got min {flat.min()}, max {flat.max()}")
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    extra = {f"meta_{k}": np.array(v) for k, v in (metadata or {}).items()}
    np.savez_compressed(path, tokens=flat.astype(np.uint16), offsets=offsets, **extra)  # type: ignore[arg-type]


def load_datastore(path: str | None = None) -> tuple[list[list[int]], dict[str, str]]:
    """The sequences and metadata written by :func:`save_datastore` (default: the committed datastore)."""
    with np.load(path or DATASTORE_PATH, allow_pickle=False) as data:
        tokens = data["tokens"].astype(np.int64)
        offsets = data["offsets"]
        meta = {k[len("meta_"):]: str(data[k]) for k in data.files if k.startswith("meta_")}
    sequences = [tokens[offsets[i]: offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]
    return sequences, meta


@dataclass
class RetrievalState:
    """Per-row host state: committed tokens, this step's block (tokens, parents) and match lengths (-1 where
    :meth:`RetrievalDrafter.forward_last` skipped an entry's law)."""

    committed: list[list[int]]
    block_tokens: list[list[int]]
    block_parents: list[list[int]]
    match_lengths: list[list[int]] = field(default_factory=list)
    passes: int = 0
    #: per row, the match lengths behind the levels of the chain drafted this step (empty: none drafted)
    chain_matches: list[list[int]] = field(default_factory=list)
    #: per row, [accepted, reached] per match class (:data:`MATCH_CLASSES`), faded at every chain step
    acceptance: list[list[list[float]]] = field(default_factory=list)


#: Classes of match length for the acceptance a ``path_acceptance`` drafter learns: the class of a match of
#: m tokens is the number of bounds it reaches (m <= 0: class 0; 1-2: 1; 3-5: 2; 6-9: 3; 10 or more: 4)
MATCH_CLASSES = (1, 3, 6, 10)
#: the acceptance assumed per class before a row has evidence (as PRIOR_WEIGHT pseudo-observations): roughly
#: what drafts behind such matches scored on the tuning prompts (scratch: 20-27% at 1-2 tokens, 56-90% at 4+)
PRIOR_ACCEPTANCE = (0.1, 0.25, 0.45, 0.7, 0.85)
PRIOR_WEIGHT = 4.0
#: the weight a step's counts keep at each later chain step (the text's regime changes within a reply)
EVIDENCE_DECAY = 0.9


def match_class(length: int) -> int:
    """The class of a match of ``length`` tokens (:data:`MATCH_CLASSES`)."""
    return sum(length >= bound for bound in MATCH_CLASSES)


class RetrievalDrafter(Drafter):
    """Drafts from suffix matches in the row's own text and in a :class:`SuffixIndex` (module docstring).

    ``index`` may be None (prompt lookup only; the empty match is then the uniform law). How deep a chain
    goes (:meth:`chain_depths`; None for both: every level of the strategy's depth):

    * ``deep_match``: past its first level only while the law of each next level comes from a match of at
      least this many tokens;
    * ``path_acceptance``: past its first level only while the product of the row's estimated acceptance of
      every level so far, each from the class of its match length (:data:`MATCH_CLASSES`), is at least
      this; the estimates are the row's own accepted / reached counts per class from its earlier chains
      (:meth:`observe_chain`), pulled toward :data:`PRIOR_ACCEPTANCE`. Both read the row's text and its past
      steps only, so every verifier stays exact.

    ``first_acceptance`` (with ``path_acceptance``) gates the first level the same way: a row drafts only where
    its estimated acceptance of a token behind the match its context ends with reaches it, and otherwise takes a
    plain step (:meth:`drafts_first_level`); the counts of a row that does not draft fade as if it had, so a
    class whose estimate fell below the gate returns to its prior and is tried again.
    """

    def __init__(self, index: SuffixIndex | None, vocab_size: int, max_match: int = 16,
                 deep_match: int | None = None, path_acceptance: float | None = None,
                 first_acceptance: float | None = None) -> None:
        if index is not None and index.vocab_size != vocab_size:
            raise ValueError(f"index vocab_size {index.vocab_size} differs from vocab_size={vocab_size}")
        if deep_match is not None and (isinstance(deep_match, bool) or not isinstance(deep_match, int)
                                       or deep_match < 1):
            raise ValueError(f"deep_match must be a positive integer or None, got deep_match={deep_match!r}")
        if path_acceptance is not None and not 0.0 < path_acceptance < 1.0:
            raise ValueError(f"path_acceptance must lie in (0, 1) or be None, got path_acceptance={path_acceptance!r}")
        if deep_match is not None and path_acceptance is not None:
            raise ValueError("give deep_match or path_acceptance, not both")
        if first_acceptance is not None and not 0.0 < first_acceptance < 1.0:
            raise ValueError(f"first_acceptance must lie in (0, 1) or be None, "
                             f"got first_acceptance={first_acceptance!r}")
        if first_acceptance is not None and path_acceptance is None:
            raise ValueError("first_acceptance gates with path_acceptance's estimates: give path_acceptance too")
        self.index = index
        self.vocab_size = vocab_size
        self.max_match = max_match
        self.deep_match = deep_match
        self.path_acceptance = path_acceptance
        self.first_acceptance = first_acceptance

    def begin(self, batch_size: int, device: torch.device) -> RetrievalState:
        return RetrievalState(committed=[[] for _ in range(batch_size)], block_tokens=[[] for _ in range(batch_size)],
                              block_parents=[[] for _ in range(batch_size)],
                              match_lengths=[[] for _ in range(batch_size)],
                              chain_matches=[[] for _ in range(batch_size)],
                              acceptance=[[[0.0, 0.0] for _ in PRIOR_ACCEPTANCE] for _ in range(batch_size)])

    def sparse_law(self, context: Sequence[int]) -> tuple[int, np.ndarray, np.ndarray]:
        """``(match length, ids, weights)``: the longer of the two matches (own text on a tie); without a
        datastore and without an own-text match, every token with weight 1."""
        m_own, own_ids, own = context_match(context, self.max_match)
        if self.index is None:
            if m_own > 0:
                return m_own, own_ids, own
            return 0, np.arange(self.vocab_size), np.ones(self.vocab_size)
        # the datastore's law is needed only where its match is longer than the own text's (a tie goes to the
        # own text): its length first, the followers of the matched positions (a sort) only then
        if m_own > 0 and m_own >= self.index.max_match:
            return m_own, own_ids, own
        m_data, lo, hi = self.index.match_range(context)
        if m_own >= m_data and m_own > 0:
            return m_own, own_ids, own
        return (m_data, *self.index.followers(m_data, lo, hi))

    def law(self, context: Sequence[int]) -> tuple[int, np.ndarray]:
        """``(match length, weights [V])``: :meth:`sparse_law` as a dense vector (zeros elsewhere)."""
        m, ids, weights = self.sparse_law(context)
        dense = np.zeros(self.vocab_size)
        dense[ids] = weights
        return m, dense

    def forward(self, state: Any, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """``tokens [B, Q]``, ``parents [B, Q]`` -> logits ``[B, Q, V]`` (``log`` of the match weights,
        ``-inf`` elsewhere)."""
        return self._forward(state, tokens, parents, last_only=False)

    def forward_last(self, state: Any, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """:meth:`forward`'s last column ``[B, 1, V]``, without the laws of the other entries (their match
        lengths are recorded as -1): a builder's pending tokens need the root's law only."""
        return self._forward(state, tokens, parents, last_only=True)

    def greedy_next_rows(self, state: Any, tokens: list[list[int]], parents: list[list[int]]) -> list[int]:
        """``first_max_index`` of :meth:`forward_last`'s logits for host-side ``tokens``/``parents`` rows (``B``
        lists of ``Q``): the lowest id of the largest match weight at each row's last entry, recording the
        same block and match lengths, without building the ``[B, 1, V]`` logits: a greedy chain's level,
        drafted on the host (:func:`spec_fast.drafts.chain.draft_chain`)."""
        # ids ascend (np.unique), so np.argmax's first maximum is the lowest id, as the dense argmax's is; an
        # empty law (a datastore without followers) is all -inf there, whose first maximum is id 0
        return [int(ids[int(np.argmax(weights))]) if len(ids) else 0
                for ids, weights in self.sparse_next_rows(state, tokens, parents)]

    def sparse_next_rows(self, state: Any, tokens: list[list[int]], parents: list[list[int]]
                         ) -> list[tuple[np.ndarray, np.ndarray]]:
        """:meth:`forward_last` for host-side ``tokens``/``parents`` rows (``B`` lists of ``Q``) as each row's
        ``(ids, weights)`` at its last entry (ids ascending; the logits are ``log(weights)`` there and ``-inf``
        elsewhere), recording the same block and match lengths: a sampled chain's level, drafted over the
        matched ids alone (:func:`spec_fast.drafts.chain.draft_chain`)."""
        return [(ids, weights) for _, _, ids, weights in self._laws(state, tokens, parents, last_only=True)]

    def _forward(self, state: Any, tokens: torch.Tensor, parents: torch.Tensor, last_only: bool) -> torch.Tensor:
        batch, num_query = tokens.shape
        logits = torch.full((batch, 1 if last_only else num_query, self.vocab_size), -math.inf)
        tok_list, par_list = torch.stack([tokens, parents]).tolist()  # one host read for both
        for b, q, ids, weights in self._laws(state, tok_list, par_list, last_only):
            logits[b, q, torch.from_numpy(ids)] = torch.from_numpy(np.log(weights)).float()
        return logits.to(tokens.device)

    def _laws(self, state: Any, tok_list: list[list[int]], par_list: list[list[int]], last_only: bool
              ) -> list[tuple[int, int, np.ndarray, np.ndarray]]:
        """Append the ``tokens``/``parents`` rows (``B`` lists of ``Q``) to each row's block and return
        ``(row, column, ids, weights)`` of the law below every entry (the last alone with ``last_only``: the
        others' match lengths are recorded as -1)."""
        laws = []
        for b, row in enumerate(tok_list):
            btoks, bpars, blens = state.block_tokens[b], state.block_parents[b], state.match_lengths[b]
            num_query = len(row)
            for q in range(num_query):
                btoks.append(int(row[q]))
                bpars.append(int(par_list[b][q]))
                if last_only and q < num_query - 1:
                    blens.append(-1)
                    continue
                path: list[int] = []
                node = len(btoks) - 1
                while node >= 0:
                    path.append(btoks[node])
                    node = bpars[node]
                m, ids, weights = self.sparse_law(state.committed[b] + path[::-1])
                blens.append(m)
                laws.append((b, 0 if last_only else q, ids, weights))
        state.passes += 1
        return laws

    def commit(self, state: Any, keep: torch.Tensor, counts: torch.Tensor, prefix_of_block: bool = False) -> None:
        # one host read for both: the counts ride as the last column
        counts_column = counts.to(device=keep.device, dtype=torch.long).unsqueeze(1)
        rows = torch.cat([keep.to(torch.long), counts_column], dim=1).tolist()
        self.commit_rows(state, [row[: row[-1]] for row in rows])

    def commit_rows(self, state: Any, keep: Sequence[Sequence[int]]) -> None:
        """:meth:`commit` of host-side rows: row b keeps its block entries ``keep[b]``, in order (the engine's
        commit hands them over as they are, without building the index tensors)."""
        for b in range(len(state.committed)):
            state.committed[b].extend(state.block_tokens[b][i] for i in keep[b])
            state.block_tokens[b] = []
            state.block_parents[b] = []
            state.match_lengths[b] = []

    def num_block(self, state: Any) -> int:
        return len(state.block_tokens[0]) if state.block_tokens else 0

    def chain_depths(self, state: Any, law_entries: Sequence[int]) -> list[int] | None:
        """Row b's chain: the first level, then each next one while the rule of ``deep_match`` or
        ``path_acceptance`` (class docstring) holds for the law it would be drawn from."""
        if self.deep_match is None and self.path_acceptance is None:
            return None
        depths = []
        for b, lengths in enumerate(state.match_lengths):
            matches = [lengths[entry] for entry in law_entries]
            if self.deep_match is not None:
                depth = 1
                while depth < len(matches) and matches[depth] >= self.deep_match:
                    depth += 1
            else:
                assert self.path_acceptance is not None
                estimate = self.acceptance_estimates(state, b)
                path = estimate[match_class(matches[0])]
                depth = 1
                while depth < len(matches):
                    path *= estimate[match_class(matches[depth])]
                    if path < self.path_acceptance:
                        break
                    depth += 1
            state.chain_matches[b] = matches[:depth]
            depths.append(depth)
        return depths

    def drafts_first_level(self, state: Any, row: int, pending: Sequence[int]) -> bool:
        """With ``first_acceptance``: whether the row's estimated acceptance for the class of the match its
        context ends with (:meth:`match_length`) reaches it; True without."""
        if self.first_acceptance is None:
            return True
        match = self.match_length(state, row, pending)
        return self.acceptance_estimates(state, row)[match_class(match)] >= self.first_acceptance

    def acceptance_estimates(self, state: Any, row: int) -> list[float]:
        """Row ``row``'s estimated acceptance of a draft token per match class: its faded counts plus
        :data:`PRIOR_WEIGHT` pseudo-observations at :data:`PRIOR_ACCEPTANCE`."""
        return [(accepted + PRIOR_WEIGHT * prior) / (reached + PRIOR_WEIGHT)
                for (accepted, reached), prior in zip(state.acceptance[row], PRIOR_ACCEPTANCE, strict=True)]

    def observe_chain(self, state: Any, accepted: Sequence[int], depths: Sequence[int]) -> None:
        """After a chain step: row b's chain was cut to ``depths[b]`` levels and its first ``accepted[b]``
        tokens were accepted. Each level reached (every accepted one and the first rejected one) counts for
        the class of its match, after every count has faded by :data:`EVIDENCE_DECAY`. With
        ``first_acceptance``, the counts of a row that drafted nothing fade too."""
        for b, matches in enumerate(state.chain_matches):
            depth = min(len(matches), int(depths[b])) if b < len(depths) else 0
            counts = state.acceptance[b]
            if depth >= 1 or self.first_acceptance is not None:
                for pair in counts:
                    pair[0] *= EVIDENCE_DECAY
                    pair[1] *= EVIDENCE_DECAY
            if depth < 1:
                state.chain_matches[b] = []
                continue
            for level in range(min(int(accepted[b]) + 1, depth)):
                pair = counts[match_class(matches[level])]
                pair[1] += 1.0
                pair[0] += 1.0 if level < int(accepted[b]) else 0.0
            state.chain_matches[b] = []

    def take_rows(self, state: Any, rows: list[int]) -> Any:
        return RetrievalState([state.committed[b] for b in rows], [state.block_tokens[b] for b in rows],
                              [state.block_parents[b] for b in rows], [state.match_lengths[b] for b in rows],
                              state.passes, [state.chain_matches[b] for b in rows],
                              [state.acceptance[b] for b in rows])

    def join_rows(self, state: Any, joining: Any) -> Any:
        return RetrievalState(state.committed + joining.committed, state.block_tokens + joining.block_tokens,
                              state.block_parents + joining.block_parents,
                              state.match_lengths + joining.match_lengths, state.passes + joining.passes,
                              state.chain_matches + joining.chain_matches, state.acceptance + joining.acceptance)

    def passes(self, state: Any) -> int:
        return int(state.passes)

    def absorb(self, state: Any, tokens: Sequence[Sequence[int]]) -> None:
        """Append committed ``tokens`` per row without computing their laws: what ``forward`` then
        ``commit`` of the whole chain leave in the state (a prompt's laws are never read), at a fraction
        of the cost (no ``[B, Q, V]`` logits; about 0.5 s for a 600-token prompt otherwise)."""
        for b, row in enumerate(tokens):
            state.committed[b].extend(int(t) for t in row)

    def match_length(self, state: Any, row: int, pending: Sequence[int]) -> int:
        """The match length of :meth:`sparse_law` at the end of row ``row``'s committed tokens and
        ``pending`` (the context the next draft starts from): a cheap forecast of the draft's acceptance."""
        context = state.committed[row] + list(pending)
        m_own = context_match(context, self.max_match)[0]
        # the match length alone (sparse_law's m is the longer of the two): no law of the matched tokens
        m_data = self.index.match_range(context)[0] if self.index is not None else 0
        return int(max(m_own, m_data))


#: The ``path_acceptance`` of the retrieval draft loaded by name: a chain goes one level deeper while the
#: row's estimated chance that every level so far is accepted stays at 0.4 or more. On the tuning prompts
#: (scratch runs at 1 thread, ``chain:8``) 0.3 and 0.4 decoded alike and 0.5 slower; against a fixed
#: ``deep_match`` of 6 (the best of 3-8 there) 1.60x against 1.56x plain on input-grounded prompts and 1.22x
#: against 1.21x on chat.
PATH_ACCEPTANCE = 0.4
#: The ``first_acceptance`` of the retrieval draft loaded by name: None, every row drafts its first level. A
#: gate of 0.4 (at the priors, rows behind matches of 0-2 tokens take plain steps) gained nothing on the tuning
#: prompts: ``chain:4`` 1.00x / 1.32x / 1.11x plain on chat / input-grounded / long against 1.04x / 1.34x /
#: 1.12x without it (bench/results/defaults_cc23301/defaults.md, the ``first=`` rows); a caller may still set one.
FIRST_ACCEPTANCE: float | None = None


def load_retrieval_drafter(vocab_size: int, path: str | None = None, max_match: int = 16,
                           deep_match: int | None = None, path_acceptance: float | None = PATH_ACCEPTANCE,
                           first_acceptance: float | None = FIRST_ACCEPTANCE) -> RetrievalDrafter:
    """A :class:`RetrievalDrafter` over the committed datastore (or ``path``); its chains follow
    ``path_acceptance`` (:data:`PATH_ACCEPTANCE`) and ``first_acceptance`` (:data:`FIRST_ACCEPTANCE`) unless
    another rule is given (``deep_match`` drops both)."""
    sequences, _ = load_datastore(path)
    if deep_match is not None:
        path_acceptance = first_acceptance = None
    return RetrievalDrafter(SuffixIndex(sequences, vocab_size, max_match), vocab_size, max_match, deep_match,
                            path_acceptance, first_acceptance)
