"""The engine thread: the one thread that loads the model and then makes every call on the batch engine and
its tokenizer.

The engine is single-threaded by design (spec_fast.batch), and HF tokenizers may fail when two threads use
them at once, so HTTP handlers never touch either: they hand a :class:`Submission` to
:meth:`EngineWorker.submit` (a thread-safe command queue) and read the request's outputs from an asyncio
queue that the engine thread fills with ``loop.call_soon_threadsafe``. Between two engine steps the thread
applies every queued command (new requests, aborts), so an abort takes effect before the next step. With
nothing to decode it sleeps on the command queue.
"""

from __future__ import annotations

import asyncio
import queue
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from spec_fast.serve.errors import APIError

if TYPE_CHECKING:
    from spec_fast.settings import GenerateSettings

__all__ = ["EngineWorker", "LoadedModel", "Submission", "Admission", "EngineFailure", "load_engine"]

#: How long the idle engine thread waits on the command queue before looking at its stop flag again
_IDLE_WAIT_S = 0.5


class BatchEngineLike(Protocol):
    """The part of :class:`spec_fast.BatchEngine` the server uses."""

    def add_request(self, prompt_ids: Sequence[int], sampling: Any, max_new_tokens: int,
                    stop: Sequence[str] = ()) -> int: ...

    def step(self) -> list[Any]: ...

    def abort(self, request_id: int) -> bool: ...

    def has_unfinished(self) -> bool: ...

    @property
    def num_running(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...


@dataclass(frozen=True)
class LoadedModel:
    """What the server runs: the engine, its tokenizer, the model's context length (0: unknown), the
    strategy label of a request's sampling parameters (``/greedy`` at temperature 0) and the draft's name."""

    engine: BatchEngineLike
    tokenizer: Any
    context_length: int
    strategy_label: Callable[[Any], str]
    draft: str


@dataclass(frozen=True)
class Admission:
    """A request the engine accepted: its engine id, prompt length and token budget."""

    request_id: int
    prompt_tokens: int
    max_tokens: int


class EngineFailure(Exception):
    """Put in a request's output queue when the engine failed or stopped before the request finished."""


@dataclass(eq=False)
class Submission:
    """One request on its way to the engine. ``tokenize(tokenizer)`` runs on the engine thread and returns
    the prompt ids (or raises :class:`APIError`); outputs arrive in ``outputs``."""

    tokenize: Callable[[Any], list[int]]
    sampling: Any
    max_tokens: int | None
    stop: tuple[str, ...]
    loop: asyncio.AbstractEventLoop
    admitted: asyncio.Future[Admission]
    outputs: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    request_id: int | None = None
    #: set by the HTTP side when the client went away; read by the engine thread
    cancelled: bool = False


class EngineWorker:
    """Owns the engine; see the module docstring. ``load()`` runs first, on the engine thread;
    ``on_step(engine)`` runs after every step there (the metrics' gauges)."""

    def __init__(self, load: Callable[[], LoadedModel], on_step: Callable[[BatchEngineLike], None] | None = None) -> None:
        self._load = load
        self._on_step = on_step
        #: (kind, the request it is about, the reason of an abort_all)
        self._commands: queue.SimpleQueue[tuple[str, Submission | None, str]] = queue.SimpleQueue()
        self._live: dict[int, Submission] = {}
        self._stopping = threading.Event()
        self.ready = threading.Event()
        self.finished = threading.Event()
        self.model: LoadedModel | None = None
        self.load_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="spec-fast-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, submission: Submission) -> None:
        self._commands.put(("add", submission, ""))

    def abort(self, submission: Submission) -> None:
        """The client is gone: drop the request (before it starts, or between two steps)."""
        submission.cancelled = True
        self._commands.put(("abort", submission, ""))

    def abort_all(self, reason: str) -> None:
        """End every request in flight with :class:`EngineFailure` (``reason``), before the next step."""
        self._commands.put(("abort_all", None, reason))

    def stop(self, timeout_s: float) -> bool:
        """Abort what is left and stop the thread; True if it ended within ``timeout_s``."""
        self._stopping.set()
        self._commands.put(("stop", None, ""))
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    # ------------------------------------------------------------------ the engine thread
    def _run(self) -> None:
        try:
            self.model = self._load()
        except BaseException as err:  # reported by the server (one line for a user's mistake)
            self.load_error = err
            self.finished.set()
            return
        self.ready.set()
        try:
            self._serve(self.model)
        finally:
            for submission in list(self._live.values()):
                self._fail(submission, EngineFailure("the server is shutting down"))
            self._live.clear()
            self._drain_refusing()
            self.finished.set()

    def _serve(self, model: LoadedModel) -> None:
        engine = model.engine
        while not self._stopping.is_set():
            self._apply_commands(model, block=not engine.has_unfinished())
            if self._stopping.is_set() or not engine.has_unfinished():
                continue
            try:
                outputs = engine.step()
            except Exception as err:  # a bug of ours: the requests in flight fail, the server goes on
                traceback.print_exception(err, file=sys.stderr)
                self._apply(model, "abort_all", None, f"the engine failed: {type(err).__name__}")
                continue
            for output in outputs:
                receiver = self._live.get(output.request_id)
                if receiver is None:  # aborted after this step began
                    continue
                if output.finished:
                    del self._live[output.request_id]
                self._send(receiver, output)
            if self._on_step is not None:
                self._on_step(engine)

    def _apply_commands(self, model: LoadedModel, block: bool) -> None:
        try:
            command = self._commands.get(timeout=_IDLE_WAIT_S) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._apply(model, *command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _apply(self, model: LoadedModel, kind: str, submission: Submission | None, reason: str) -> None:
        if kind == "add" and submission is not None:
            self._add(model, submission)
        elif kind == "abort" and submission is not None:
            self._abort(model.engine, submission)
        elif kind == "abort_all":
            for request_id, aborted in list(self._live.items()):
                self._fail(aborted, EngineFailure(reason))
                try:
                    model.engine.abort(request_id)
                except Exception as err:  # an engine that just failed may fail again: the others still end
                    traceback.print_exception(err, file=sys.stderr)
            self._live.clear()

    def _add(self, model: LoadedModel, submission: Submission) -> None:
        if submission.cancelled:
            return
        try:
            prompt_ids = submission.tokenize(model.tokenizer)
            budget = _token_budget(len(prompt_ids), submission.max_tokens, model.context_length)
            request_id = model.engine.add_request(prompt_ids, submission.sampling, budget, submission.stop)
        except APIError as err:
            self._resolve(submission, err)
            return
        except Exception as err:  # the engine's ValueError (bad input) or QueueFullError (RuntimeError)
            self._resolve(submission, _engine_refusal(err))
            return
        submission.request_id = request_id
        self._live[request_id] = submission
        self._resolve(submission, Admission(request_id, len(prompt_ids), budget))

    def _abort(self, engine: BatchEngineLike, submission: Submission) -> None:
        if submission.request_id is not None and self._live.pop(submission.request_id, None) is not None:
            engine.abort(submission.request_id)

    def _drain_refusing(self) -> None:
        """Requests still queued when the thread stops are refused (503), not left waiting."""
        while True:
            try:
                kind, submission, _ = self._commands.get_nowait()
            except queue.Empty:
                return
            if kind == "add" and submission is not None:
                self._resolve(submission, APIError(503, "the server is shutting down", None, "shutting_down"))

    # ------------------------------------------------------------------ back to the event loop
    def _resolve(self, submission: Submission, result: Admission | APIError) -> None:
        def deliver() -> None:
            if submission.admitted.done():
                return
            if isinstance(result, APIError):
                submission.admitted.set_exception(result)
            else:
                submission.admitted.set_result(result)

        self._call(submission, deliver)

    def _send(self, submission: Submission, output: Any) -> None:
        self._call(submission, lambda: submission.outputs.put_nowait(output))

    def _fail(self, submission: Submission, failure: EngineFailure) -> None:
        self._resolve(submission, APIError(503, str(failure), None, "engine_unavailable"))
        self._send(submission, failure)

    @staticmethod
    def _call(submission: Submission, callback: Callable[[], None]) -> None:
        try:
            submission.loop.call_soon_threadsafe(callback)
        except RuntimeError:  # the event loop is closed: nobody is waiting any more
            pass


def _token_budget(prompt_tokens: int, max_tokens: int | None, context_length: int) -> int:
    """``max_tokens``, or what the context leaves; a prompt that does not fit is refused (never truncated)."""
    if context_length and prompt_tokens >= context_length:
        raise APIError(400, f"the prompt has {prompt_tokens} tokens; this model's context is {context_length} "
                            f"tokens", "messages", "context_length_exceeded")
    if max_tokens is None:
        return context_length - prompt_tokens if context_length else _NO_CONTEXT_DEFAULT
    if context_length and prompt_tokens + max_tokens > context_length:
        raise APIError(400, f"the prompt has {prompt_tokens} tokens and max_tokens is {max_tokens}: "
                            f"{prompt_tokens + max_tokens} tokens exceed this model's context of {context_length}",
                       "max_tokens", "context_length_exceeded")
    return max_tokens


#: max_tokens for a request that gives none, on a model whose context length is unknown
_NO_CONTEXT_DEFAULT = 1024


def _engine_refusal(err: Exception) -> APIError:
    if type(err).__name__ == "QueueFullError":
        return APIError(429, "the server's queue is full; retry later", None, "queue_full")
    if isinstance(err, ValueError):
        return APIError(400, str(err).strip().splitlines()[0] if str(err).strip() else "invalid request", None,
                        "invalid_value")
    traceback.print_exception(err, file=sys.stderr)
    return APIError(500, "internal server error (see the server's log)", None, "internal_error")


def load_engine(settings: GenerateSettings, max_batch: int, max_queue: int, depth_policy: str, quiet: bool,
                prefix_caching: bool = True) -> Any:
    """Runs on the engine thread: the decoder of ``generate`` wrapped in the batch engine (reusing the cache
    entries of shared prompt prefixes where that is exact, unless ``prefix_caching`` is False)."""
    from spec_fast import BatchEngine
    from spec_fast.api import load_decoder

    def note(message: str) -> None:
        print(f"spec-fast: {message}", file=sys.stderr, flush=True)

    decoder, tokenizer = load_decoder(settings, notify=None if quiet else note)
    # the HTTP side already holds in-flight requests to max_batch + max_queue (429 beyond), so the engine's
    # own waiting limit is never the one that binds
    engine = BatchEngine(decoder, max_batch_size=max_batch, max_waiting=max_batch + max_queue, tokenizer=tokenizer,
                         eos_token_id=tokenizer.eos_token_id, depth_policy=depth_policy,
                         prefix_cache_tokens=None if prefix_caching else 0)
    if not quiet:
        note(f"model loaded: {settings.model.describe()}, draft {settings.draft}, strategy "
             f"{settings.strategy.label()} (depth {depth_policy}), batch {max_batch}, queue {max_queue}, "
             f"prefix caching {'on' if engine.prefix_cache is not None else 'off'}")
    return LoadedModel(engine=engine, tokenizer=tokenizer, context_length=int(decoder.context_length),
                       strategy_label=decoder.label, draft=settings.draft)
