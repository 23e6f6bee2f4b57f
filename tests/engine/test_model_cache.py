"""The model cache (spec_fast.cache): keyed by the GGUF file's identity and the dtype, written atomically,
read back bit for bit. The GGUF path itself is covered with the real model in test_shell.py (``model``)."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import torch

from spec_fast.cache import STALE_STAGING_S, cache_root, gguf_cache_dir, save_entry


def test_the_cache_root_follows_spec_fast_cache_then_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("SPEC_FAST_CACHE", str(tmp_path / "explicit"))
    assert cache_root() == str(tmp_path / "explicit")
    monkeypatch.delenv("SPEC_FAST_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == str(tmp_path / "xdg" / "spec-fast")


def test_an_entry_is_keyed_by_the_files_identity_and_the_dtype(tmp_path: Any) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(100))
    key = gguf_cache_dir(str(gguf), "float32")
    assert key == gguf_cache_dir(str(gguf), "float32") and os.path.basename(key).startswith("model-float32-")
    assert gguf_cache_dir(str(gguf), "bfloat16") != key
    gguf.write_bytes(b"GGUF" + bytes(101))  # replaced by another file: size (and mtime) differ
    assert gguf_cache_dir(str(gguf), "float32") != key
    os.utime(gguf, ns=(1, 1))  # same size, touched
    touched = gguf_cache_dir(str(gguf), "float32")
    os.utime(gguf, ns=(2, 2))
    assert gguf_cache_dir(str(gguf), "float32") != touched


def _tiny(folder: str) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)


def test_an_entry_reads_back_bit_for_bit(tiny_chat_model_dir: str, tmp_path: Any) -> None:
    from spec_fast.models import load_model

    model, tokenizer = _tiny(tiny_chat_model_dir)
    entry = str(tmp_path / "cache" / "entry")
    save_entry(entry, model, tokenizer)
    assert os.listdir(tmp_path / "cache") == ["entry"]  # no staging folder left
    loaded, loaded_tokenizer = load_model(entry)
    assert loaded_tokenizer("abc")["input_ids"] == tokenizer("abc")["input_ids"]
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_a_failed_write_leaves_no_entry_and_no_staging_folder(tiny_chat_model_dir: str, tmp_path: Any,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    model, tokenizer = _tiny(tiny_chat_model_dir)

    def killed(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt  # the run is killed half way through the write

    monkeypatch.setattr(tokenizer, "save_pretrained", killed)
    entry = tmp_path / "cache" / "entry"
    with pytest.raises(KeyboardInterrupt):
        save_entry(str(entry), model, tokenizer)
    assert not entry.exists() and os.listdir(tmp_path / "cache") == []


def test_stale_staging_folders_of_killed_runs_are_removed_by_the_next_write(tiny_chat_model_dir: str,
                                                                          tmp_path: Any) -> None:
    model, tokenizer = _tiny(tiny_chat_model_dir)
    cache = tmp_path / "cache"
    stale = cache / ".entry.tmp-killed"
    live = cache / ".entry.tmp-writing-now"
    stale.mkdir(parents=True)
    live.mkdir()
    old = time.time() - STALE_STAGING_S - 10
    os.utime(stale, (old, old))
    save_entry(str(cache / "entry"), model, tokenizer)
    assert sorted(os.listdir(cache)) == [".entry.tmp-writing-now", "entry"]  # a concurrent writer is left alone
