"""The FastAPI application: OpenAI-compatible routes over one :class:`~spec_fast.serve.worker.EngineWorker`.

``create_app(load, config)`` starts the engine thread (which calls ``load()``) when the app starts, so the
HTTP side answers at once: ``/health`` says 503 until the model is loaded, then 200. Routes:
``GET /health``, ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``,
``GET /metrics``. Admission control happens here, before the engine: at most ``max_batch + max_queue``
requests are in flight; one more is answered 429 at once.
"""

from __future__ import annotations

import asyncio
import hmac
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from spec_fast.serve.errors import APIError, BodyLimit, install_error_handlers, send_error
from spec_fast.serve.generation import Generation, sse
from spec_fast.serve.metrics import CONTENT_TYPE, ServeMetrics
from spec_fast.serve.protocol import ChatCompletionRequest, CompletionRequest, GenerationParams, now
from spec_fast.serve.worker import Admission, EngineWorker, LoadedModel, Submission

#: the response header that names the Ray Serve replica which answered (spec_fast/serve/ray_app.py)
REPLICA_HEADER = "x-spec-fast-replica"

__all__ = ["ServeConfig", "create_app", "REPLICA_HEADER"]

#: OpenAI's default temperature (1.0), which vLLM also uses; ``temperature: 0`` asks for greedy decoding
DEFAULT_TEMPERATURE = 1.0
#: How long the app's shutdown waits for the engine thread to end its current step
_ENGINE_STOP_S = 10.0
_ROUTES = ("/health", "/v1/models", "/v1/chat/completions", "/v1/completions", "/metrics")


@dataclass(frozen=True)
class ServeConfig:
    """``model_name``: the id clients send as ``model`` (and ``/v1/models`` lists); ``api_key``: the bearer
    token ``/v1/`` routes require (None: open); ``on_load_error``: called once if the model fails to load."""

    model_name: str
    max_batch: int = 4
    max_queue: int = 64
    api_key: str | None = None
    on_load_error: Callable[[BaseException], None] | None = None


class _ServerState:
    """What the routes share: the worker, the metrics and the count of requests in flight."""

    def __init__(self, load: Callable[[], LoadedModel], config: ServeConfig) -> None:
        self.config = config
        self.metrics = ServeMetrics()
        self.worker = EngineWorker(load, on_step=lambda e: self.metrics.set_batch(e.num_running, e.num_waiting))
        self.in_flight = 0
        self.started = now()
        self.accepting = True
        self.loop: asyncio.AbstractEventLoop | None = None

    def begin_shutdown(self, grace_s: float) -> None:
        """From the signal handler: refuse new requests (503) and abort those in flight after ``grace_s``
        seconds, so that every response ends with an error object instead of a cut connection."""
        self.accepting = False
        loop = self.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(loop.call_later, grace_s, self.worker.abort_all,
                                      "the server shut down before the request finished")

    def ready_model(self) -> LoadedModel:
        model = self.worker.model
        if model is None or not self.worker.ready.is_set():
            raise APIError(503, "the model is loading", None, "model_loading")
        if self.worker.finished.is_set() or not self.accepting:
            raise APIError(503, "the server is shutting down", None, "shutting_down")
        return model

    def check_model_name(self, name: str | None) -> None:
        if name is not None and name != self.config.model_name:
            raise APIError(404, f"the model {name!r} does not exist; this server serves {self.config.model_name!r}",
                           "model", "model_not_found")

    async def start(self, params: GenerationParams, model: LoadedModel, tokenize: Callable[[Any], list[int]],
                    request: Request, kind: str) -> Response:
        """Admit one request, hand it to the engine thread and answer (a stream or one JSON object)."""
        from spec_fast.decoding import SamplingParams

        try:
            sampling = SamplingParams(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                                      seed=params.seed)
        except ValueError as err:
            raise APIError(400, str(err), None, "invalid_value") from None
        if self.in_flight >= self.config.max_batch + self.config.max_queue:
            raise APIError(429, f"the server is busy ({self.in_flight} requests in flight); retry later", None,
                           "queue_full")
        arrival = time.monotonic()
        submission = Submission(tokenize=tokenize, sampling=sampling, max_tokens=params.max_tokens,
                                stop=params.stop, loop=asyncio.get_running_loop(),
                                admitted=asyncio.get_running_loop().create_future())
        self.in_flight += 1
        handed_over = False
        try:
            self.worker.submit(submission)
            admission: Admission = await submission.admitted
            self.metrics.observe_admitted(admission.prompt_tokens)
            generation = Generation(submission, admission, params, arrival, model, self.config.model_name, kind,
                                    self.metrics, self.worker.abort)
            if params.stream:
                handed_over = True
                return _EventStream(_events(generation), on_close=lambda: self._finish(generation))
            return JSONResponse(await generation.collect(request))
        finally:
            if not submission.admitted.done():  # cancelled while waiting for admission
                self.worker.abort(submission)
            if not handed_over:
                self.in_flight -= 1

    def _finish(self, generation: Generation) -> None:
        generation.close()
        self.in_flight -= 1


async def _events(generation: Generation) -> AsyncIterator[str]:
    async for chunk in generation.stream():
        yield sse(chunk)
    yield "data: [DONE]\n\n"


class _EventStream(StreamingResponse):
    """Server-sent events that call ``on_close`` once the response ends, however it ends: completed, failed,
    or cancelled because the client disconnected (Starlette cancels a streaming response on disconnect,
    possibly before its first event, when a ``finally`` inside the generator would never run). ``on_close``
    aborts an unfinished request before the engine's next step and frees its slot."""

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


def create_app(load: Callable[[], LoadedModel], config: ServeConfig) -> FastAPI:
    server = _ServerState(load, config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        server.loop = asyncio.get_running_loop()
        server.worker.start()
        watcher = asyncio.create_task(_watch_loading(server))
        try:
            yield
        finally:
            watcher.cancel()
            if not server.worker.stop(_ENGINE_STOP_S):
                print("spec-fast: the engine thread did not stop in time", file=sys.stderr)

    app = FastAPI(title="spec-fast", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server  # the CLI calls server.begin_shutdown on SIGTERM
    install_error_handlers(app)

    @app.get("/health")
    async def health() -> Response:
        server.ready_model()
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models() -> Response:
        card: dict[str, Any] = {"id": config.model_name, "object": "model", "created": server.started,
                                "owned_by": "spec-fast"}
        if server.worker.model is not None:
            card["max_model_len"] = server.worker.model.context_length or None
        return JSONResponse({"object": "list", "data": [card]})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(server.metrics.render(), media_type=CONTENT_TYPE)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        from spec_fast.api import prompt_ids, prompt_messages
        from spec_fast.settings import SettingError

        model = server.ready_model()
        server.check_model_name(body.model)
        params = body.params(DEFAULT_TEMPERATURE)
        try:
            messages = prompt_messages(body.conversation())
        except SettingError as err:
            raise APIError(400, err.message, "messages", "invalid_value") from None
        return await server.start(params, model, lambda tokenizer: prompt_ids(tokenizer, messages), request,
                                  "chat")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        from spec_fast.api import prompt_ids

        model = server.ready_model()
        server.check_model_name(body.model)
        params = body.params(DEFAULT_TEMPERATURE)
        prompt = body.prompt_text_or_ids()
        # token ids go to the engine as given (it refuses ids outside the vocabulary: 400)
        return await server.start(params, model,
                                  lambda tokenizer: prompt if isinstance(prompt, list) else prompt_ids(tokenizer, prompt),
                                  request, "text")

    app.add_middleware(_Gate, server=server)
    app.add_middleware(BodyLimit)  # outermost: a body too large is refused before anything reads it
    return app


async def _watch_loading(server: _ServerState) -> None:
    """Tell the CLI once if the model failed to load (it then stops the server)."""
    while not server.worker.ready.is_set():
        if server.worker.finished.is_set() and server.worker.load_error is not None:
            if server.config.on_load_error is not None:
                server.config.on_load_error(server.worker.load_error)
            return
        await asyncio.sleep(0.05)


class _Gate:
    """ASGI middleware: the API key on ``/v1/`` routes (401 before the body is read) and the HTTP request
    counter of ``/metrics`` (by route and status)."""

    def __init__(self, app: ASGIApp, server: _ServerState) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        endpoint = path if path in _ROUTES else "other"
        status = [500]

        async def recording_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            key = self.server.config.api_key
            if key is not None and path.startswith("/v1/") and not _authorized(scope, key):
                await send_error(recording_send, APIError(
                    401, "missing or wrong API key: send 'Authorization: Bearer <key>'", None, "invalid_api_key"))
                return
            await self.app(scope, receive, recording_send)
        finally:
            self.server.metrics.observe_http(endpoint, status[0])


def _authorized(scope: Scope, key: str) -> bool:
    header = dict(scope.get("headers", ())).get(b"authorization", b"").decode("latin-1")
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())
