"""The lean cache's rows change in place: departures and joins of a running batch.

A layer's buffers are the first ``B`` rows of an allocation of ``R >= B`` rows
(spec_fast/lean/cache.py). These tests check that a departure keeps exactly the kept rows' entries and
copies only the rows whose position changes, that a joining request lands in a spare row without a new
allocation, with the slots past each row's old length zeroed (an attention that does not skip masked slots
multiplies them), and that the engine keeps one allocation through a run of joins and departures.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spec_fast.decoding import SamplingParams
from spec_fast.engine import SpeculativeDecoder
from spec_fast.engine.batch_engine import BatchEngine, hole_filling_order
from spec_fast.lean import LeanLlama
from spec_fast.lean import cache as lean_cache
from spec_fast.lean.cache import LeanKVCache, LeanLayerCache
from spec_fast.kv_cache import TreeKVCache
from spec_fast.strategies import parse_strategy
from tests.engine.models import tiny_llama

HEADS, DIM = 2, 4


def filled(rows: int, slots: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, HEADS, slots, DIM, generator=torch.Generator().manual_seed(seed))


def layer_with(keys: torch.Tensor, values: torch.Tensor) -> LeanLayerCache:
    layer = LeanLayerCache()
    layer.append(keys, values)
    return layer


@pytest.fixture
def nan_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    """New allocations full of NaN: a slot read or kept without being written shows."""
    monkeypatch.setattr(lean_cache, "uninitialised", lambda like, *shape: torch.full(
        shape, float("nan"), dtype=like.dtype, device=like.device))


@pytest.mark.parametrize("rows", [[0, 2, 3], [0, 3, 2], [3, 1, 2], [2, 0, 1], [1, 0], [3], [], [0, 1, 2, 3]],
                         ids=str)
def test_take_rows_keeps_the_kept_rows_entries_in_place(rows: list[int], nan_buffers: None) -> None:
    keys, values = filled(4, 6, 1), filled(4, 6, 2)
    layer = layer_with(keys, values)
    allocation = layer._key_rows
    layer.take_rows(rows, 5)
    assert layer._key_rows is allocation  # no new allocation
    assert layer.keys is not None and layer.values is not None
    assert layer.keys.shape == (len(rows), HEADS, 5, DIM)
    index = torch.tensor(rows, dtype=torch.long)
    assert torch.equal(layer.keys, keys.index_select(0, index)[:, :, :5])
    assert torch.equal(layer.values, values.index_select(0, index)[:, :, :5])


def test_a_hole_filled_by_the_last_row_copies_one_row(monkeypatch: pytest.MonkeyPatch) -> None:
    layer = layer_with(filled(4, 6, 1), filled(4, 6, 2))
    in_order = layer_with(filled(4, 6, 1), filled(4, 6, 2))
    writes: list[int] = []
    original = torch.Tensor.__setitem__

    def counting(tensor: torch.Tensor, index: object, value: object) -> None:
        writes.append(1)
        original(tensor, index, value)

    monkeypatch.setattr(torch.Tensor, "__setitem__", counting)
    layer.take_rows(hole_filling_order([0, 2, 3]), 6)  # row 1 left: row 3 moves into its place
    assert len(writes) == 2  # keys and values of one row
    # control: the same departure kept in order moves two rows
    writes.clear()
    in_order.take_rows([0, 2, 3], 6)
    assert len(writes) == 4


def test_a_joining_row_lands_in_a_spare_row_with_its_padding_zeroed(nan_buffers: None) -> None:
    own_keys, own_values = filled(2, 5, 3), filled(2, 5, 4)
    layer = layer_with(own_keys, own_values)
    layer.reserve_rows(4)
    allocation = layer._key_rows
    assert allocation is not None and allocation.shape[0] == 4
    joining = layer_with(filled(1, 3, 5), filled(1, 3, 6))
    layer.append_rows(joining, 2, 1, 5)
    assert layer._key_rows is allocation
    assert layer.keys is not None and layer.values is not None and joining.keys is not None
    assert torch.equal(layer.keys[:2], own_keys) and torch.equal(layer.values[:2], own_values)
    assert torch.equal(layer.keys[2, :, :3], joining.keys[0])
    assert torch.equal(layer.keys[2, :, 3:], torch.zeros(HEADS, 2, DIM))
    assert torch.equal(layer.values[2, :, 3:], torch.zeros(HEADS, 2, DIM))
    # a longer joining row: the own rows' new slots are zeros, and the allocation grows its slots
    longer = layer_with(filled(1, 300, 7), filled(1, 300, 8))
    layer.append_rows(longer, 3, 1, 300)
    assert layer.keys is not None and longer.keys is not None
    assert layer.capacity >= 300 and layer.row_capacity >= 4
    assert torch.equal(layer.keys[:2, :, :5], own_keys)
    assert torch.equal(layer.keys[:3, :, 5:300], torch.zeros(3, HEADS, 295, DIM))
    assert torch.equal(layer.keys[3], longer.keys[0])
    assert not bool(layer.keys.isnan().any()) and not bool(layer.values.isnan().any())


def test_without_room_a_join_allocates_twice_the_rows(nan_buffers: None) -> None:
    layer = layer_with(filled(2, 4, 1), filled(2, 4, 2))
    layer.append_rows(layer_with(filled(1, 4, 3), filled(1, 4, 4)), 2, 1, 4)
    assert layer.row_capacity == 4
    allocation = layer._key_rows
    layer.append_rows(layer_with(filled(1, 4, 5), filled(1, 4, 6)), 3, 1, 4)
    assert layer._key_rows is allocation  # the fourth row fits


@given(st.sets(st.integers(0, 11)))
@settings(max_examples=200, deadline=None)
def test_hole_filling_order_keeps_rows_in_place_and_fills_the_holes(kept: set[int]) -> None:
    rows = sorted(kept)
    order = hole_filling_order(rows)
    assert sorted(order) == rows
    for b in rows:
        if b < len(rows):
            assert order[b] == b
    moved = [b for b in order if b >= len(rows)]
    assert moved == sorted(moved)


def test_tree_cache_rows_through_the_lean_cache_equal_the_generic_cache() -> None:
    # the same appends, departures and joins on a TreeKVCache over the lean cache and over plain tensors
    # (the generic path: index_select, zero padding) give the same entries row by row
    target = tiny_llama(vocab_size=32, seed=3)
    lean = LeanLlama.from_hf(target, "float32")

    def prefilled(model: object, batch: int, length: int, seed: int) -> TreeKVCache:
        cache = TreeKVCache(model, batch, torch.device("cpu"))
        tokens = torch.randint(0, 32, (batch, length), generator=torch.Generator().manual_seed(seed))
        cache.forward(tokens, torch.arange(-1, length - 1).expand(batch, length))
        cache.commit(torch.arange(length).expand(batch, length), torch.full((batch,), length), True)
        return cache

    lean_cache_, hf_cache = prefilled(lean, 3, 6, 1), prefilled(target, 3, 6, 1)
    for cache in (lean_cache_, hf_cache):
        cache.take_rows([0, 2])
        cache.append_rows(prefilled(lean if cache is lean_cache_ else target, 1, 9, 2))
        cache.take_rows(hole_filling_order([1, 2]))
    assert torch.equal(lean_cache_.lengths, hf_cache.lengths)
    for row in range(lean_cache_.batch_size):
        for (lk, lv), (hk, hv) in zip(lean_cache_.key_values(row), hf_cache.key_values(row)):
            torch.testing.assert_close(lk, hk, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(lv, hv, rtol=1e-5, atol=1e-5)


def test_the_engine_keeps_one_allocation_through_joins_and_departures() -> None:
    target = tiny_llama(vocab_size=48, seed=7)
    lean = LeanLlama.from_hf(target, "float32")
    decoder = SpeculativeDecoder(lean, None, parse_strategy("ar"))
    engine = BatchEngine(decoder, max_batch_size=4)
    rng = random.Random(3)
    allocations = set()
    for step in range(40):
        if step % 3 == 0 and engine.num_waiting == 0:
            engine.add_request([rng.randrange(48) for _ in range(rng.randint(2, 8))], SamplingParams(),
                               rng.randint(2, 9))
        engine.step()
        if engine.state is not None:
            layer = engine.state.target_cache.cache.layers[0]
            assert isinstance(engine.state.target_cache.cache, LeanKVCache)
            allocations.add(id(layer._key_rows))
            assert layer.row_capacity == 4
    assert len(allocations) <= 3  # a new one only when the state empties or its slots grow
