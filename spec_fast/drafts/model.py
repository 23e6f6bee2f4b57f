"""Drafters: a separate HF draft model, or a self-speculative early-exit drafter built from the target.

A drafter owns its own :class:`~spec_fast.kv_cache.TreeKVCache` and exposes the three operations the
engine needs, all batched over ``B`` rows:

* :meth:`Drafter.begin` — a fresh state for ``B`` rows;
* :meth:`Drafter.forward` — logits ``[B, Q, V]`` for ``Q`` new block entries attached by parent index
  (tree attention, depth-based positions);
* :meth:`Drafter.commit` — keep exactly the accepted entries (gathered in place).

A drafter that sets ``wants_target_hidden = True`` (the trained heads of :mod:`spec_fast.drafts.heads`) gets
:meth:`Drafter.observe_target` calls with the target's final hidden states after the prompt prefill and
after every step, plus the committed entries (the accepted path, root first): the hook through which
draft heads advance from the verifier's accepted hidden states (seed 000 (docs/papers.md) section 7). It is a no-op here.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from spec_fast.kv_cache import TreeKVCache

__all__ = ["Drafter", "ModelDrafter", "early_exit_model", "EarlyExitDrafter"]


class Drafter:
    """Interface of a drafter (see the module docstring)."""

    vocab_size: int

    def begin(self, batch_size: int, device: torch.device) -> Any:
        raise NotImplementedError

    def forward(self, state: Any, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """``tokens [B, Q]``, ``parents [B, Q]`` (block indices, -1 = below the context) -> logits ``[B, Q, V]``."""
        raise NotImplementedError

    def forward_last(self, state: Any, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` of every entry, returning the last entry's logits only, ``[B, 1, V]`` (a drafter
        that computes each entry's law on its own may skip the others')."""
        return self.forward(state, tokens, parents)[:, -1:]

    def commit(self, state: Any, keep: torch.Tensor, counts: torch.Tensor, prefix_of_block: bool = False) -> None:
        """Keep block entries ``keep[b, :counts[b]]`` (``keep [B, C]``, ``counts [B]``); see
        :meth:`~spec_fast.kv_cache.TreeKVCache.commit` for ``prefix_of_block``."""
        raise NotImplementedError

    def num_block(self, state: Any) -> int:
        raise NotImplementedError

    def passes(self, state: Any) -> int:
        raise NotImplementedError

    def take_rows(self, state: Any, rows: list[int]) -> Any:
        """The state of ``rows`` only, in that order (between steps: finished requests leave the batch)."""
        raise ValueError(f"drafter {type(self).__name__} cannot drop rows of a running batch")

    def join_rows(self, state: Any, joining: Any) -> Any:
        """``state``'s rows, then ``joining``'s (between steps: prefilled requests join the batch)."""
        raise ValueError(f"drafter {type(self).__name__} cannot take new rows into a running batch")

    #: True for drafters that read the verifier's hidden states (the engine then calls observe_target)
    wants_target_hidden = False

    def observe_target(self, state: Any, target_hidden: torch.Tensor, keep: torch.Tensor | None = None,
                       counts: torch.Tensor | None = None) -> None:
        """Hook for trained heads: ``target_hidden [B, N, H]`` (final hidden states of one target pass) and
        the committed entries ``keep[b, :counts[b]]`` (``keep [B, C]``, ``counts [B]``) in order."""
        return None

    def chain_depths(self, state: Any, law_entries: Sequence[int]) -> list[int] | None:
        """How deep each row would draft a chain whose level-k token is drawn from the law of block entry
        ``law_entries[k - 1]`` (what :meth:`forward` returned for that entry): row b drafts levels
        ``1 .. depths[b]``. A drafter that knows how far its draft is worth following (a retrieval match
        that ends) stops there; the decision reads the drafter's side only, before the next level's draw,
        so verification stays exact. None (the default): every level."""
        return None

    def drafts_first_level(self, state: Any, row: int, pending: Sequence[int]) -> bool:
        """Whether row ``row``'s chain drafts at all this step, its context ending with ``pending`` (the
        tokens the drafter has not seen, the root last): a drafter that can forecast from the row's text and
        past steps alone that a draft would not pay answers False, and the row takes a plain step. True (the
        default): always."""
        return True

    def observe_chain(self, state: Any, accepted: Sequence[int], depths: Sequence[int]) -> None:
        """After a step whose chains :meth:`chain_depths` shaped: row b's chain was cut to ``depths[b]``
        levels and its first ``accepted[b]`` draft tokens were accepted (what a drafter may learn its depth
        rule from; called for every step, plain ones included, before the commit). No-op here."""
        return None

    #: width of the final hidden states :meth:`forward_hidden` returns; 0 = this drafter exposes none (the
    #: NDE selector, which reads the draft's hidden states, refuses such drafters)
    draft_hidden_size: int = 0

    def forward_hidden(self, state: Any, tokens: torch.Tensor, parents: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward` plus the final hidden states: ``(logits [B, Q, V], hidden [B, Q, draft_hidden_size])``."""
        raise NotImplementedError(f"{type(self).__name__} exposes no hidden states (draft_hidden_size = 0)")


class ModelDrafter(Drafter):
    """Any HF causal LM as a drafter (it must share the target's vocabulary)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.draft_hidden_size = int(model.get_output_embeddings().weight.shape[1])

    def begin(self, batch_size: int, device: torch.device) -> TreeKVCache:
        return TreeKVCache(self.model, batch_size, device)

    def forward(self, state: Any, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = state.forward(tokens, parents).logits
        return logits

    def forward_hidden(self, state: Any, tokens: torch.Tensor, parents: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        out = state.forward(tokens, parents, output_hidden_states=True)
        return out.logits, out.hidden_states[-1]

    def commit(self, state: Any, keep: torch.Tensor, counts: torch.Tensor, prefix_of_block: bool = False) -> None:
        state.commit(keep, counts, prefix_of_block)

    def num_block(self, state: Any) -> int:
        return int(state.num_block)

    def take_rows(self, state: Any, rows: list[int]) -> Any:
        state.take_rows(rows)
        return state

    def join_rows(self, state: Any, joining: Any) -> Any:
        state.append_rows(joining)
        return state

    def passes(self, state: Any) -> int:
        return int(state.passes)


def _decoder_layers(model: nn.Module) -> tuple[nn.Module, str]:
    """The module holding the decoder layer list and its attribute name (Llama-style or GPT-2-style)."""
    base = getattr(model, "model", None)
    if base is not None and hasattr(base, "layers"):
        return base, "layers"
    base = getattr(model, "transformer", None)
    if base is not None and hasattr(base, "h"):
        return base, "h"
    raise ValueError(
        f"early exit needs a Llama-style (model.layers) or GPT-2-style (transformer.h) model, got {type(model).__name__}"
    )


def early_exit_model(target: Any, num_layers: int) -> Any:
    """A truncated copy of ``target`` that shares its weights: the first ``num_layers`` decoder layers, the
    final norm and the LM head (no training). It is an ordinary HF model of the target's class, so HF
    assisted generation (``generate(assistant_model=...)``) can use the very same draft."""
    holder, attr = _decoder_layers(target)
    total = len(getattr(holder, attr))
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or not 1 <= num_layers < total:
        raise ValueError(f"num_layers must be an integer in [1, {total - 1}], got num_layers={num_layers!r}")
    with torch.device("meta"):
        draft = type(target)(truncated_config(target.config, num_layers))
    # share every module of the target except the truncated layer list
    draft_holder, _ = _decoder_layers(draft)
    for name, module in holder.named_children():
        if name == attr:
            setattr(draft_holder, attr, nn.ModuleList(list(getattr(holder, attr))[:num_layers]))
        else:
            setattr(draft_holder, name, module)
    for name, module in target.named_children():
        if module is not holder:
            setattr(draft, name, module)
    return finish_draft_model(draft, target, "early exit could not share {name} with the target")


def truncated_config(config: Any, num_layers: int) -> Any:
    """A copy of an HF model config with ``num_layers`` decoder layers (Llama- or GPT-2-style names)."""
    config = copy.deepcopy(config)
    for name in ("num_hidden_layers", "n_layer"):
        if hasattr(config, name):
            setattr(config, name, num_layers)
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = list(config.layer_types)[:num_layers]
    return config


def finish_draft_model(draft: Any, target: Any, missing: str) -> Any:
    """Check that a draft built on the meta device got every tensor (``missing``, formatted with the
    tensor's ``name``, is the error otherwise), give it the target's generation config, set eval mode."""
    for name, tensor in list(draft.named_parameters()) + list(draft.named_buffers()):
        if tensor.is_meta:
            raise ValueError(missing.format(name=name))
    draft.generation_config = copy.deepcopy(target.generation_config)
    draft.eval()
    return draft


class EarlyExitDrafter(ModelDrafter):
    """Self-speculative drafter: the target's first ``num_layers`` layers + final norm + LM head."""

    def __init__(self, target: Any, num_layers: int) -> None:
        super().__init__(early_exit_model(target, num_layers))
        self.num_layers = num_layers
