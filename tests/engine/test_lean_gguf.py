"""spec_fast.lean.gguf: a LeanLlama read straight from the SmolLM2 GGUF file (no HF model in between) has the
same configuration and bitwise the same weights as the one copied from transformers' de-quantised HF model,
so its logits are equal bit for bit; the rotary un-permutation is checked on its own, with a negative control
(skipping it changes the logits)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
import torch

from spec_fast.lean import LeanLlama
from spec_fast.lean.gguf import lean_from_gguf, read_gguf_llama, unpermute_rotary_rows
from spec_fast.models import DEFAULT_GGUF, default_model_dir
from tests.native_kernels import require_native


def test_unpermute_restores_half_split_rows_per_head() -> None:
    # llama.cpp's converter maps a head's rows (half h, pair p) to (pair p, half h); two heads of dim 6
    heads, half = 2, 3
    hf_rows = np.arange(heads * 2 * half)[:, None] * np.ones((1, 4))
    permuted = hf_rows.reshape(heads, 2, half, 4).swapaxes(1, 2).reshape(hf_rows.shape)
    assert not np.array_equal(permuted, hf_rows)
    np.testing.assert_array_equal(unpermute_rotary_rows(permuted, heads), hf_rows)


def test_missing_file_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="path="):
        lean_from_gguf("/nonexistent/model.gguf")


@pytest.fixture(scope="module")
def gguf_tensors() -> Any:
    """The file read once (de-quantising every tensor takes a while on this machine)."""
    return read_gguf_llama(os.path.join(default_model_dir(), DEFAULT_GGUF))


def _logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(input_ids=ids, position_ids=torch.arange(ids.shape[1]).unsqueeze(0),
                    past_key_values=model.make_tree_cache(1))
    logits: torch.Tensor = out.logits
    return logits


@pytest.mark.model
def test_gguf_lean_model_equals_the_one_built_from_the_hf_model(smollm2: Any, gguf_tensors: Any) -> None:
    """Every float32 weight is bitwise equal, so every quantised format (a function of them) is too."""
    model, _ = smollm2
    direct = LeanLlama.from_hf(gguf_tensors)  # exactly lean_from_gguf(path)
    via_hf = LeanLlama.from_hf(model)
    mine, theirs = dict(direct.named_parameters()), dict(via_hf.named_parameters())
    assert mine.keys() == theirs.keys()
    assert [name for name in mine if not torch.equal(mine[name], theirs[name])] == []
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings"):
        assert getattr(direct.config, key) == getattr(model.config, key), key
    torch.testing.assert_close(direct.model.rotary.cos, via_hf.model.rotary.cos, rtol=0, atol=0)
    ids = torch.tensor([[1, 504, 3458, 314, 253, 1751, 28, 7, 2451, 30]])
    assert torch.equal(_logits(direct, ids), _logits(via_hf, ids))


@pytest.mark.model
def test_skipping_the_unpermutation_changes_the_logits(smollm2: Any, gguf_tensors: Any) -> None:
    """Negative control: the equality above depends on undoing the converter's row permutation (here the
    query rows of every layer are put back in the file's order)."""
    model, _ = smollm2
    from spec_fast.lean import native

    heads = int(gguf_tensors.config.num_attention_heads)
    with native.disabled():  # torch's products: the weights are Parameters that can be edited in place
        broken = LeanLlama.from_hf(gguf_tensors)
    for layer, source in zip(broken.model.layers, gguf_tensors.model.layers):
        q = source.self_attn.q_proj.weight
        as_in_file = q.reshape(heads, 2, q.shape[0] // heads // 2, -1).transpose(1, 2).reshape(q.shape)
        layer.self_attn.qkv_proj.weight.data[: q.shape[0]] = as_in_file
    ids = torch.tensor([[1, 504, 3458, 314, 253, 1751, 28, 7, 2451, 30]])
    assert not torch.allclose(_logits(broken, ids), _logits(LeanLlama.from_hf(model), ids), atol=1e-3)


@pytest.mark.model
def test_the_blocks_as_read_are_the_files_weights(gguf_tensors: Any) -> None:
    """read_blocks decodes Q4_1 and Q8_0 blocks into exactly gguf.dequantize's float32 weights."""
    from gguf import GGUFReader, dequantize

    from spec_fast.lean.gguf import read_blocks
    from spec_fast.lean.quant import dequantize_blocks

    reader = GGUFReader(os.path.join(default_model_dir(), DEFAULT_GGUF))
    seen = set()
    for tensor in reader.tensors:
        kind = tensor.tensor_type.name
        if kind in ("Q4_1", "Q8_0") and kind not in seen:
            seen.add(kind)
            blocks = read_blocks(np.asarray(tensor.data), kind)
            expected = torch.from_numpy(np.copy(dequantize(tensor.data, tensor.tensor_type))).float()
            assert torch.equal(dequantize_blocks(blocks), expected), tensor.name
    assert seen == {"Q4_1", "Q8_0"}


@pytest.mark.model
def test_the_gguf_blocks_model_is_the_float32_model_up_to_activation_rounding(gguf_tensors: Any) -> None:
    """weights='gguf' multiplies the file's blocks as stored (the same weights as the de-quantised float32
    model) with activations rounded to int8 per group of 32, llama.cpp's scheme (spec_fast/lean/blocks.c): its
    next-token distributions stay within a small KL divergence of the float32 model's (measured here: mean
    0.009, max 0.02 nats; bench/results/gguf_vs_llama.md, on 344 positions of chat text: about 0.004 from
    the float32 model and 0.005 from llama.cpp's, whose own divergence from the float32 model is 0.0035) and
    its speculative output equals its own plain decoding (the products and the native layer are
    batch-invariant)."""
    from spec_fast.engine import SpeculativeDecoder
    from spec_fast.drafts.retrieval import RetrievalDrafter
    from spec_fast.lean import native
    from spec_fast.strategies import parse_strategy

    require_native()
    blocks = lean_from_gguf(os.path.join(default_model_dir(), DEFAULT_GGUF), "gguf")
    dense = LeanLlama.from_hf(gguf_tensors)
    assert blocks.model.layers[0].mlp.gate_up_proj.kind == "q4_1" and blocks.lm_head.kind == "q8_0"
    ids = torch.tensor([[1, 504, 3458, 314, 253, 1751, 28, 7, 2451, 30]])
    ours, reference = _logits(blocks, ids)[0].log_softmax(-1), _logits(dense, ids)[0].log_softmax(-1)
    divergence = (reference.exp() * (reference - ours)).sum(-1)
    assert float(divergence.mean()) < 0.03 and float(divergence.max()) < 0.1, divergence
    assert float((ours.argmax(-1) == reference.argmax(-1)).float().mean()) >= 0.8
    prompt = [1, 9690, 198, 2683, 346, 253, 1876, 3180, 28, 7, 1]
    plain = SpeculativeDecoder(blocks, None, parse_strategy("ar")).generate([prompt], max_new_tokens=24).tokens
    drafter = RetrievalDrafter(None, int(blocks.config.vocab_size))
    for strategy in ("chain:3", "topk:2,2,4"):
        spec = SpeculativeDecoder(blocks, drafter, parse_strategy(strategy)).generate([prompt], max_new_tokens=24)
        assert spec.tokens[0] == plain[0], strategy
    # with the cache in float16 too (each entry rounded once, when stored), and close to the float32 cache
    blocks.set_kv_cache_dtype(torch.float16)
    half = _logits(blocks, ids)[0].log_softmax(-1)
    assert float((ours.exp() * (ours - half)).sum(-1).max()) < 0.1
    plain = SpeculativeDecoder(blocks, None, parse_strategy("ar")).generate([prompt], max_new_tokens=24).tokens
    for strategy in ("chain:3", "topk:2,2,4"):
        spec = SpeculativeDecoder(blocks, drafter, parse_strategy(strategy)).generate([prompt], max_new_tokens=24)
        assert spec.tokens[0] == plain[0], strategy


@pytest.mark.model
def test_the_file_reader_sees_what_the_gguf_package_sees() -> None:
    """spec_fast.lean.gguf_file reads the same tensor table (names, types, shapes, bytes) and scalar fields as
    gguf.GGUFReader, skipping array fields (the tokenizer's), and refuses what is not GGUF v2/v3."""
    from gguf import GGUFReader

    from spec_fast.lean.gguf_file import read_gguf_file

    path = os.path.join(default_model_dir(), DEFAULT_GGUF)
    ours, reference = read_gguf_file(path), GGUFReader(path)
    assert [t.name for t in ours.tensors] == [t.name for t in reference.tensors]
    for mine, theirs in zip(ours.tensors, reference.tensors):
        assert mine.type_name == theirs.tensor_type.name
        assert mine.shape == tuple(int(d) for d in theirs.shape)
        assert mine.data.dtype == theirs.data.dtype and mine.data.shape == theirs.data.shape
        assert np.array_equal(mine.data, theirs.data), mine.name
    arrays = 0
    for key, field in reference.fields.items():
        if key.startswith("GGUF."):
            continue
        if field.types[0].name == "ARRAY":
            arrays += 1
            assert ours.fields[key] is None
            continue
        value = field.parts[field.data[0]]
        expected = bytes(value).decode() if field.types[0].name == "STRING" else value.tolist()[0]
        assert ours.fields[key] == expected, key
    assert arrays >= 3  # the vocabulary, token types and merges were skipped, not misread


def test_the_file_reader_refuses_files_that_are_not_gguf(tmp_path: Any) -> None:
    import struct

    from spec_fast.lean.gguf_file import read_gguf_file

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + bytes(60))
    with pytest.raises(ValueError, match="bad magic"):
        read_gguf_file(str(bad))
    old = tmp_path / "old.gguf"
    old.write_bytes(b"GGUF" + struct.pack("<IQQ", 1, 0, 0))
    with pytest.raises(ValueError, match="version 1"):
        read_gguf_file(str(old))
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1, 1) + struct.pack("<Q", 40) + b"general")
    with pytest.raises(ValueError, match="truncated"):
        read_gguf_file(str(truncated))


@pytest.mark.model
def test_the_file_reader_refuses_a_file_cut_inside_its_tensor_data(tmp_path: Any) -> None:
    from spec_fast.lean.gguf_file import read_gguf_file

    cut = tmp_path / "cut.gguf"
    with open(os.path.join(default_model_dir(), DEFAULT_GGUF), "rb") as handle:
        cut.write_bytes(handle.read(3_000_000))  # the header and table, part of the first tensor
    with pytest.raises(ValueError, match="truncated GGUF file: tensor 'token_embd.weight'"):
        read_gguf_file(str(cut))
