"""One admitted request on the HTTP side: reads its engine outputs and turns them into an OpenAI response
object (``collect``) or stream chunks (``stream``), then records its metrics and, if it ended early, aborts
it in the engine (``close``).

Streamed text never takes back what it sent: the engine's ``RequestOutput.text`` already holds back a
trailing half UTF-8 character and a trailing prefix of a stop string while a request runs, so each text
extends the previous one; a text that would not (a later token changing how earlier ones decode) is not
sent until it does.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request

from spec_fast.serve.errors import APIError
from spec_fast.serve.metrics import ServeMetrics
from spec_fast.serve.protocol import GenerationParams, completion_id, now, spec_stats, usage
from spec_fast.serve.worker import Admission, EngineFailure, LoadedModel, Submission

__all__ = ["Generation", "sse"]

#: How often a non-streaming request looks whether its client is still connected
_DISCONNECT_POLL_S = 0.25


def sse(payload: dict[str, Any]) -> str:
    """One server-sent event carrying a JSON object."""
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


class Generation:
    """See the module docstring. ``kind`` is ``"chat"`` (``/v1/chat/completions``) or ``"text"``
    (``/v1/completions``)."""

    def __init__(self, submission: Submission, admission: Admission, params: GenerationParams, arrival_s: float,
                 model: LoadedModel, model_name: str, kind: str, metrics: ServeMetrics,
                 abort: Callable[[Submission], None]) -> None:
        self.submission = submission
        self.admission = admission
        self.params = params
        self.arrival_s = arrival_s
        self.model = model
        self.model_name = model_name
        self.chat = kind == "chat"
        self.metrics = metrics
        self.abort = abort
        self.id = completion_id("chatcmpl" if self.chat else "cmpl")
        self.created = now()
        self.sent = ""
        self.first_token_s: float | None = None
        self.generated = 0
        self.final: Any | None = None
        self.closed = False

    # ------------------------------------------------------------------ engine outputs
    def _take(self, item: Any) -> str:
        """Account for one engine output; return the text it adds that is safe to send."""
        if isinstance(item, EngineFailure):
            raise APIError(503, str(item), None, "engine_unavailable")
        if item.new_tokens and self.first_token_s is None:
            self.first_token_s = time.monotonic()
        self.generated += len(item.new_tokens)
        if item.finished:
            if item.finish_reason == "abort":
                raise APIError(503, "the request was aborted (the server is shutting down)", None, "aborted")
            self.final = item
        text = item.text or ""
        if len(text) > len(self.sent) and text.startswith(self.sent):
            delta = text[len(self.sent):]
            self.sent = text
            return delta
        return ""

    def completion_tokens(self) -> int:
        stats = getattr(self.final, "stats", None)
        return int(stats.generated_tokens) if stats is not None else self.generated

    def cached_tokens(self) -> int:
        stats = getattr(self.final, "stats", None)
        return int(getattr(stats, "cached_prompt_tokens", 0)) if stats is not None else 0

    def close(self) -> None:
        """Once, when the response ends (completed, failed, or the client went away)."""
        if self.closed:
            return
        self.closed = True
        if self.final is None:
            self.abort(self.submission)
        reason = str(self.final.finish_reason) if self.final is not None else "abort"
        stats = getattr(self.final, "stats", None)
        self.metrics.observe_finished(reason, stats, self.arrival_s, self.first_token_s, time.monotonic(),
                                      self.completion_tokens() if self.final is not None else self.generated)

    # ------------------------------------------------------------------ one JSON object
    async def collect(self, request: Request) -> dict[str, Any]:
        try:
            checked = time.monotonic()
            while self.final is None:
                try:
                    item = await asyncio.wait_for(self.submission.outputs.get(), _DISCONNECT_POLL_S)
                except TimeoutError:
                    item = None
                if time.monotonic() - checked >= _DISCONNECT_POLL_S:  # outputs may come every step: look anyway
                    checked = time.monotonic()
                    if await request.is_disconnected():  # nobody will read the answer: free the slot
                        return {}
                if item is not None:
                    self._take(item)
            return self._response()
        finally:
            self.close()

    def _response(self) -> dict[str, Any]:
        assert self.final is not None
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": self.final.text or ""}
        else:
            choice["text"] = self.final.text or ""
        choice.update(logprobs=None, finish_reason=self.final.finish_reason, speculative_decoding=self._spec())
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model_name, "choices": [choice],
                "usage": usage(self.admission.prompt_tokens, self.completion_tokens(), self.cached_tokens())}

    def _spec(self) -> dict[str, Any]:
        return spec_stats(getattr(self.final, "stats", None), self.model.strategy_label(self.submission.sampling),
                          self.model.draft)

    # ------------------------------------------------------------------ server-sent events
    def _chunk(self, delta: str | None, finish_reason: str | None = None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            choice["delta"] = {} if delta is None else (
                {"role": "assistant", "content": ""} if delta == "" else {"content": delta})
        else:
            choice["text"] = delta or ""
        choice.update(logprobs=None, finish_reason=finish_reason)
        if finish_reason is not None:
            choice["speculative_decoding"] = self._spec()
        chunk: dict[str, Any] = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                                 "created": self.created, "model": self.model_name, "choices": [choice]}
        if self.params.include_usage:  # OpenAI: null on every chunk but the last
            chunk["usage"] = None
        return chunk

    async def stream(self) -> AsyncIterator[dict[str, Any]]:
        """The response's chunks; an engine failure becomes a final ``{"error": ...}`` event."""
        try:
            if self.chat:
                yield self._chunk("")  # the role first, as OpenAI sends it
            while self.final is None:
                delta = self._take(await self.submission.outputs.get())
                if delta:
                    yield self._chunk(delta)
            yield self._chunk(None, str(self.final.finish_reason))
            if self.params.include_usage:
                last = self._chunk(None)
                last["choices"] = []
                last["usage"] = usage(self.admission.prompt_tokens, self.completion_tokens(), self.cached_tokens())
                yield last
        except APIError as err:
            yield err.body()
