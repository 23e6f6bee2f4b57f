"""A retrieval drafter backed by a model drafter (``<draft>+retrieval``): each entry takes the retrieval law
where its match is long enough, the model's law elsewhere."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from spec_fast.drafts.head_drafter import path_depth
from spec_fast.drafts.model import Drafter
from spec_fast.drafts.retrieval import RetrievalDrafter, RetrievalState

__all__ = ["HybridDrafter", "HybridState"]


@dataclass
class HybridState:
    retrieval: RetrievalState
    model: Any


class HybridDrafter(Drafter):
    """A retrieval drafter backed by a model drafter: an entry whose retrieval match is at least
    ``min_match`` tokens long takes the retrieval law, every other entry the model's law. Both advance
    on every entry (the model's cache must cover every entry its later entries attend to)."""

    def __init__(self, retrieval: RetrievalDrafter, model: Drafter, min_match: int = 3) -> None:
        if retrieval.vocab_size != model.vocab_size:
            raise ValueError(f"retrieval vocab_size {retrieval.vocab_size} differs from the model's {model.vocab_size}")
        if isinstance(min_match, bool) or not isinstance(min_match, int) or min_match < 1:
            raise ValueError(f"min_match must be a positive integer, got min_match={min_match!r}")
        self.retrieval = retrieval
        self.model = model
        self.min_match = min_match
        self.vocab_size = model.vocab_size
        self.wants_target_hidden = bool(getattr(model, "wants_target_hidden", False))
        #: a greedy chain's level drafted on the host (:func:`spec_fast.drafts.chain.draft_chain`) where both
        #: drafters draft one there, else None
        self.greedy_next_rows: Callable[..., list[int]] | None = (
            self._greedy_next_rows if getattr(model, "greedy_next_rows", None) is not None else None)
        #: committed tokens taken without a pass, where both drafters take them so (retrieval records them,
        #: a recurrent head needs none), else None
        self.absorb: Callable[[Any, Sequence[Sequence[int]]], None] | None = (
            self._absorb if getattr(model, "absorb", None) is not None else None)

    def begin(self, batch_size: int, device: torch.device) -> HybridState:
        return HybridState(self.retrieval.begin(batch_size, device), self.model.begin(batch_size, device))

    def observe_target(self, state: Any, target_hidden: torch.Tensor, keep: torch.Tensor | None = None,
                       counts: torch.Tensor | None = None) -> None:
        self.model.observe_target(state.model, target_hidden, keep, counts)

    def forward(self, state: Any, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        model_logits = self.model.forward(state.model, tokens, parents)
        retrieval_logits = self.retrieval.forward(state.retrieval, tokens, parents)
        return self._choose(state, retrieval_logits, model_logits)

    def forward_last(self, state: Any, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """:meth:`forward`'s last column, each drafter computing its last entry's law alone."""
        model_logits = self.model.forward_last(state.model, tokens, parents)
        retrieval_logits = self.retrieval.forward_last(state.retrieval, tokens, parents)
        return self._choose(state, retrieval_logits, model_logits)

    def _choose(self, state: Any, retrieval_logits: torch.Tensor, model_logits: torch.Tensor) -> torch.Tensor:
        """Per entry of ``[B, Q, V]`` logits, retrieval's where the match recorded for it (the last ``Q`` of
        each row) is at least ``min_match`` long, else the model's."""
        num_query = retrieval_logits.shape[1]
        lengths = torch.tensor([row[-num_query:] for row in state.retrieval.match_lengths],
                               device=model_logits.device)
        use = (lengths >= self.min_match).unsqueeze(-1)  # [B, Q, 1]
        return torch.where(use, retrieval_logits.to(model_logits.dtype), model_logits)

    def _greedy_next_rows(self, state: Any, tokens: list[list[int]], parents: list[list[int]]) -> list[int]:
        """The argmax of :meth:`forward_last`'s law for host-side rows: retrieval's where its match is long
        enough, else the model's, which scores only those rows (both drafters record every entry)."""
        found = self.retrieval.greedy_next_rows(state.retrieval, tokens, parents)
        short = [b for b, row in enumerate(state.retrieval.match_lengths) if row[-1] < self.min_match]
        model_next = self.model.greedy_next_rows(state.model, tokens, parents, short)  # type: ignore[attr-defined]
        for b in short:
            found[b] = model_next[b]
        return found

    def chain_depths(self, state: Any, law_entries: Sequence[int]) -> list[int] | None:
        """Where the model drafter has a path rule (a recurrent head's ``path_acceptance``): row b's chain takes
        its first level, then each next one while the product of the head's top probabilities over the levels
        the head supplies stays at least that value; a level retrieval supplies (a match of ``min_match``
        tokens or more) counts as certain, as the hybrid without the rule follows every such level. Both read
        the drafter's side only, before the level's draw."""
        path_acceptance = getattr(self.model, "path_acceptance", None)
        if path_acceptance is None:
            return None
        return [path_depth([math.nan if lengths[entry] >= self.min_match else confidences[entry]
                            for entry in law_entries], path_acceptance)
                for lengths, confidences in zip(state.retrieval.match_lengths, state.model.confidences, strict=True)]

    def _absorb(self, state: Any, tokens: Sequence[Sequence[int]]) -> None:
        self.retrieval.absorb(state.retrieval, tokens)
        self.model.absorb(state.model, tokens)  # type: ignore[attr-defined]

    def commit(self, state: Any, keep: torch.Tensor, counts: torch.Tensor, prefix_of_block: bool = False) -> None:
        self.retrieval.commit(state.retrieval, keep, counts, prefix_of_block)
        self.model.commit(state.model, keep, counts, prefix_of_block)

    def num_block(self, state: Any) -> int:
        return self.model.num_block(state.model)

    def take_rows(self, state: Any, rows: list[int]) -> Any:
        return HybridState(self.retrieval.take_rows(state.retrieval, rows), self.model.take_rows(state.model, rows))

    def join_rows(self, state: Any, joining: Any) -> Any:
        return HybridState(self.retrieval.join_rows(state.retrieval, joining.retrieval),
                           self.model.join_rows(state.model, joining.model))

    def passes(self, state: Any) -> int:
        return self.model.passes(state.model)
