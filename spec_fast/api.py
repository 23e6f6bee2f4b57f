"""One call from a prompt to text: :func:`generate`, with the defaults of ``spec-fast generate``.

    >>> import spec_fast
    >>> out = spec_fast.generate("Name three colours.", max_new_tokens=32)   # doctest: +SKIP
    >>> out.text, out.tokens, out.metrics.block_efficiency                   # doctest: +SKIP

A string is sent as one user message through the model's chat template (``chat=False`` sends it as
raw text); a list of ``{"role": ..., "content": ...}`` dicts is sent as the conversation. The loaded
model and decoder are kept for the next call with the same model settings (an ``+adaptive`` strategy
keeps what it learned). Stop strings end generation at the step whose text first contains one of them;
the text is cut before the stop string and the tokens after the token that completed it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

from spec_fast.chat import template_ids
from spec_fast.detokenize import IncrementalText, final_length
from spec_fast.settings import (DEFAULT_MAX_NEW_TOKENS, DEFAULT_THREADS, GenerateSettings, ModelSource, SettingError,
                                check_text, resolve_settings)

if TYPE_CHECKING:  # the engine (torch) is imported only once a model loads
    from spec_fast.metrics import GenerationMetrics

__all__ = ["Completion", "generate", "prompt_messages", "load_decoder", "complete", "StopTextStream"]

#: A prompt: a user message, or a conversation of ``{"role": "system"|"user"|"assistant", "content": str}``.
Prompt = Union[str, bytes, Sequence[Mapping[str, str]]]
_ROLES = ("system", "user", "assistant")


@dataclass
class Completion:
    """``text`` (cut before a stop string; special tokens skipped), ``tokens`` (generated ids, EOS
    included when hit), ``metrics`` (:class:`spec_fast.metrics.GenerationMetrics` of the run),
    ``finish_reason`` (``"stop"``: EOS or a stop string, ``"length"``: ``max_new_tokens``), ``settings``."""

    text: str
    tokens: list[int]
    metrics: GenerationMetrics
    finish_reason: str
    settings: GenerateSettings

    def as_dict(self) -> dict[str, Any]:
        """The object that ``spec-fast generate --json`` prints."""
        return {
            "text": self.text,
            "tokens": self.tokens,
            "finish_reason": self.finish_reason,
            "metrics": self.metrics.as_dict(),
            "settings": self.settings.as_dict(),
        }


def prompt_messages(prompt: Prompt, system: str | None = None, chat: bool = True) -> str | list[dict[str, str]]:
    """Check ``prompt``: the raw text (``chat=False``) or the list of chat messages to send. Bytes are decoded
    as UTF-8; text that is not UTF-8 (bytes, or a str holding lone surrogates) is a :class:`SettingError`."""
    if isinstance(prompt, (bytes, bytearray)):
        try:
            prompt = bytes(prompt).decode("utf-8")
        except UnicodeDecodeError as err:
            raise SettingError("prompt", f"is not valid UTF-8 text (byte 0x{prompt[err.start]:02x} at byte "
                                         f"{err.start}); give UTF-8 text") from None
    if isinstance(prompt, str):
        check_text("prompt", prompt)
        if not prompt.strip():
            raise SettingError("prompt", "must be a non-empty string, got an empty prompt")
        if not chat:
            if system is not None:
                raise SettingError("system", "needs the chat template (drop --no-chat / chat=False)")
            return prompt
        return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    if not chat:
        raise SettingError("prompt", "a list of messages needs the chat template; pass a string with chat=False")
    if not isinstance(prompt, Sequence) or not prompt:
        raise SettingError("prompt", f"must be a string or a non-empty list of messages, got {prompt!r}")
    messages: list[dict[str, str]] = []
    for i, message in enumerate(prompt):
        if (not isinstance(message, Mapping) or set(message) != {"role", "content"}
                or message["role"] not in _ROLES or not isinstance(message["content"], str)):
            raise SettingError("prompt", f"message {i} must be {{'role': one of {_ROLES}, 'content': str}}, "
                                         f"got {message!r}")
        check_text("prompt", message["content"])
        messages.append({"role": message["role"], "content": message["content"]})
    if system is not None:
        if messages[0]["role"] == "system":
            raise SettingError("system", "the messages already start with a system message")
        messages.insert(0, {"role": "system", "content": system})
    if not any(m["content"].strip() for m in messages if m["role"] == "user"):
        raise SettingError("prompt", "the messages hold no non-empty user message")
    return messages


def prompt_ids(tokenizer: Any, messages: str | list[dict[str, str]]) -> list[int]:
    """Token ids of raw text, or of chat messages through the chat template (assistant turn opened)."""
    if isinstance(messages, str):
        return [int(t) for t in tokenizer(messages)["input_ids"]]
    if not getattr(tokenizer, "chat_template", None):
        raise SettingError("prompt", "this model's tokenizer has no chat template; pass a string with "
                                     "chat=False (--no-chat)")
    return template_ids(tokenizer, messages)


class StopTextStream:
    """Incremental text of a growing token list: yields only text that is final (no trailing half of a
    UTF-8 character, no trailing prefix of a stop string) and finds the first stop string.

    ``push(tokens)`` returns ``(new_text, stopped)``; ``finish()`` returns the held-back rest.
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.detok = IncrementalText(tokenizer)  # the tokens pushed and their text, without a whole decode per push
        self.emitted = ""
        self.text = ""
        self.stopped = False
        self.stop_tokens = 0  # number of tokens up to the one that completed the stop string

    @property
    def tokens(self) -> list[int]:
        """The tokens pushed so far."""
        return self.detok.tokens

    def push(self, tokens: Sequence[int]) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        before = len(self.tokens)
        self.detok.extend(tokens)
        text = self.detok.text()
        cut, stop_at = self.detok.first_stop(text, self.stop, before)
        if cut >= 0:
            self.stopped = True
            self.text = text[:cut]
            if stop_at is not None:  # the first token whose text completes a stop string
                self.stop_tokens = stop_at
            return self._emit(self.text), True
        self.text = text
        return self._emit(text[: final_length(text, self.stop)]), False

    def finish(self) -> str:
        return self._emit(self.text)

    def _emit(self, final: str) -> str:
        if not final.startswith(self.emitted) or len(final) <= len(self.emitted):
            return ""  # a later token changed how earlier ones decode: wait until it settles
        new = final[len(self.emitted):]
        self.emitted = final
        return new


@dataclass
class _Loaded:
    key: tuple[Any, ...]
    model: Any
    tokenizer: Any
    decoders: dict[tuple[Any, ...], Any]
    hf_model: Any  # the HF model behind a lean one (trained drafts are built from its modules)


_LOADED: list[_Loaded] = []  # the last loaded target (one at a time: models are large)


def load_decoder(settings: GenerateSettings, notify: Callable[[str], None] | None = None) -> tuple[Any, Any]:
    """``(SpeculativeDecoder, tokenizer)`` for ``settings``; the target and decoder are reused by later
    calls with the same model, dtype, device, draft and strategy."""
    import torch

    from spec_fast.drafts.model import Drafter
    from spec_fast.engine import SpeculativeDecoder
    from spec_fast.models import load_cached_lean, load_model

    if settings.threads is not None:
        from spec_fast.models import set_threads

        set_threads(settings.threads, notify)
    if settings.device.startswith("cuda") and not torch.cuda.is_available():
        raise SettingError("device", f"{settings.device!r} requested but torch sees no CUDA device")
    source = settings.model
    key = (source, settings.dtype, settings.device, settings.lean, settings.quantize, settings.kv_cache_dtype)
    if not _LOADED or _LOADED[0].key != key:
        _LOADED.clear()
        cached = None
        if settings.dtype == "float32" and settings.quantize == "none":
            # the model cache read without transformers: the same logits, seconds sooner (drafts built from
            # HF modules load the HF model beside it, _load_drafter)
            cached = load_cached_lean(source.path, source.gguf_file, settings.device)
        if settings.quantize == "gguf":  # the file's own blocks, no HF model
            model, tokenizer = load_model(source.path, device=settings.device, gguf_file=source.gguf_file, threads=None,
                                          notify=notify, quantize="gguf")
            hf_model = None
        elif cached is not None:
            model, tokenizer = cached
            hf_model = None
        else:
            hf_model, tokenizer = load_model(source.path, dtype=settings.dtype, device=settings.device, threads=None,
                                             gguf_file=source.gguf_file, notify=notify)
            model = hf_model
            from spec_fast.lean import supports
            from spec_fast.models import lean_model

            if settings.lean:
                model = lean_model(hf_model, settings.quantize if settings.quantize != "none" else "float32")
            elif settings.dtype == "float32" and supports(hf_model) is None:
                # a Llama-family target runs on the lean forward (native products, batch-invariant), also in
                # the run that fills the model cache, so every run decodes with the same forward
                model = lean_model(hf_model, "float32")
        if settings.kv_cache_dtype == "float16":  # resolve_settings allows it for lean models only
            model.set_kv_cache_dtype(torch.float16)
        _LOADED.append(_Loaded(key, model, tokenizer, {}, hf_model))
    loaded = _LOADED[0]
    decoder_key = (settings.draft, settings.dual, settings.strategy)
    if decoder_key not in loaded.decoders:
        drafter: Drafter | None = None
        if settings.strategy.drafts:
            drafters = [_load_drafter(name, source, loaded, settings, notify)
                        for name, source in zip(settings.draft.split(","), settings.draft_models)]
            drafter = drafters[0]
            if len(drafters) == 2:
                from spec_fast.drafts.dual import DualDrafter, load_route_prior

                # the committed drafts (by name) have prior tables for route-calibrated; model folders do not
                priors = [load_route_prior(name) if source is None else None
                          for name, source in zip(settings.draft.split(","), settings.draft_models)]
                drafter = DualDrafter(drafters[0], drafters[1], mode=str(settings.dual), priors=(priors[0], priors[1]))
        loaded.decoders[decoder_key] = SpeculativeDecoder(loaded.model, drafter, settings.strategy)
    return loaded.decoders[decoder_key], loaded.tokenizer


def _load_drafter(name: str, source: ModelSource | None, loaded: _Loaded, settings: GenerateSettings,
                  notify: Callable[[str], None] | None) -> Any:
    """One drafter by its checked name (``source``: the draft model's location, for model drafts)."""
    from spec_fast.drafts.model import EarlyExitDrafter, ModelDrafter
    from spec_fast.models import load_model

    if name.startswith("early-exit:"):
        return EarlyExitDrafter(loaded.model, int(name.split(":", 1)[1]))
    if source is not None:
        draft_model, _ = load_model(source.path, dtype=settings.dtype, device=settings.device, threads=None,
                                    gguf_file=source.gguf_file, notify=notify)
        return ModelDrafter(draft_model)
    from spec_fast.drafts.heads import load_drafter

    if name == "retrieval":  # needs only the vocabulary size
        return load_drafter(name, loaded.model)
    if loaded.hf_model is None:  # the target came from the model cache without transformers
        loaded.hf_model, _ = load_model(loaded.key[0].path, dtype=settings.dtype, device=settings.device, threads=None,
                                        gguf_file=loaded.key[0].gguf_file, notify=notify)
    # trained drafts are built from HF modules; their subset LM head reads the running target's blocks
    return load_drafter(name, loaded.hf_model, target_lm_head=loaded.model.get_output_embeddings())


def complete(
    decoder: Any,
    tokenizer: Any,
    messages: str | list[dict[str, str]],
    settings: GenerateSettings,
    on_text: Callable[[str], None] | None = None,
    on_step: Callable[[int, int], None] | None = None,
) -> Completion:
    """Run ``decoder`` on ``messages``; ``on_text(chunk)`` receives the final text as it grows,
    ``on_step(tokens_so_far, steps)`` is called after every step."""
    from spec_fast.engine import SamplingParams

    ids = prompt_ids(tokenizer, messages)
    sampling = SamplingParams(temperature=settings.temperature, top_k=settings.top_k, top_p=settings.top_p,
                              seed=settings.seed)
    stream = StopTextStream(tokenizer, settings.stop)
    steps = [0]

    def on_tokens(new: list[list[int]]) -> bool:
        steps[0] += 1
        chunk, stopped = stream.push(new[0])
        if chunk and on_text is not None:
            on_text(chunk)
        if on_step is not None:
            on_step(len(stream.tokens), steps[0])
        return stopped

    eos = tokenizer.eos_token_id
    result = decoder.generate([ids], max_new_tokens=settings.max_new_tokens, sampling=sampling,
                              eos_token_id=eos if isinstance(eos, int) else None, on_tokens=on_tokens)
    rest = stream.finish()
    if rest and on_text is not None:
        on_text(rest)
    tokens = [int(t) for t in result.tokens[0]]
    if stream.stopped:
        tokens = tokens[: stream.stop_tokens]
        reason = "stop"
    else:
        reason = "stop" if tokens and isinstance(eos, int) and tokens[-1] == eos else "length"
    return Completion(text=stream.text, tokens=tokens, metrics=result.metrics, finish_reason=reason,
                      settings=settings)


def generate(
    prompt: Prompt,
    *,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    stop: str | Sequence[str] | None = None,
    system: str | None = None,
    chat: bool = True,
    model: str | None = None,
    gguf_file: str | None = None,
    draft: str | None = None,
    dual: str | None = None,
    quantize: str = "auto",
    lean: bool = False,
    kv_cache_dtype: str = "auto",
    strategy: str | None = None,
    verifier: str | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    threads: int | None = DEFAULT_THREADS,
    on_text: Callable[[str], None] | None = None,
) -> Completion:
    """Generate a reply to ``prompt`` (a user message, or a list of chat messages) and return a
    :class:`Completion` (``.text``, ``.tokens``, ``.metrics``).

    The defaults are those of ``spec-fast generate``: SmolLM2-135M-Instruct (de-quantised once into the
    cache of :mod:`spec_fast.cache`), its chat template, greedy decoding (``temperature=0``), the draft and
    strategy of :func:`spec_fast.settings.resolve_settings`, ``threads=1`` torch CPU threads (``None``
    leaves torch's setting; bench/results/threads.md). Every argument is checked before a model loads
    (``ValueError`` naming it). ``on_text(chunk)`` streams the text. Two drafts ``draft="rnn,retrieval"``
    need ``dual="merge"``, ``"route"`` or ``"route-calibrated"``.
    """
    settings = resolve_settings(
        model=model, gguf_file=gguf_file, draft=draft, strategy=strategy, verifier=verifier,
        temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, max_new_tokens=max_new_tokens,
        stop=None if stop is None else (stop if isinstance(stop, str) else tuple(stop)), system=system,
        chat=chat, dtype=dtype, device=device, threads=threads, dual=dual,
        quantize=quantize, lean=lean, kv_cache_dtype=kv_cache_dtype,
    )
    messages = prompt_messages(prompt, settings.system, settings.chat)
    decoder, tokenizer = load_decoder(settings, notify=_notify_stderr)
    return complete(decoder, tokenizer, messages, settings, on_text=on_text)


def _notify_stderr(message: str) -> None:
    import sys

    print(f"spec_fast: {message}", file=sys.stderr)
