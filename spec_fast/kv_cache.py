"""A KV cache for tree decoding that keeps exactly the accepted path, by gathering entries in place.

:class:`TreeKVCache` owns an HF ``DynamicCache`` for one model and a batch of ``B`` rows. Between steps
row ``b``'s committed entries sit left-aligned in physical slots ``[0, lengths[b])``. During a step every
forward appends *block* entries (pending tokens, draft tree nodes) with a tree attention mask and
depth-based positions (:mod:`spec_fast.tree_attention`). :meth:`TreeKVCache.commit` then gathers, per row,
the entries of the accepted path behind the row's context and drops everything else, so the cache equals
the cache of a fresh prefill of the accepted text, without re-running any accepted token (docs/engine.md section 3).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from spec_fast._hf_compat import cache_keyword
from spec_fast.tree_attention import additive_mask, extend_ancestors, tree_attention_mask

__all__ = ["TreeKVCache", "decode_attention_backends"]

# Every backend of scaled_dot_product_attention except cuDNN's. cuDNN builds an execution plan for each new
# shape (about 1.2 ms of host time per call on an H200, bench/results/gpu/h200/step_profile.md), and a decoding
# step's key length is new at every step, so a 30-layer model paid ~36 ms a step for plans it used once.
_DECODE_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def decode_attention_backends(device: torch.device) -> AbstractContextManager[Any]:
    """The attention backends for an engine pass on ``device``: on CUDA every one but cuDNN's (see above);
    elsewhere a no-op context (the CPU has one attention backend to choose)."""
    if device.type != "cuda":
        return nullcontext()
    return sdpa_kernel(_DECODE_BACKENDS)


class TreeKVCache:
    """Cache + bookkeeping for one causal LM over a batch of ragged rows.

    Attributes:
        lengths: ``[B]`` long, committed entries per row.
        context_size: physical context slots (``max(lengths)`` after a commit).
        ancestors: ``[B, E, E]`` bool relation between this step's block entries.
        block_depths: ``[B, E]`` long block depth of each entry (position = ``lengths[b] + depth``).
    """

    def __init__(self, model: Any, batch_size: int, device: torch.device) -> None:
        self.model = model
        self.device = device
        # a model with its own cache layout (spec_fast.lean) provides it; the commit below only needs
        # ``cache.layers[i].keys/.values`` ``[B, H, S, D]``, and uses ``replace_tail`` where a layer has one
        make_cache = getattr(model, "make_tree_cache", None)
        if make_cache is not None:
            self.cache: Any = make_cache(batch_size)
        else:  # imported here: a lean target (the model cache's fast load) never needs transformers
            from transformers import DynamicCache

            self.cache = DynamicCache(config=model.config)
        self._cache_keyword = cache_keyword(model.forward)
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.context_size = 0
        self.ancestors = torch.zeros(batch_size, 0, 0, dtype=torch.bool, device=device)
        self.block_depths = torch.zeros(batch_size, 0, dtype=torch.long, device=device)
        self.passes = 0
        #: host-side: some row has fewer committed entries than ``context_size`` (padding slots)
        self.padded = False

    @property
    def batch_size(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def num_block(self) -> int:
        return int(self.block_depths.shape[1])

    def forward(
        self, tokens: torch.Tensor, parents: torch.Tensor, output_hidden_states: bool = False,
        logits_to_keep: int = 0, chain: bool = False,
    ) -> Any:
        """Run the model on ``Q`` new block entries per row and append their KV entries.

        Args:
            tokens: ``[B, Q]`` long token ids (padding entries may hold any id >= 0).
            parents: ``[B, Q]`` long block index of each entry's parent (``-1``: directly below the
                context; padding entries use ``-1`` too and are never attended by real entries).
            output_hidden_states: forwarded to the model; the engine reads the last entry of the output's
                ``hidden_states`` (the final normed states), and a model that declares
                ``returns_final_hidden_state`` (the lean forward) is asked for that entry alone.
            logits_to_keep: ``k > 0`` asks the model for the logits of the last ``k`` entries only (HF's
                ``logits_to_keep``; a prefill needs none of them, so it saves the LM head on the prompt).
            chain: the caller's word that ``parents[b, j] = j - 1`` in every row (nothing is read to check
                it): with no block entries yet and no padded rows, the ancestor relation and the depths are
                then built directly instead of by the closure of :func:`extend_ancestors` (a prompt's prefill
                took ``log2(Q)`` products of ``[Q, Q]`` matrices), and a model that attends causally when
                given no mask (``causal_without_mask``: the lean forward) gets none, and its ``forward_step``
                serves the pass where it has one (no ``logits_to_keep``, and hidden states only from a model
                that returns the final ones alone).

        Returns:
            the HF model output; ``.logits`` is ``[B, Q, V]`` (``[B, k, V]`` with ``logits_to_keep``); the
            lean forward's ``forward_step`` adds ``.first_max [B, Q]`` (each entry's argmax) or None.
        """
        num_query = int(tokens.shape[1])
        behind_context = self.ancestors.shape[1] == 0 and not self.padded
        # a single query right behind an unpadded context sees every slot: no mask needed, and HF's
        # unmasked attention path is the faster one (plain decoding steps); so does a chain there, causally,
        # for a model that takes no mask as causal attention
        plain = behind_context and (num_query == 1 or (chain and getattr(self.model, "causal_without_mask", False)))
        if chain and behind_context:
            batch = self.batch_size
            self.ancestors = torch.ones(num_query, num_query, dtype=torch.bool, device=self.device).tril().expand(
                batch, num_query, num_query).contiguous()
            depths = torch.arange(num_query, device=self.device).expand(batch, num_query)
        else:
            self.ancestors = extend_ancestors(self.ancestors, parents)
            # block depth = number of block ancestors (self excluded): the position offset below the context
            depths = self.ancestors[:, -num_query:, :].sum(dim=-1) - 1  # [B, Q]
        self.block_depths = torch.cat([self.block_depths, depths], dim=1)
        step = self._own_step(output_hidden_states)
        if plain and chain and step is not None and logits_to_keep == 0:
            # a chain behind the context (a greedy chain's verification): the model's causal pass, with the
            # argmax of every entry where it computes one with the logits (``first_max``)
            with decode_attention_backends(tokens.device):
                out = step(tokens.clamp(min=0), self.context_size, self.cache, output_hidden_states)
            self.passes += 1
            return out
        positions = self.lengths.unsqueeze(1) + depths
        mask = None if plain else additive_mask(  # (a plain step skips the walk over the parameters too)
            tree_attention_mask(self.lengths, self.context_size, self.ancestors, num_query),
            next(self.model.parameters()).dtype)
        return self._pass(tokens.clamp(min=0), positions, mask, output_hidden_states, logits_to_keep)

    def forward_committed(self, tokens: torch.Tensor, output_hidden_states: bool = False) -> Any:
        """A plain decoding step's pass and commit in one: ``tokens [B, 1]`` (ids >= 0), each row's one
        entry appended behind its context and kept. The cache, lengths and output equal those of
        :meth:`forward` of the entries below the context followed by :meth:`commit` of every row's entry;
        behind an unpadded context it skips their tree bookkeeping (ancestors, depths, the index rows of
        the commit: a dozen small tensor operations per step). Between steps only (no block entries).
        ``output_hidden_states`` as :meth:`forward` takes it."""
        self._check_between_steps("forward_committed")
        batch = self.batch_size
        if tuple(tokens.shape) != (batch, 1):
            raise ValueError(f"tokens must be [B, 1] = [{batch}, 1], got tokens.shape={tuple(tokens.shape)}")
        if self.padded:  # ragged rows: the new entries are moved behind each row's context
            out = self.forward(tokens, torch.full_like(tokens, -1), output_hidden_states=output_hidden_states)
            self.commit(torch.zeros_like(tokens), torch.ones(batch, dtype=torch.long, device=self.device))
            return out
        # every row's context fills the physical slots: its entry lands right behind it, already in place
        step = self._own_step(output_hidden_states)
        if step is not None:
            with decode_attention_backends(tokens.device):
                out = step(tokens, self.context_size, self.cache, output_hidden_states)
            self.passes += 1
        else:
            out = self._pass(tokens, self.lengths.unsqueeze(1), None, output_hidden_states, 0)
        self.lengths = self.lengths + 1
        self.context_size += 1
        return out

    def _own_step(self, output_hidden_states: bool) -> Any:
        """The model's own pass for new tokens attending causally behind an unpadded context (``forward_step``,
        spec_fast.lean), where it has one and can give the hidden states asked for (the final ones alone), else
        None."""
        step = getattr(self.model, "forward_step", None)
        if output_hidden_states and not getattr(self.model, "returns_final_hidden_state", False):
            return None
        return step

    def _pass(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None,
              output_hidden_states: bool, logits_to_keep: int) -> Any:
        """The model's call over ``tokens [B, Q]`` at ``positions [B, Q]`` with the additive ``mask`` (None:
        every slot), appending to the cache."""
        extra: dict[str, Any] = {self._cache_keyword: self.cache}
        if logits_to_keep > 0:
            extra["logits_to_keep"] = logits_to_keep
        if output_hidden_states and getattr(self.model, "returns_final_hidden_state", False):
            extra["final_hidden_state_only"] = True
        with decode_attention_backends(tokens.device):
            out = self.model(
                input_ids=tokens,
                position_ids=positions,
                attention_mask=mask,
                use_cache=True,
                output_hidden_states=output_hidden_states,
                **extra,
            )
        self.passes += 1
        return out

    def commit(self, keep: torch.Tensor, counts: torch.Tensor, prefix_of_block: bool = False) -> None:
        """Keep, per row, the block entries ``keep[b, :counts[b]]`` (in order) behind the context.

        Args:
            keep: ``[B, C]`` long block indices (entries beyond ``counts[b]`` are ignored).
            counts: ``[B]`` long number of kept entries per row.
            prefix_of_block: the caller guarantees that every row has ``lengths[b] == context_size``,
                the same count, and ``keep[b, :count] == arange(count)`` (e.g. an accepted chain prefix);
                then the cache is truncated instead of gathered.
        """
        batch = self.batch_size
        if prefix_of_block:
            self.keep_block_prefix(int(counts[0].item()) if batch > 0 else 0)
            return
        new_lengths = self.lengths + counts
        # one host read for the sizes the copy needs
        start, new_size, new_min, most = (
            torch.stack([self.lengths.min(), new_lengths.max(), new_lengths.min(), counts.max()]).tolist()
            if batch > 0 else (0, 0, 0, 0))
        self.padded = batch > 0 and new_min < new_size
        if 0 < most < new_size - start:  # ragged rows: moving the kept entries copies less
            self._move_kept(keep, counts, most, new_size)
        else:
            self._gather_tail(keep, counts, start, new_size)
        self._end_block(new_lengths, new_size)

    def keep_block_prefix(self, count: int) -> None:
        """:meth:`commit` of block entries ``[0, count)`` in every row, on the caller's word that every row has
        ``lengths[b] == context_size`` (an accepted chain prefix behind an unpadded context): the kept entries
        are already in place, so the cache is only truncated (a view, no copy)."""
        new_size = self.context_size + count
        if hasattr(self.cache, "truncate"):  # preallocated buffers: only the lengths move
            self.cache.truncate(new_size)
        else:
            layers_view: list[Any] = list(self.cache.layers)
            for layer in layers_view:
                if layer.keys is not None and layer.keys.numel() > 0:
                    layer.keys = layer.keys[:, :, :new_size]
                    layer.values = layer.values[:, :, :new_size]
        self._end_block(self.lengths + count, new_size)

    def _end_block(self, new_lengths: torch.Tensor, new_size: int) -> None:
        """After a commit's copy: the rows' new committed lengths and physical size, and no block entries."""
        batch = self.batch_size
        self.lengths = new_lengths
        self.context_size = new_size
        self.ancestors = torch.zeros(batch, 0, 0, dtype=torch.bool, device=self.device)
        self.block_depths = torch.zeros(batch, 0, dtype=torch.long, device=self.device)

    def _gather_tail(self, keep: torch.Tensor, counts: torch.Tensor, start: int, new_size: int) -> None:
        """The commit as one gather of every slot from ``start`` (the shortest row's length) to ``new_size``:
        a row's context slots copy themselves, its kept block entries move behind it, the rest is padding
        (slot 0's entry). Copies ``new_size - start`` slots per row and layer."""
        batch = self.batch_size
        width = new_size - start
        if width > 0:
            # target slot j (>= start) of row b takes physical slot:
            #   j                                 if j < lengths[b]       (context, unchanged)
            #   context_size + keep[b, j-lengths[b]] if j < new_lengths[b] (accepted block entry)
            #   0                                 otherwise              (padding)
            slots = torch.arange(start, new_size, device=self.device).unsqueeze(0).expand(batch, width)
            offset = slots - self.lengths.unsqueeze(1)
            in_block = (offset >= 0) & (offset < counts.unsqueeze(1))
            if keep.shape[1] > 0:
                block_src = torch.gather(keep, 1, offset.clamp(0, keep.shape[1] - 1))
            else:
                block_src = torch.zeros_like(offset)
            source = torch.where(offset < 0, slots, self.context_size + block_src)
            source = torch.where(in_block | (offset < 0), source, torch.zeros_like(source))
        layers: list[Any] = list(self.cache.layers)
        for layer in layers:
            keys, values = layer.keys, layer.values
            if keys is None or keys.numel() == 0:
                continue
            if width > 0:
                index = source.view(batch, 1, width, 1).expand(batch, keys.shape[1], width, keys.shape[3])
                tail_k = torch.gather(keys, 2, index)
                tail_v = torch.gather(values, 2, index)
                if hasattr(layer, "replace_tail"):  # preallocated buffers: write the tail in place
                    layer.replace_tail(start, tail_k, tail_v)
                    continue
                layer.keys = torch.cat([keys[:, :, :start], tail_k], dim=2)
                layer.values = torch.cat([values[:, :, :start], tail_v], dim=2)
            else:
                layer.keys = keys[:, :, :new_size]
                layer.values = values[:, :, :new_size]

    def _move_kept(self, keep: torch.Tensor, counts: torch.Tensor, most: int, new_size: int) -> None:
        """The commit of ragged rows: copy only the ``most`` (at most) kept block entries of each row to the
        slots right behind its context, ``[lengths[b], lengths[b] + counts[b])``, then cut the cache at
        ``new_size``. Every slot below ``lengths[b]`` is left as it is, so a plain step of rows whose contexts
        differ by hundreds of tokens copies one entry per row, not the whole ragged tail. Slots past a row's
        new length keep stale (finite) entries that its attention mask never lets it read."""
        batch = self.batch_size
        index = torch.arange(most, device=self.device).unsqueeze(0).expand(batch, most)
        # entries past counts[b] repeat the row's last kept move (or copy slot 0 onto itself when it keeps
        # none), so every write of the scatter below is one the row makes anyway
        last = (counts - 1).clamp(min=0).unsqueeze(1)
        index = torch.minimum(index, last)
        source = self.context_size + torch.gather(keep, 1, index.clamp(max=max(keep.shape[1] - 1, 0)))
        target = self.lengths.unsqueeze(1) + index
        none = (counts == 0).unsqueeze(1)
        source = torch.where(none, torch.zeros_like(source), source)
        target = torch.where(none, torch.zeros_like(target), target)
        # the lean cache moves every layer's entries in one native call (the repeated tail moves above are
        # skipped there: it moves counts[b] entries per row)
        mover = getattr(self.cache, "move_entries", None)
        if mover is not None and mover(source, target, counts, new_size):
            return
        for layer in list(self.cache.layers):
            keys, values = layer.keys, layer.values
            if keys is None or keys.numel() == 0:
                continue
            shape = (batch, keys.shape[1], most, keys.shape[3])
            src = source.view(batch, 1, most, 1).expand(shape)
            dst = target.view(batch, 1, most, 1).expand(shape)
            # read every kept entry before writing any: a row's targets may overlap its own sources
            moved_k, moved_v = torch.gather(keys, 2, src), torch.gather(values, 2, src)
            keys.scatter_(2, dst, moved_k)
            values.scatter_(2, dst, moved_v)
            layer.keys = keys[:, :, :new_size]
            layer.values = values[:, :, :new_size]

    # ------------------------------------------------------------------ rows (between steps only)
    def take_rows(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in that order): a batch whose finished requests leave. Between steps only
        (no block entries); the physical context shrinks to the longest kept row."""
        self._check_between_steps("take_rows")
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        self.lengths = self.lengths.index_select(0, index)
        new_size = int(self.lengths.max().item()) if rows else 0
        in_place = getattr(self.cache, "take_rows", None)  # the lean cache moves rows inside its buffers
        if in_place is not None:
            in_place(rows, new_size)
        else:
            for layer in list(self.cache.layers):
                if layer.keys is None or layer.keys.numel() == 0:
                    continue
                layer.keys = layer.keys.index_select(0, index)[:, :, :new_size].contiguous()
                layer.values = layer.values.index_select(0, index)[:, :, :new_size].contiguous()
        self._resize(new_size)

    def append_rows(self, other: TreeKVCache) -> None:
        """Append ``other``'s rows behind this cache's (a prefilled request joining a running batch). Between
        steps only; each row keeps its committed entries left-aligned, the shorter ones padded."""
        self._check_between_steps("append_rows")
        other._check_between_steps("append_rows")
        new_size = max(self.context_size, other.context_size)
        in_place = getattr(self.cache, "append_rows", None)  # the lean cache copies the rows into spare ones
        if in_place is not None and type(other.cache) is type(self.cache):
            in_place(other.cache, self.batch_size, other.batch_size, new_size)
        else:
            self._append_layers(other, new_size)
        self.lengths = torch.cat([self.lengths, other.lengths.to(self.device)])
        self.passes += other.passes
        self._resize(new_size)

    def _append_layers(self, other: TreeKVCache, new_size: int) -> None:
        """append_rows's entries for any cache layout: every layer's rows concatenated, each zero-padded to
        ``new_size`` slots."""
        mine: list[Any] = list(self.cache.layers)
        theirs: list[Any] = list(other.cache.layers)
        if len(mine) != len(theirs):
            raise ValueError(f"append_rows needs caches of the same model: {len(mine)} vs {len(theirs)} layers")
        own_rows, joining_rows = self.batch_size, other.batch_size
        for layer, joining in zip(mine, theirs):
            like = layer.keys if layer.keys is not None and layer.keys.numel() > 0 else joining.keys
            if like is None or like.numel() == 0:
                continue
            parts_k = [_padded(layer.keys, own_rows, like, new_size), _padded(joining.keys, joining_rows, like, new_size)]
            parts_v = [_padded(layer.values, own_rows, like, new_size),
                       _padded(joining.values, joining_rows, like, new_size)]
            layer.keys = torch.cat(parts_k, dim=0)
            layer.values = torch.cat(parts_v, dim=0)

    def reserve_rows(self, rows: int) -> None:
        """Room for ``rows`` rows where the cache's layout has it (the lean cache), so that rows appended
        later are copied into place rather than the whole cache into a new allocation; otherwise nothing."""
        reserve = getattr(self.cache, "reserve_rows", None)
        if reserve is not None:
            reserve(rows)

    def load_context(self, rows: Sequence[Sequence[tuple[torch.Tensor, torch.Tensor]] | None]) -> None:
        """Fill an empty cache with committed entries computed earlier (a reused prompt prefix): row b gets
        ``rows[b]`` (per layer ``(keys, values)`` each ``[H, n_b, D]``; None: no entries), left-aligned and
        padded to the longest row, as a commit would leave them."""
        if self.context_size > 0 or self.num_block > 0:
            raise ValueError("load_context needs an empty cache")
        if len(rows) != self.batch_size:
            raise ValueError(f"rows must hold {self.batch_size} rows, got {len(rows)}")
        given = [r for r in rows if r is not None and len(r) > 0]
        if not given:
            return
        layers: list[Any] = list(self.cache.layers)
        if any(len(r) != len(layers) for r in given):
            raise ValueError(f"every row must hold {len(layers)} layers of entries")
        counts = [0 if r is None or len(r) == 0 else int(r[0][0].shape[1]) for r in rows]
        size = max(counts)
        for i, layer in enumerate(layers):
            like = given[0][i][0]
            keys = like.new_zeros(self.batch_size, like.shape[0], size, like.shape[2])
            values = torch.zeros_like(keys)
            for b, row in enumerate(rows):
                if counts[b] > 0 and row is not None:
                    keys[b, :, : counts[b]] = row[i][0]
                    values[b, :, : counts[b]] = row[i][1]
            layer.keys, layer.values = keys, values
        self.lengths = torch.tensor(counts, dtype=torch.long, device=self.device)
        self._resize(size)

    def _check_between_steps(self, operation: str) -> None:
        if self.num_block > 0:
            raise ValueError(f"{operation} needs a cache between steps, this one holds {self.num_block} block entries")

    def _resize(self, context_size: int) -> None:
        batch = self.batch_size
        self.context_size = context_size
        self.padded = batch > 0 and int(self.lengths.min().item()) < context_size
        self.ancestors = torch.zeros(batch, 0, 0, dtype=torch.bool, device=self.device)
        self.block_depths = torch.zeros(batch, 0, dtype=torch.long, device=self.device)

    def key_values(self, row: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The committed ``(keys, values)`` of one row per layer, each ``[H, lengths[row], D]`` (tests)."""
        length = int(self.lengths[row].item())
        layers: list[Any] = list(self.cache.layers)
        return [
            (layer.keys[row, :, :length], layer.values[row, :, :length]) for layer in layers
        ]


def _padded(values: torch.Tensor | None, rows: int, like: torch.Tensor, size: int) -> torch.Tensor:
    """``values [rows, H, S, D]`` (None: no entries yet) zero-padded along S to ``[rows, H, size, D]``."""
    if values is None or values.numel() == 0:
        return like.new_zeros(rows, like.shape[1], size, like.shape[3])
    if values.shape[2] == size:
        return values
    pad = values.new_zeros(rows, values.shape[1], size - values.shape[2], values.shape[3])
    return torch.cat([values, pad], dim=2)
