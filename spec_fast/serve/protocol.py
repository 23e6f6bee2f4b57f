"""Request bodies of ``/v1/chat/completions`` and ``/v1/completions`` (OpenAI's names and defaults) and the
response objects and stream chunks built from the engine's outputs.

Fields the OpenAI API defines but this server does not implement are accepted only at their neutral
value (``n=1``, ``logprobs`` off, zero penalties, no tools): anything else is refused with 400 instead of
being silently ignored. Unknown fields are ignored, as vLLM does, so that clients sending extras still work.
``top_k`` is an extra field (the ``openai`` client sends it through ``extra_body``); ``-1`` means off, as in
vLLM.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from spec_fast.serve.errors import APIError

__all__ = ["ChatCompletionRequest", "CompletionRequest", "StreamOptions", "ChatMessage", "GenerationParams",
           "usage", "completion_id", "now", "spec_stats"]

# OpenAI's documented bounds; a seed is further bounded by SamplingParams (2**64 - 1)
_MAX_SEED = 2**64 - 2


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class _SamplingFields(BaseModel):
    """Fields both endpoints share."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    seed: int | None = Field(default=None, ge=0, le=_MAX_SEED)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    logprobs: bool | int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    best_of: int | None = None

    def _refuse_unsupported(self) -> None:
        if self.n != 1:
            raise APIError(400, f"n must be 1 (one choice per request), got {self.n}", "n", "unsupported_value")
        if self.best_of not in (None, 1):
            raise APIError(400, f"best_of must be 1, got {self.best_of}", "best_of", "unsupported_value")
        if self.logprobs not in (None, False, 0):
            raise APIError(400, "logprobs are not supported by this server", "logprobs", "unsupported_value")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                raise APIError(400, f"{name} is not supported by this server (only 0)", name, "unsupported_value")
        if self.logit_bias:
            raise APIError(400, "logit_bias is not supported by this server", "logit_bias", "unsupported_value")
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options needs stream=true", "stream_options", "invalid_value")

    def _stops(self) -> tuple[str, ...]:
        stops = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        if any(not s for s in stops):
            raise APIError(400, "stop strings must be non-empty", "stop", "invalid_value")
        return stops

    def generation_params(self, max_tokens: int | None, default_temperature: float) -> GenerationParams:
        self._refuse_unsupported()
        temperature = default_temperature if self.temperature is None else self.temperature
        # a sampled request without a seed is not reproducible, as with OpenAI: it gets a fresh one
        seed = self.seed if self.seed is not None else secrets.randbelow(2**63)
        return GenerationParams(
            max_tokens=max_tokens, temperature=float(temperature),
            top_p=1.0 if self.top_p is None else float(self.top_p),
            top_k=0 if self.top_k in (None, -1) else int(self.top_k), seed=seed, stop=self._stops(),
            stream=self.stream, include_usage=bool(self.stream_options and self.stream_options.include_usage),
        )


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None

    def params(self, default_temperature: float) -> GenerationParams:
        if self.tools:
            raise APIError(400, "tools are not supported by this server", "tools", "unsupported_value")
        if self.response_format and self.response_format.get("type", "text") != "text":
            raise APIError(400, "only response_format type 'text' is supported", "response_format",
                           "unsupported_value")
        # max_completion_tokens is the newer name of max_tokens (OpenAI); both given must agree
        if (self.max_tokens is not None and self.max_completion_tokens is not None
                and self.max_tokens != self.max_completion_tokens):
            raise APIError(400, "max_tokens and max_completion_tokens differ; give one", "max_completion_tokens",
                           "invalid_value")
        limit = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return self.generation_params(limit, default_temperature)

    def conversation(self) -> list[dict[str, str]]:
        """The messages for the chat template (``developer`` is OpenAI's newer name of ``system``)."""
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] = Field(union_mode="left_to_right")
    echo: bool = False
    suffix: str | None = None

    def params(self, default_temperature: float) -> GenerationParams:
        if self.echo:
            raise APIError(400, "echo is not supported by this server", "echo", "unsupported_value")
        if self.suffix:
            raise APIError(400, "suffix is not supported by this server", "suffix", "unsupported_value")
        return self.generation_params(self.max_tokens, default_temperature)

    def prompt_text_or_ids(self) -> str | list[int]:
        """One prompt: a string, a list holding one string, or token ids (several prompts: 400)."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError(400, f"one prompt per request, got {len(prompt)}", "prompt", "unsupported_value")
            prompt = str(prompt[0])
        if isinstance(prompt, str):
            if not prompt:
                raise APIError(400, "prompt must be a non-empty string", "prompt", "invalid_value")
            return prompt
        if not prompt:
            raise APIError(400, "prompt must not be empty", "prompt", "invalid_value")
        return [int(t) for t in prompt]


@dataclass(frozen=True)
class GenerationParams:
    """One request's generation settings once checked (``max_tokens`` None: up to the model's context)."""

    max_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    seed: int
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool


def completion_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's usage object; ``prompt_tokens_details.cached_tokens``: prompt tokens served by prefix caching."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def spec_stats(stats: Any, strategy: str, draft: str) -> dict[str, Any]:
    """The per-choice ``speculative_decoding`` extra field from the engine's request statistics."""
    passes = int(getattr(stats, "target_passes", 0))
    generated = int(getattr(stats, "generated_tokens", 0))
    return {
        "strategy": strategy,
        "draft": draft,
        "target_passes": passes,
        "draft_tokens": int(getattr(stats, "draft_tokens", 0)),
        "accepted_tokens": int(getattr(stats, "accepted_tokens", 0)),
        "mean_accepted_length": float(getattr(stats, "mean_accepted_length", 0.0)),
        "accepted_length_histogram": [int(n) for n in getattr(stats, "accepted_length_histogram", [])],
        "accepted_per_position": [int(n) for n in getattr(stats, "accepted_per_position", [])],
        "tokens_per_target_pass": generated / passes if passes else 0.0,
    }
