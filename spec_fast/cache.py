"""Local cache of de-quantised GGUF models, so that only the first run pays for the de-quantisation.

transformers de-quantises a GGUF file tensor by tensor on every load (about 20 s for the packaged
SmolLM2-135M-Instruct on a 2-core CPU). The first load saves the result as safetensors, with its config
and tokenizer, under :func:`cache_root` (``$SPEC_FAST_CACHE``, else ``$XDG_CACHE_HOME/spec-fast``, else
``~/.cache/spec-fast``); later loads read that folder (well under a second).

An entry is keyed by the GGUF file's identity (absolute path, size, modification time) and the dtype,
so a replaced file gets a new entry. Entries are written into a temporary folder next to their final
place and renamed into it when complete: a killed run leaves a stray temporary folder (ignored, and
removed by the next successful write of that entry) but never a half-written entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from typing import Any

__all__ = ["cache_root", "gguf_cache_dir", "save_entry"]

#: Staging folders older than this are left over from killed runs (a live write takes seconds).
STALE_STAGING_S = 3600.0
#: Bumped when the layout of an entry changes, so old entries are not read.
CACHE_FORMAT = 1


def cache_root() -> str:
    """``$SPEC_FAST_CACHE``, else ``$XDG_CACHE_HOME/spec-fast``, else ``~/.cache/spec-fast``."""
    explicit = os.environ.get("SPEC_FAST_CACHE")
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(base), "spec-fast")


def gguf_cache_dir(gguf_path: str, dtype: str) -> str:
    """The entry folder for ``gguf_path`` de-quantised to ``dtype`` (it exists only once complete)."""
    path = os.path.realpath(gguf_path)
    stat = os.stat(path)
    identity = json.dumps([CACHE_FORMAT, path, stat.st_size, stat.st_mtime_ns, dtype])
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    stem = os.path.splitext(os.path.basename(path))[0]
    return os.path.join(cache_root(), f"{stem}-{dtype}-{digest}")


def save_entry(entry: str, model: Any, tokenizer: Any) -> None:
    """Write ``model`` (safetensors + config; None: the tokenizer alone) and ``tokenizer`` to ``entry``
    atomically.

    The model must already be de-quantised (plain tensors); its GGUF quantizer record is dropped so that
    the entry loads as an ordinary checkpoint. Raises ``OSError`` when the cache cannot be written.
    """
    parent = os.path.dirname(entry)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(entry)}.tmp-", dir=parent)
    try:
        if model is not None:
            _save_model(staging, model)
        tokenizer.save_pretrained(staging)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp makes it private; the entry is an ordinary folder
        try:
            os.rename(staging, entry)
        except OSError:
            if not os.path.isdir(entry):  # not a concurrent writer that finished first: a real failure
                raise
            shutil.rmtree(staging, ignore_errors=True)
        _remove_stale_staging(parent, os.path.basename(entry))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _save_model(folder: str, model: Any) -> None:
    quantizer = getattr(model, "hf_quantizer", None)
    quantization_config = getattr(model.config, "quantization_config", None)
    # save_pretrained refuses GGUF-loaded models; the weights are plain tensors after de-quantisation
    model.hf_quantizer = None
    if quantization_config is not None:
        del model.config.quantization_config
    try:
        model.save_pretrained(folder, safe_serialization=True)
    finally:
        model.hf_quantizer = quantizer
        if quantization_config is not None:
            model.config.quantization_config = quantization_config


def _remove_stale_staging(parent: str, entry_name: str) -> None:
    """Remove the staging folders that killed runs left for ``entry_name`` (not those being written now)."""
    now = time.time()
    for name in os.listdir(parent):
        path = os.path.join(parent, name)
        if name.startswith(f".{entry_name}.tmp-"):
            try:
                if now - os.stat(path).st_mtime > STALE_STAGING_S:
                    shutil.rmtree(path, ignore_errors=True)
            except OSError:
                pass
