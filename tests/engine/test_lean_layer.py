"""The one-call native decoder layer (spec_fast/lean/layer.c) of the lean forward.

* it is what a lean model with native products runs (the Python layer is not called), and it computes the
  same function as the Python layer (torch operations around the same products) within float32 rounding,
  through prefill, tree blocks with the ancestor mask, gather commits and single steps, ragged batches
  included, for a Llama and a Qwen2-style model (q/k/v biases) and for GGUF-style block weights;
* a token's logits are bit for bit the same whatever shares its pass (a chain, a tree with siblings, a
  batch): the property that makes greedy speculative output equal plain decoding; the torch forward
  (torch's products, float32 SDPA attention) is the negative control (its logits do change with the pass);
* the cache grows past its first buffer inside a pass and the layer keeps working; a fully masked query row
  (padding) gives zeros, never NaN;
* a cache reuses its checked layer stack only while every buffer and weight is the same object.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from spec_fast.kv_cache import TreeKVCache
from spec_fast.lean import LeanLinear, LeanLlama, native
from spec_fast.lean import cache as lean_cache
from spec_fast.lean import row_ops, watch
from tests.engine.models import tiny_llama
from tests.engine.test_lean import _drive, tiny_qwen2

pytestmark = pytest.mark.usefixtures("native_kernels")


#: (hidden, heads, kv_heads): 8-wide heads in pairs (the scalar attention), the groups whose weighted sums
#: layer.c's AVX-512 attention takes in one sweep (64 wide in groups of 3 as SmolLM2, and 4), and per-head
#: vector paths (128 wide in groups of 4, 32 wide in pairs)
HEAD_SHAPES = {"llama": (32, 4, 2), "llama-64x3": (384, 6, 2), "llama-64x4": (256, 4, 1),
               "llama-128x4": (512, 4, 1), "llama-32x2": (128, 4, 2)}


@pytest.fixture(scope="module", params=[*HEAD_SHAPES, "qwen2"])
def hf_model(request: Any) -> Any:
    if request.param == "qwen2":
        return tiny_qwen2()
    hidden, heads, kv_heads = HEAD_SHAPES[request.param]
    return tiny_llama(hidden=hidden, heads=heads, kv_heads=kv_heads)


def _count_layer_calls(monkeypatch: Any, stacks: list[int] | None = None) -> list[int]:
    """Native layer calls (``run_layer`` goes through ``run_layers``); ``stacks`` collects each call's
    number of layers."""
    calls = [0]
    original = native.run_layers

    def counted(stack: Any, *args: Any, **kwargs: Any) -> Any:
        calls[0] += len(stack)
        if stacks is not None:
            stacks.append(len(stack))
        return original(stack, *args, **kwargs)

    monkeypatch.setattr(native, "run_layers", counted)
    return calls


def test_the_whole_stack_in_one_call_computes_bit_for_bit_what_layer_by_layer_computes(monkeypatch: Any) -> None:
    model = LeanLlama.from_hf(tiny_llama())
    stacks: list[int] = []
    _count_layer_calls(monkeypatch, stacks)
    prompt = torch.tensor([[3, 9, 4, 1, 7], [5, 2, 8, 6, 1]])
    block = torch.tensor([[7, 11], [8, 21]])
    tree = torch.tensor([[[[0.0] * 7, [0.0] * 5 + [float("-inf"), 0.0]]]]).expand(2, 1, 2, 7).contiguous()
    outputs = []
    for hidden in (False, True):  # hidden states need every layer's output: the layer-by-layer path
        cache = model.make_tree_cache(2)
        first = model(prompt, past_key_values=cache, output_hidden_states=hidden).logits
        second = model(block, attention_mask=tree, position_ids=torch.tensor([[5, 6], [5, 6]]), past_key_values=cache,
                       output_hidden_states=hidden).logits
        outputs.append((first, second, cache.layers[-1].key_length))
    layers = len(model.model.layers)
    assert stacks == [layers, layers] + [1] * (2 * layers)  # two whole stacks, then one layer per call
    for fast, slow in zip(outputs[0], outputs[1], strict=True):
        assert fast == slow if isinstance(fast, int) else torch.equal(fast, slow)


def test_the_final_hidden_state_alone_comes_from_the_whole_stack_in_one_call(monkeypatch: Any) -> None:
    """A draft that reads the target's features asks for the final hidden states only (TreeKVCache does, for
    a model that declares it): the layers still run in one call, and the states and logits are bit for bit
    those of the layer-by-layer path that returns every layer's output."""
    model = LeanLlama.from_hf(tiny_llama())
    assert model.returns_final_hidden_state
    stacks: list[int] = []
    _count_layer_calls(monkeypatch, stacks)
    tokens = torch.tensor([[3, 9, 4, 1, 7], [5, 2, 8, 6, 1]])
    parents = torch.arange(-1, 4).expand(2, 5)
    outs = []
    for final_only in (True, False):
        cache = TreeKVCache(model, 2, torch.device("cpu"))
        if final_only:
            outs.append(cache.forward(tokens, parents, output_hidden_states=True))
        else:  # HF's convention: the embeddings and every layer's output
            outs.append(model(tokens, output_hidden_states=True))
    layers = len(model.model.layers)
    assert stacks == [layers] + [1] * layers
    fast, slow = outs
    assert len(fast.hidden_states) == 1 and len(slow.hidden_states) == layers + 1
    assert torch.equal(fast.hidden_states[-1], slow.hidden_states[-1]) and torch.equal(fast.logits, slow.logits)


def test_the_native_layer_runs_and_computes_what_the_python_layer_computes(hf_model: Any, monkeypatch: Any) -> None:
    fused = LeanLlama.from_hf(hf_model)
    python = LeanLlama.from_hf(hf_model)
    python.use_native_layers(False)
    assert all(layer.native_weights() is not None for layer in fused.model.layers)
    assert all(layer.self_attn.attention_dtype == torch.float64 for layer in python.model.layers)
    calls = _count_layer_calls(monkeypatch)
    got = _drive(fused)
    assert calls[0] > 0 and calls[0] % len(fused.model.layers) == 0
    calls[0] = 0
    expected = _drive(python)
    assert calls[0] == 0
    for e, g in zip(expected, got, strict=True):
        assert g.dtype == torch.float32  # the native layer keeps its cache in float32
        # float32 rounding against the float64 Python layer grows with the width of the sums
        width = fused.model.embed_tokens.weight.shape[1] / 32
        torch.testing.assert_close(g, e.float(), rtol=1e-5 * width, atol=1e-5 * width)


def test_the_native_layer_reads_block_quantised_weights() -> None:
    torch.manual_seed(3)
    model = tiny_llama()
    fused = LeanLlama.from_hf(model)
    # every decoder product as Q8_0 blocks: a weight with 32-input groups, stored exactly
    for layer in fused.model.layers:
        for holder, name in ((layer.self_attn, "qkv_proj"), (layer.self_attn, "o_proj"), (layer.mlp, "gate_up_proj"),
                             (layer.mlp, "down_proj")):
            old: LeanLinear = getattr(holder, name)
            out_features, in_features = old.out_features, old.in_features
            values = torch.randint(-128, 128, (out_features, in_features), dtype=torch.int8)
            scales = (torch.rand(out_features, in_features // native.GROUP) * 0.01).half().float()
            setattr(holder, name, LeanLinear.from_blocks("q8_0", values, scales, None))
    assert all(layer.native_weights() is not None for layer in fused.model.layers)
    ids = torch.tensor([[1, 5, 7, 9, 3, 2]])
    with torch.no_grad():
        got = fused(ids).logits
        fused.use_native_layers(False)
        expected = fused(ids).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-4)


def _logits_of_chain_nodes(model: Any, blocks: list[tuple[list[int], list[int]]],
                           context: list[int] | None = None) -> list[torch.Tensor]:
    """Prefill a context, then run each ``(tokens, parents)`` block as one pass behind it (nothing committed)
    -> every block's logits ``[Q, V]``."""
    state = TreeKVCache(model, 1, torch.device("cpu"))
    context = context or [3, 9, 4, 1, 7, 2, 2, 6]
    out = []
    with torch.no_grad():
        state.forward(torch.tensor([context]), torch.arange(-1, len(context) - 1).unsqueeze(0))
        state.commit(torch.arange(len(context)).unsqueeze(0), torch.tensor([len(context)]))
        for tokens, parents in blocks:
            out.append(state.forward(torch.tensor([tokens]), torch.tensor([parents])).logits[0])
            state.commit(torch.zeros(1, 0, dtype=torch.long), torch.tensor([0]))
    return out


def _token_logits_depend_on_the_pass(model: Any, context: list[int] | None = None) -> bool:
    """Whether the chain 11 -> 12 -> 13 gets different logits as one pass, inside a wider tree (siblings 20,
    21 beside it), or in shorter passes (11 alone, 11 -> 12)."""
    chain, tree, first, second = _logits_of_chain_nodes(model, [
        ([11, 12, 13], [-1, 0, 1]),
        ([11, 20, 12, 21, 13], [-1, 0, 0, 2, 2]),
        ([11], [-1]), ([11, 12], [-1, 0]),
    ], context)
    shorter = torch.stack([first[0], second[1]])
    return not (torch.equal(chain, tree[[0, 2, 4]]) and torch.equal(chain[:2], shorter))


@pytest.mark.parametrize("shape", list(HEAD_SHAPES))
def test_a_token_gets_the_same_logits_whatever_shares_its_pass(shape: str) -> None:
    hidden, heads, kv_heads = HEAD_SHAPES[shape]
    model = LeanLlama.from_hf(tiny_llama(seed=7, hidden=hidden, heads=heads, kv_heads=kv_heads))
    assert not _token_logits_depend_on_the_pass(model)
    # negative control: torch's products and float32 SDPA attention round with the pass's shape
    with native.disabled():
        control = LeanLlama.from_hf(tiny_llama(seed=7))
    assert _token_logits_depend_on_the_pass(control)


@pytest.mark.parametrize("shape", ["llama-64x3", "llama-128x4", "llama-32x2"])
def test_past_16_slots_a_token_gets_the_same_logits_whatever_shares_its_pass(shape: str) -> None:
    """The AVX-512 attention scores 16 cache slots at a time (64- and 128-wide heads; 32-wide heads score slot
    by slot): behind a 45-token context the chain's nodes sit at slots 45-49, across a boundary of those
    blocks, and the wider tree moves them to other slots of other blocks. Their logits stay the same, and
    close to the float64 attention of the Python layer."""
    hidden, heads, kv_heads = HEAD_SHAPES[shape]
    hf = tiny_llama(seed=7, hidden=hidden, heads=heads, kv_heads=kv_heads)
    context = [int(t) for t in torch.randint(0, 64, (45,), generator=torch.Generator().manual_seed(3))]
    model = LeanLlama.from_hf(hf)
    assert not _token_logits_depend_on_the_pass(model, context)
    python = LeanLlama.from_hf(hf)
    python.use_native_layers(False)
    blocks = [([11, 20, 12, 21, 13], [-1, 0, 0, 2, 2])]
    got = _logits_of_chain_nodes(model, blocks, context)[0]
    expected = _logits_of_chain_nodes(python, blocks, context)[0]
    # float32 rounding grows with the width of the products' sums and with the number of attended slots (the
    # tests behind an 8-token context allow 1e-5 per 32 inputs)
    width = hidden / 32 * len(context) / 8
    torch.testing.assert_close(got, expected.float(), rtol=1e-5 * width, atol=1e-5 * width)


def test_the_cache_grows_inside_a_pass_and_padding_rows_stay_finite(monkeypatch: Any) -> None:
    monkeypatch.setattr(lean_cache, "INITIAL_SLOTS", 4)
    hf_model = tiny_llama()
    fused = LeanLlama.from_hf(hf_model)
    python = LeanLlama.from_hf(hf_model)
    python.use_native_layers(False)
    torch.testing.assert_close(_drive(fused)[-1], _drive(python)[-1].float(), rtol=1e-5, atol=1e-5)
    # a query row that attends nothing (an all-False boolean mask row) is zeros, not NaN
    ids = torch.tensor([[1, 2, 3]])
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool).tril()
    mask[0, 0, 1] = False
    with torch.no_grad():
        logits = fused(ids, attention_mask=mask).logits
    assert bool(torch.isfinite(logits).all())


def test_the_thread_count_changes_no_result() -> None:
    """The products' column blocks and the attention pairs are shared among torch's thread count (OpenMP);
    every output is still computed whole by one thread, so one and two threads agree bit for bit."""
    model = LeanLlama.from_hf(tiny_llama(seed=2, hidden=64))
    ids = torch.tensor([[1, 5, 7, 9, 3, 2, 8, 4, 6]])
    saved = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            with torch.no_grad():
                results.append(model(ids).logits)
    finally:
        torch.set_num_threads(saved)
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])


def test_a_cache_keeps_its_checked_layer_stack_while_its_buffers_and_weights_stay(monkeypatch: Any) -> None:
    """The checks of a layer stack run once per set of buffers and weights: passes that see the same ones
    reuse the cache's :class:`native.LayerStack`; a grown buffer or a replaced weight gets a new one (the old
    one's pointers reach the old buffers and weights), and the logits are those of a fresh stack every pass."""
    monkeypatch.setattr(lean_cache, "INITIAL_SLOTS", 8)
    model = LeanLlama.from_hf(tiny_llama(seed=3))
    seen: list[Any] = []
    original = native.run_layers
    monkeypatch.setattr(native, "run_layers",
                        lambda stack, *args, **kwargs: seen.append(stack) or original(stack, *args, **kwargs))

    def drive(cache: Any) -> list[torch.Tensor]:
        out = [model(torch.tensor([[3, 9, 4]]), past_key_values=cache).logits]
        out += [model(torch.tensor([[t + 1]]), past_key_values=cache).logits for t in range(4)]  # 7 of 8 slots
        return out

    with torch.no_grad():
        cache = model.make_tree_cache(1)
        kept = drive(cache)
        assert len(seen) == 5 and all(isinstance(s, native.LayerStack) and s is seen[0] for s in seen)
        model(torch.tensor([[5, 6]]), past_key_values=cache)  # 9 slots: every buffer grows
        grown = seen[-1]
        assert grown is not seen[0] and grown.layers[0][1] is cache.layers[0]._keys and grown.capacity >= 9
        layer = model.model.layers[1]
        layer.mlp.down_proj.packed = layer.mlp.down_proj.packed.clone()  # same values, another tensor
        model(torch.tensor([[7]]), past_key_values=cache)
        assert seen[-1] is not grown and seen[-1].layers[1][0] is layer.native_weights()
        assert seen[-1].layers[0][0] is grown.layers[0][0]  # the other layers keep their structs
        # the control: a fresh stack on every pass computes the same logits bit for bit
        monkeypatch.setattr(lean_cache.LeanKVCache, "layer_stack", lambda self, calls, *_: native.LayerStack(calls))
        fresh = drive(model.make_tree_cache(1))
    assert all(torch.equal(a, b) for a, b in zip(kept, fresh, strict=True))


def test_passes_reuse_the_kept_stack_unchecked_until_a_module_or_buffer_changes(monkeypatch: Any) -> None:
    """Between changes a pass takes the cache's kept stack without checking any layer (what cost ~0.4 ms a
    pass); each kind of change makes the next pass check every layer again. A twin model, changed the same
    way, checks every layer on every pass: the logits must be the same bit for bit."""
    monkeypatch.setattr(lean_cache, "INITIAL_SLOTS", 64)
    model = LeanLlama.from_hf(tiny_llama(seed=4))
    twin = copy.deepcopy(model)
    checks: list[int] = []
    original = type(model.model.layers[0]).native_call
    monkeypatch.setattr(type(model.model.layers[0]), "native_call",
                        lambda self, *args: checks.append(1) or original(self, *args))
    layers = len(model.model.layers)
    cache, twin_cache = model.make_tree_cache(1), twin.make_tree_cache(1)
    twin_cache.kept_stack = lambda *args: None  # type: ignore[method-assign]

    def step(token: int) -> int:
        checks.clear()
        logits = model(torch.tensor([[token]]), past_key_values=cache).logits
        checked = len(checks)
        assert torch.equal(logits, twin(torch.tensor([[token]]), past_key_values=twin_cache).logits)
        return checked

    def swap_storage(m: LeanLlama) -> None:
        # past the module's methods: the tensor object stays, its storage is new (said by hand)
        packed = m.model.layers[2].mlp.down_proj.packed
        packed.data = packed.data.clone() * 0.5
        watch.changed()

    def set_norm(m: LeanLlama) -> None:
        norm = m.model.layers[1].post_attention_layernorm
        norm.weight = torch.nn.Parameter(norm.weight * 1.5, requires_grad=False)

    def new_layer(m: LeanLlama) -> None:
        layer = copy.deepcopy(m.model.layers[0])
        layer.self_attn.o_proj.packed.mul_(2)  # float32 packed: other weights
        m.model.layers[0] = layer

    with torch.no_grad():
        model(torch.tensor([[3, 9, 4]]), past_key_values=cache)
        twin(torch.tensor([[3, 9, 4]]), past_key_values=twin_cache)
        assert step(5) == layers  # the twin's first pass allocated buffers: a change
        before = watch.changes()
        assert step(6) == 0 and step(7) == 0
        assert watch.changes() == before  # decoding passes change nothing watched
        for change in (set_norm, new_layer, swap_storage):
            change(model)
            change(twin)
            assert step(8) == layers, change.__name__
            assert step(9) == 0, change.__name__
            # a copy of the changed model has new tensors, so new native weights: a struct kept for storage the
            # model no longer has would read the old weights (and so would the twin's)
            probe = torch.tensor([[1, 2, 3]])
            assert torch.equal(model(probe).logits, copy.deepcopy(model)(probe).logits), change.__name__


def test_run_layers_refuses_a_stack_whose_buffers_are_too_short_for_the_pass() -> None:
    model = LeanLlama.from_hf(tiny_llama())
    weights = model.model.layers[0].native_weights()
    assert weights is not None
    heads, dim, hidden = int(weights.kv_heads), int(weights.head_dim), int(weights.hidden)
    stack = native.LayerStack([(weights, torch.zeros(1, heads, 4, dim), torch.zeros(1, heads, 4, dim))])
    x, table = torch.randn(1, 2, hidden), torch.ones(1, 2, dim)
    native.run_layers(stack, x.clone(), table, table, None, 2)  # 4 slots: fits
    with pytest.raises(ValueError, match=r"^keys must hold at least past \+ Q = 5 slots, got 4"):
        native.run_layers(stack, x.clone(), table, table, None, 3)
    with pytest.raises(ValueError, match="^x must have shape"):
        native.run_layers(stack, torch.randn(2, 2, hidden), table, table, None, 0)  # another batch size


def test_the_stack_returns_the_final_norm_that_rms_norm_computes_and_torch_agrees_with() -> None:
    """``run_layers(..., norm=)`` runs the model's final norm in the same native call: its output is bit for
    bit ``row_ops.rms_norm`` of the layers' result (the layer-by-layer path's final norm) and, within float32
    rounding, torch's RMSNorm; bad norm arguments are refused by name."""
    model = LeanLlama.from_hf(tiny_llama(hidden=384, heads=6, kv_heads=2))
    weights = [layer.native_weights() for layer in model.model.layers]
    assert all(w is not None for w in weights)
    hidden, heads, dim = int(weights[0].hidden), int(weights[0].kv_heads), int(weights[0].head_dim)
    stack = native.LayerStack([(w, torch.zeros(2, heads, 4, dim), torch.zeros(2, heads, 4, dim)) for w in weights])
    x, table = torch.randn(2, 3, hidden, generator=torch.Generator().manual_seed(5)), torch.ones(2, 3, dim)
    norm = model.model.norm
    with torch.no_grad():
        norm.weight.copy_(torch.rand(hidden, generator=torch.Generator().manual_seed(6)) + 0.5)
    plain = x.clone()
    assert native.run_layers(stack, plain, table, table, None, 0) is None
    fused = x.clone()
    normed = native.run_layers(stack, fused, table, table, None, 0, norm=(norm.weight, norm.eps))
    assert normed is not None and normed.shape == x.shape and torch.equal(fused, plain)
    assert torch.equal(normed, row_ops.rms_norm(plain, norm.weight, norm.eps))
    expected = torch.nn.functional.rms_norm(plain, (hidden,), norm.weight, norm.eps)
    torch.testing.assert_close(normed, expected, rtol=2e-6, atol=1e-6)
    assert not torch.equal(normed, plain)  # the norm was applied
    with pytest.raises(ValueError, match=r"^norm weight must have shape \[384\]"):
        native.run_layers(stack, x.clone(), table, table, None, 0, norm=(norm.weight[:-1], norm.eps))
    with pytest.raises(ValueError, match="^weight must be torch.float32"):
        row_ops.rms_norm(plain, norm.weight.double(), norm.eps)
    with pytest.raises(ValueError, match="^eps must be a float"):
        row_ops.rms_norm(plain, norm.weight, "1e-5")  # type: ignore[arg-type]
