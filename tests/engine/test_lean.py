"""The lean Llama-family forward (spec_fast.lean) against HF's, and the engine's guarantees with it.

* float32 logits and committed KV entries match HF's model within 1e-4 through the engine's own cache
  operations (prefill, single-token steps, tree blocks with the ancestor mask and depth positions, gather and
  truncation commits), for a Llama and a Qwen2-style model (q/k/v biases);
* greedy speculative output with a lean target (float32, int8, int4) is byte-identical to the same
  engine's plain decoding of that target, for every tree shape, with the early-exit draft built from the lean
  model itself; every sampling verifier runs on it and emits tokens in [0, V);
* the quantised kernels compute each row of a batch independently of the others (what makes the verification
  logits of a node equal to a plain step's), and their weights are within half a quantisation step.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from spec_fast.drafts.model import EarlyExitDrafter, early_exit_model
from spec_fast.engine import SamplingParams, SpeculativeDecoder
from spec_fast.kv_cache import TreeKVCache
from spec_fast.lean import KINDS, LeanLinear, LeanLlama, native
from spec_fast.models import LEAN_WEIGHTS, load_model
from spec_fast.strategies import SAMPLING_VERIFIERS, parse_strategy
from tests.engine.models import hf_greedy, tiny_gpt2, tiny_llama
from tests.native_kernels import require_native

PROMPTS = [[1, 5, 7, 9, 3], [4, 2], [8, 8, 8, 8, 8, 8, 8, 1], [60]]
NEW_TOKENS = 20
TOLERANCE = 1e-4


def tiny_qwen2(vocab_size: int = 64, layers: int = 3, seed: int = 0) -> Any:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, initializer_range=0.3, max_position_embeddings=128,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # HF initialises biases to zero: give them values so that they are tested
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0.0, 0.3)
    return model


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def hf_model(request: Any) -> Any:
    return tiny_llama() if request.param == "llama" else tiny_qwen2()


def _drive(model: Any) -> list[torch.Tensor]:
    """One scripted sequence of TreeKVCache operations (as the engine issues them) -> every pass's logits
    and, at the end, the committed keys and values of each row."""
    state = TreeKVCache(model, 2, torch.device("cpu"))
    out: list[torch.Tensor] = []
    with torch.no_grad():
        # ragged prefill (row 1 is padded), committed by gathering
        tokens = torch.tensor([[3, 9, 4, 1, 7], [5, 2, 8, 0, 0]])
        parents = torch.tensor([[-1, 0, 1, 2, 3], [-1, 0, 1, -1, -1]])
        out.append(state.forward(tokens, parents).logits[:, :3])
        state.commit(torch.arange(5).expand(2, 5), torch.tensor([5, 3]))
        # a tree block: root, two children of the root, a grandchild under the second child
        tokens = torch.tensor([[7, 11, 12, 13], [8, 21, 22, 23]])
        parents = torch.tensor([[-1, 0, 0, 2], [-1, 0, 0, 1]])
        out.append(state.forward(tokens, parents).logits)
        # a second forward in the same step (a draft's next level) below a block entry
        out.append(state.forward(torch.tensor([[30], [31]]), torch.tensor([[3], [3]])).logits)
        state.commit(torch.tensor([[0, 2, 3, 4], [0, 1, 3, 4]]), torch.tensor([4, 2]))
        # single-token steps, the second after a truncation commit (every row aligned)
        out.append(state.forward(torch.tensor([[40], [41]]), torch.tensor([[-1], [-1]])).logits)
        state.commit(torch.tensor([[0], [0]]), torch.tensor([1, 1]))
        out.append(state.forward(torch.tensor([[42], [43], ]), torch.tensor([[-1], [-1]])).logits)
        state.commit(torch.tensor([[0], [0]]), torch.tensor([1, 1]))
        for row in range(2):
            for keys, values in state.key_values(row):
                out.extend([keys, values])
    return out


def test_lean_float32_logits_and_cache_match_hf_through_the_engine_cache_operations(hf_model: Any) -> None:
    lean = LeanLlama.from_hf(hf_model)
    expected, got = _drive(hf_model), _drive(lean)
    assert len(expected) == len(got)
    for e, g in zip(expected, got):
        assert e.shape == g.shape
        # a lean model whose layers cannot run natively keeps its cache in float64 (spec_fast.lean.model)
        torch.testing.assert_close(g.float(), e, rtol=0, atol=TOLERANCE)


def test_lean_hidden_states_follow_hf_convention(hf_model: Any) -> None:
    lean = LeanLlama.from_hf(hf_model)
    ids = torch.tensor([[1, 5, 7, 9]])
    with torch.no_grad():
        expected = hf_model(ids, output_hidden_states=True, logits_to_keep=1)
        got = lean(ids, output_hidden_states=True, logits_to_keep=1)
    assert got.hidden_states is not None and len(got.hidden_states) == len(expected.hidden_states)
    for e, g in zip(expected.hidden_states, got.hidden_states):
        torch.testing.assert_close(g, e, rtol=0, atol=TOLERANCE)
    assert got.logits.shape == expected.logits.shape == (1, 1, hf_model.config.vocab_size)


def test_lean_float32_plain_decoding_equals_hf_generate(hf_model: Any) -> None:
    lean = LeanLlama.from_hf(hf_model)
    result = SpeculativeDecoder(lean, None, parse_strategy("ar")).generate(PROMPTS, max_new_tokens=NEW_TOKENS)
    assert result.tokens == [hf_greedy(hf_model, p, NEW_TOKENS) for p in PROMPTS]


STRATEGIES = ["chain:4", "iid:3x3", "delayed:2,1,2", "topk:3,2,6", "dynatree", "chain:3+adaptive"]


@pytest.mark.parametrize("weights", LEAN_WEIGHTS)
def test_greedy_speculative_output_equals_plain_decoding_of_the_same_lean_target(weights: str) -> None:
    lean = LeanLlama.from_hf(tiny_llama(), weights)
    plain = SpeculativeDecoder(lean, None, parse_strategy("ar")).generate(PROMPTS, max_new_tokens=NEW_TOKENS).tokens
    draft = EarlyExitDrafter(lean, 2)
    assert draft.model.model.layers[0] is lean.model.layers[0]  # the draft shares the target's weights
    assert isinstance(draft.model, LeanLlama) and len(draft.model.model.layers) == 2
    # float32 runs every shape; the other formats run a chain and a tree (the same code paths)
    for strategy in STRATEGIES if weights == "float32" else ["chain:4", "topk:3,2,6"]:
        result = SpeculativeDecoder(lean, draft, parse_strategy(strategy)).generate(PROMPTS, max_new_tokens=NEW_TOKENS)
        assert result.tokens == plain, (weights, strategy)


SHAPES = {"chain": "chain:3", "iid": "iid:2x2", "delayed": "delayed:2,1,2", "topk": "topk:2,2,4",
          "dynatree": "dynatree"}
# nde builds delayed trees (run here through "delayed") and needs a trained selector: tests/selector/
ENGINE_VERIFIERS = sorted({(shape, method) for shape, methods in SAMPLING_VERIFIERS.items() for method in methods
                           if shape != "nde" and (shape != "delayed" or method == "specinfer")})


@pytest.fixture(scope="module")
def lean_int8() -> Any:
    return LeanLlama.from_hf(tiny_llama(), "int8")


@pytest.mark.parametrize(("shape", "method"), ENGINE_VERIFIERS)
def test_every_sampling_verifier_runs_on_a_lean_int8_target(lean_int8: Any, shape: str, method: str) -> None:
    lean = lean_int8
    decoder = SpeculativeDecoder(lean, EarlyExitDrafter(lean, 2), parse_strategy(SHAPES[shape], method))
    result = decoder.generate(PROMPTS[:2], max_new_tokens=8, sampling=SamplingParams(temperature=0.8, seed=3))
    assert [len(t) for t in result.tokens] == [8, 8]
    assert all(0 <= t < 64 for row in result.tokens for t in row)
    again = decoder.generate(PROMPTS[:2], max_new_tokens=8, sampling=SamplingParams(temperature=0.8, seed=3))
    assert again.tokens == result.tokens  # reproducible under a fixed seed


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("shape", [(96, 64), (960, 576), (576, 1536)])  # tiny, SmolLM2's q/k/v and down
def test_quantised_kernels_compute_each_row_independently_of_the_batch(kind: str, shape: tuple[int, int]) -> None:
    torch.manual_seed(1)
    layer = LeanLinear.from_weight(torch.randn(*shape) * 0.1, torch.randn(shape[0]), kind)
    x = torch.randn(3, 16, shape[1])
    full = layer(x)
    for rows in (1, 2, 3, 5, 16):
        for i in range(rows):
            assert torch.equal(layer(x[1, i : i + 1])[0], full[1, i]), (kind, rows, i)
            assert torch.equal(layer(x[1, :rows])[i], full[1, i]), (kind, rows, i)


def test_without_the_native_kernel_widening_float32_weights_are_column_major() -> None:
    torch.manual_seed(4)
    with native.disabled():
        for shape, column in (((96, 64), True), ((64, 96), False), ((64, 64), False)):
            weight = torch.randn(*shape)
            layer = LeanLinear.from_weight(weight, None, "float32")
            assert layer.packed is None and layer.weight.shape == weight.shape and torch.equal(layer.weight, weight)
            assert layer.weight.t().is_contiguous() == column and layer.weight.is_contiguous() == (not column)
            x = torch.randn(2, 3, shape[1])
            torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, weight), rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("native_kernels")
@pytest.mark.parametrize("shape", [(1, 1), (5, 3), (64, 16), (96, 64), (130, 200), (576, 1536)])
def test_the_native_float32_product_is_the_product_and_each_row_ignores_the_others(shape: tuple[int, int]) -> None:
    torch.manual_seed(5)
    weight = torch.randn(*shape)
    layer = LeanLinear.from_weight(weight, torch.randn(shape[0]), "float32")
    assert layer.packed is not None and torch.equal(layer.weight, weight)  # .weight reads the packing back
    x = torch.randn(11, shape[1])
    full = layer(x)
    torch.testing.assert_close(full, x @ weight.t() + layer.bias, rtol=1e-5, atol=1e-4 * shape[1] ** 0.5)
    for start in range(11):
        for stop in range(start + 1, 12):  # every contiguous group of rows, so every position in a group of 4
            assert torch.equal(layer(x[start:stop]), full[start:stop]), (start, stop)
    strided = torch.randn(11, 2 * shape[1])[:, ::2]  # a non-contiguous input gives the same rows
    assert torch.equal(layer(strided), layer(strided.contiguous()))


def test_a_tied_float32_head_shares_the_embedding(hf_model: Any) -> None:
    for use_native in (True, False):
        if use_native:
            require_native()
        with contextlib.nullcontext() if use_native else native.disabled():
            lean = LeanLlama.from_hf(hf_model)
        embed = lean.model.embed_tokens.weight
        head = lean.lm_head
        if hf_model.config.tie_word_embeddings:
            assert head.weight is embed
        assert (head.packed is not None) == use_native
        if not use_native:  # torch's product: the head's weight is stored column-major
            assert head.weight.t().is_contiguous()
        assert torch.equal(embed, hf_model.model.embed_tokens.weight)
        assert torch.equal(head.dequantized(), hf_model.get_output_embeddings().weight)


@pytest.mark.parametrize("kind", KINDS)
def test_quantised_weights_are_within_half_a_step_of_the_original(kind: str) -> None:
    torch.manual_seed(2)
    weight = torch.randn(64, 96) * 0.1
    back = LeanLinear.from_weight(weight, None, kind).dequantized()
    if kind == "float32":
        assert torch.equal(back, weight)
        return
    # half a quantisation step, plus the bfloat16 rounding of the scales and of the kernel's output
    if kind == "bfloat16":
        bound = weight.abs() * 2.0**-8
    elif kind == "int8":
        step = weight.abs().amax(dim=1, keepdim=True) / 127
        bound = step / 2 + weight.abs().amax(dim=1, keepdim=True) * 2.0**-7
    else:
        grouped = weight.reshape(64, 3, 32)
        step = (grouped.amax(-1, keepdim=True) - grouped.amin(-1, keepdim=True)) / 15
        bound = (step / 2 + grouped.abs().amax(-1, keepdim=True) * 2.0**-7).expand(64, 3, 32).reshape(64, 96)
    assert bool((back - weight).abs().le(bound).all()), (back - weight).abs().max()
    # and the bound is tight enough to catch a wrong scale layout: scales of the wrong rows break it
    if kind == "int8":
        assert not bool((back.flip(0) - weight).abs().le(bound).all())


def test_load_model_rejects_lean_options_it_cannot_honour() -> None:
    with pytest.raises(ValueError, match="quantize must be one of"):
        load_model("unused", quantize="int2")
    with pytest.raises(ValueError, match="lean forward runs float32"):
        load_model("unused", dtype="bfloat16", lean=True)


def test_cli_rejects_quantize_with_a_non_float32_dtype_before_loading(capsys: Any) -> None:
    from spec_fast.cli import main

    assert main(["generate", "hi", "--quantize", "int8", "--dtype", "bfloat16", "--model", "/nonexistent"]) == 2
    assert "drop --dtype" in capsys.readouterr().err


def test_lean_refuses_other_architectures_and_early_exit_rejects_bad_depths() -> None:
    with pytest.raises(ValueError, match="model types"):
        LeanLlama.from_hf(tiny_gpt2())
    with pytest.raises(ValueError, match="weights must be one of"):
        LeanLlama.from_hf(tiny_llama(), "int3")
    lean = LeanLlama.from_hf(tiny_llama())
    with pytest.raises(ValueError, match="num_layers"):
        early_exit_model(lean, 4)


@pytest.mark.model
def test_smollm2_lean_int8_greedy_speculative_output_equals_its_plain_decoding(smollm2: Any) -> None:
    """On the real model near-tie argmaxes are common; float32 attention made this fail (spec_fast.lean.model)."""
    from spec_fast.drafts.heads import load_drafter
    from spec_fast.models import chat_prompt_ids

    model, tokenizer = smollm2
    lean = LeanLlama.from_hf(model, "int8")
    prompts = [chat_prompt_ids(tokenizer, "Write a Python function that reverses a string.")]
    plain = SpeculativeDecoder(lean, None, parse_strategy("ar")).generate(prompts, max_new_tokens=40).tokens
    decoder = SpeculativeDecoder(lean, load_drafter("retrieval", lean), parse_strategy("chain:2"))
    assert decoder.generate(prompts, max_new_tokens=40).tokens == plain


def int8_activations(x: torch.Tensor) -> torch.Tensor:
    """``x [M, K]`` as the block products see it: per row and group of 32 inputs, ``dx * round(x / dx)`` with
    ``dx = max |x| / 127`` (float32 throughout, rounding half to even)."""
    groups = x.reshape(x.shape[0], -1, native.GROUP)
    scale = groups.abs().amax(dim=-1, keepdim=True) / 127.0
    inverse = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    quantised = torch.round((groups * inverse).clamp(-127, 127))
    return (quantised * scale).reshape(x.shape)


@pytest.mark.usefixtures("native_kernels")
@pytest.mark.parametrize("kind", sorted(native.BLOCK_KINDS))
@pytest.mark.parametrize("shape", [(1, 32), (70, 64), (192, 576)])
def test_block_quantised_products_use_the_stored_weights_and_each_row_ignores_the_others(
        kind: str, shape: tuple[int, int]) -> None:
    torch.manual_seed(6)
    out_features, in_features = shape
    groups = in_features // native.GROUP
    if kind == "q4_1":
        values = torch.randint(0, 16, shape, dtype=torch.uint8)
        offsets: torch.Tensor | None = (torch.randn(out_features, groups) * 0.05).half().float()
    else:
        values = torch.randint(-128, 128, shape, dtype=torch.int8)
        offsets = None
    scales = (torch.rand(out_features, groups) * 0.02).half().float()  # GGUF stores float16 scales
    weight = values.float() * scales.repeat_interleave(native.GROUP, 1)
    if offsets is not None:
        weight = weight + offsets.repeat_interleave(native.GROUP, 1)
    layer = LeanLinear.from_blocks(kind, values, scales, offsets)
    assert layer.kind == kind and torch.equal(layer.dequantized(), weight)  # the stored weights, exactly
    x = torch.randn(11, in_features)
    full = layer(x)
    # the product of the stored weights with the activations as the kernel quantises them (int8 per group
    # of 32 inputs, llama.cpp's scheme): exact up to float32 rounding
    torch.testing.assert_close(full, int8_activations(x) @ weight.t(), rtol=1e-5, atol=1e-5 * in_features ** 0.5)
    torch.testing.assert_close(full, x @ weight.t(), rtol=0.05, atol=0.02 * in_features ** 0.5)
    for start in range(11):
        for stop in range(start + 1, 12):
            assert torch.equal(layer(x[start:stop]), full[start:stop]), (start, stop)
    with native.disabled():  # no kernel: the same weights, de-quantised, on torch's product
        fallback = LeanLinear.from_blocks(kind, values, scales, offsets)
    assert fallback.packed is None and torch.equal(fallback.weight, weight)


def test_selected_outputs_of_a_q8_0_layout_are_the_bytes_pack_blocks_writes_for_those_rows() -> None:
    generator = torch.Generator().manual_seed(5)
    for out_features in (130, 64, 3):
        values = torch.randint(-128, 128, (out_features, 96), dtype=torch.int8, generator=generator)
        scales = (torch.rand(out_features, 3, generator=generator) * 0.01).half().float()
        packed = native.pack_blocks("q8_0", values, scales, None)
        for rows in (torch.tensor([out_features - 1, 0]), torch.arange(out_features),
                     torch.randperm(out_features, generator=generator)[:70]):
            expected = native.pack_blocks("q8_0", values[rows], scales[rows], None)
            assert torch.equal(native.select_outputs(packed, rows), expected)
    with pytest.raises(ValueError, match="rows must lie in"):
        native.select_outputs(packed, torch.tensor([64]))  # past the padded block
    with pytest.raises(ValueError, match="Q8_0 layout"):
        native.select_outputs(native.pack_blocks("q4_1", torch.zeros(64, 32, dtype=torch.uint8),
                                                 torch.ones(64, 1), torch.zeros(64, 1)), torch.tensor([0]))


@pytest.mark.parametrize("kind", sorted(native.BLOCK_KINDS))
def test_block_layout_takes_the_bytes_of_gguf_blocks_and_refuses_scales_it_would_round(kind: str) -> None:
    # GGUF: Q4_1 is 20 bytes per 32 weights (float16 d and m, 16 bytes of nibbles), Q8_0 34 (float16 d, 32 bytes)
    gguf_bytes_per_group = {"q4_1": 20, "q8_0": 34}[kind]
    values = torch.zeros(64, 96, dtype=torch.uint8 if kind == "q4_1" else torch.int8)
    scales = torch.full((64, 3), 0.5)
    offsets = torch.full((64, 3), -0.25) if kind == "q4_1" else None
    packed = native.pack_blocks(kind, values, scales, offsets)
    assert packed.shape == (1, 3, native.group_bytes(kind)) == (1, 3, 64 * gguf_bytes_per_group)
    rounded = scales.clone()
    rounded[5, 1] = 0.1  # not a float16 value
    with pytest.raises(ValueError, match="scales must hold float16 values"):
        native.pack_blocks(kind, values, rounded, offsets)
    if offsets is not None:
        with pytest.raises(ValueError, match="offsets must hold float16 values"):
            native.pack_blocks(kind, values, scales, rounded)
