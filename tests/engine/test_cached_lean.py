"""The model cache read without transformers (spec_fast.lean.load): the lean target built from an entry
computes the logits of the lean target built from the HF model bit for bit (and HF's own within float32
rounding: the lean forward has its own matrix product), its tokenizer gives transformers' ids and text, and
the default ``generate`` path then never imports transformers."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
import torch

from spec_fast.cache import save_entry
from spec_fast.drafts.retrieval import RetrievalDrafter
from spec_fast.engine import SamplingParams, SpeculativeDecoder
from spec_fast.lean import LeanLlama
from spec_fast.lean.load import entry_supported, load_entry
from spec_fast.strategies import parse_strategy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MESSAGES = [
    [{"role": "user", "content": "Hi there"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour.\nOnly one."}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c {x}"}],
]
TEXTS = ["abc", "Hello, world!\n  two  spaces", "<eos> inside", "don't stop"]


@pytest.fixture(scope="module")
def tiny_entry(tiny_chat_model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_chat_model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_chat_model_dir)
    entry = str(tmp_path_factory.mktemp("lean-entry") / "entry")
    save_entry(entry, model, tokenizer)
    return entry, model, tokenizer


def _assert_same_tokenizer(reference: Any, ours: Any, ids: list[int]) -> None:
    assert ours.eos_token_id == reference.eos_token_id
    for text in TEXTS:
        assert ours(text)["input_ids"] == list(reference(text)["input_ids"]), text
    for messages in MESSAGES:
        expected = reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(expected, "keys"):
            expected = expected["input_ids"]
        assert ours.apply_chat_template(messages, add_generation_prompt=True, tokenize=True) == list(expected)
    for skip in (False, True):
        assert ours.decode(ids, skip_special_tokens=skip) == reference.decode(ids, skip_special_tokens=skip)


def test_a_tiny_entry_reads_back_as_a_lean_model_with_the_same_logits_and_tokens(tiny_entry: Any) -> None:
    entry, hf, hf_tokenizer = tiny_entry
    assert entry_supported(entry) is None
    lean, tokenizer = load_entry(entry)
    prompt = tokenizer.apply_chat_template(MESSAGES[1], add_generation_prompt=True, tokenize=True)
    ids = torch.tensor([prompt])
    from_hf = LeanLlama.from_hf(hf)
    with torch.no_grad():
        assert torch.equal(lean(input_ids=ids).logits, from_hf(input_ids=ids).logits)
        torch.testing.assert_close(lean(input_ids=ids).logits, hf(input_ids=ids).logits, rtol=1e-5, atol=1e-4)
    drafter = RetrievalDrafter(None, int(hf.config.vocab_size))
    for name in ("ar", "chain:2", "chain:2+adaptive"):
        for sampling in (None, SamplingParams(temperature=0.8, top_p=0.95, seed=5)):
            strategy = parse_strategy(name)
            outs = []
            for model in (from_hf, lean):
                decoder = SpeculativeDecoder(model, drafter if strategy.drafts else None, strategy)
                outs.append(decoder.generate([prompt], max_new_tokens=20, sampling=sampling).tokens[0])
            assert outs[0] == outs[1], (name, sampling)
    _assert_same_tokenizer(hf_tokenizer, tokenizer, prompt + [1, 2, 0])


def test_entries_the_lean_reader_cannot_reproduce_are_refused(tiny_entry: Any, tmp_path: Any) -> None:
    import json
    import shutil

    entry = str(tmp_path / "entry")
    shutil.copytree(tiny_entry[0], entry)
    with open(os.path.join(entry, "config.json")) as handle:
        config = json.load(handle)
    for change, words in (({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}, "RoPE"),
                          ({"model_type": "gpt2"}, "model types"), ({"dtype": "bfloat16"}, "bfloat16")):
        with open(os.path.join(entry, "config.json"), "w") as handle:
            json.dump({**config, **change}, handle)
        reason = entry_supported(entry)
        assert reason is not None and words in reason, (change, reason)
    os.remove(os.path.join(entry, "tokenizer.json"))
    assert "tokenizer.json" in str(entry_supported(entry))


def test_the_default_model_from_its_cache_entry_equals_the_hf_load(smollm2: Any) -> None:
    from spec_fast.models import chat_prompt_ids, load_cached_lean

    hf, hf_tokenizer = smollm2  # loading it filled the session's model cache
    cached = load_cached_lean(None)
    assert cached is not None
    lean, tokenizer = cached
    prompt = chat_prompt_ids(tokenizer, "Name three rivers in Europe.", system="Be brief.")
    assert prompt == chat_prompt_ids(hf_tokenizer, "Name three rivers in Europe.", system="Be brief.")
    from_hf = LeanLlama.from_hf(hf)
    with torch.no_grad():
        ids = torch.tensor([prompt])
        assert torch.equal(lean(input_ids=ids).logits, from_hf(input_ids=ids).logits)
        torch.testing.assert_close(lean(input_ids=ids).logits, hf(input_ids=ids).logits, rtol=1e-4, atol=2e-3)
    strategy = parse_strategy("ar")
    outs = [SpeculativeDecoder(m, None, strategy).generate([prompt], max_new_tokens=12).tokens[0]
            for m in (hf, from_hf, lean)]
    assert outs[0] == outs[1] == outs[2]  # no near-tie in these 12 tokens: all three agree
    _assert_same_tokenizer(hf_tokenizer, tokenizer, prompt + outs[0] + [0, 1, 2])


def test_generate_from_a_filled_cache_never_imports_transformers(smollm2: Any) -> None:
    code = ("import sys; import spec_fast; c = spec_fast.generate('Hi', max_new_tokens=3); "
            "assert c.tokens, c; bad = sorted(m for m in sys.modules if m.startswith(('transformers', 'scipy'))); "
            "assert not bad, bad[:5]")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
