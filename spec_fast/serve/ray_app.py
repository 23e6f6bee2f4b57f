"""The server's FastAPI app as a Ray Serve deployment: each replica loads the model once, runs its own engine
thread and answers exactly as ``spec-fast serve`` does (the same :func:`~spec_fast.serve.app.create_app`).

Differences from the single process, all in how Ray runs it:

* the replica loads the model in its constructor, so Ray routes nothing to it before it can answer (and a
  model that fails to load fails the replica, with its error line in the deployment's status);
* Ray's router sends a replica at most ``max_batch`` requests at once and queues the rest itself, up to
  ``max_queue`` per replica; past that Ray answers 503 (not the single server's 429 error object);
* every response carries an ``x-spec-fast-replica`` header naming the replica that made it;
* ``check_health`` fails once the engine thread has stopped, and Ray replaces the replica;
* Ray gives a replica ``--shutdown-timeout`` seconds to finish its requests before it stops it.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.serve import Application
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from spec_fast.serve.app import REPLICA_HEADER, ServeConfig, create_app
from spec_fast.settings import GenerateSettings

__all__ = ["ReplicaSpec", "SpecFastReplica", "build_application", "DEPLOYMENT_NAME"]

#: the deployment's name in Ray (``serve status``; replica actors are named after it)
DEPLOYMENT_NAME = "SpecFastServer"
#: how often Ray asks a replica whether its engine thread still runs (Ray's default is 10 s)
_HEALTH_PERIOD_S = 5.0


@dataclass(frozen=True)
class ReplicaSpec:
    """Everything a replica needs, sent to it by Ray (so it must pickle): the checked model settings and the
    server's own options."""

    settings: GenerateSettings
    model_name: str
    max_batch: int
    max_queue: int
    depth_policy: str
    api_key: str | None
    quiet: bool
    shutdown_timeout_s: float
    prefix_caching: bool = True


@serve.ingress()
class SpecFastReplica:
    """One replica: the model (loaded in ``__init__``), then the app (``__serve_build_asgi_app__``, which Ray
    calls after the constructor and serves through its HTTP proxy)."""

    def __init__(self, spec: ReplicaSpec) -> None:
        from spec_fast.serve.worker import load_engine

        self._spec = spec
        self._server: Any = None
        try:
            # Ray runs a replica's constructor on its user-code thread, so its own pings go on meanwhile
            self._model = load_engine(spec.settings, spec.max_batch, spec.max_queue, spec.depth_policy, spec.quiet,
                                      spec.prefix_caching)
        except Exception as err:
            # the marker lets the CLI find this line in Ray's status message, which holds the traceback
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            print(f"spec-fast replica: {first}", file=sys.stderr, flush=True)
            raise RuntimeError(f"spec-fast replica: the model failed to load: {first}") from err

    def __serve_build_asgi_app__(self) -> FastAPI:
        model = self._model
        spec = self._spec
        app = create_app(lambda: model, ServeConfig(model_name=spec.model_name, max_batch=spec.max_batch,
                                                    max_queue=spec.max_queue, api_key=spec.api_key))
        self._server = app.state.server
        _start_when_engine_ready(app)
        app.add_middleware(_ReplicaHeader, replica=serve.get_replica_context().replica_id.unique_id)
        return app

    def check_health(self) -> None:
        """Ray calls this every few seconds; raising makes Ray replace the replica."""
        server = self._server
        if server is not None and server.worker.finished.is_set() and server.accepting:
            raise RuntimeError("the replica's engine thread has stopped")


def _start_when_engine_ready(app: FastAPI) -> None:
    """Make the app's start-up (which Ray awaits before it routes to the replica) also wait for the engine
    thread to take the loaded model, so the first request never sees ``/health`` 503."""
    inner = app.router.lifespan_context
    worker = app.state.server.worker

    @asynccontextmanager
    async def lifespan(asgi_app: Any) -> AsyncIterator[Any]:
        async with inner(asgi_app) as state:
            # the model is already loaded: the engine thread only has to start, so this ends in moments
            while not worker.ready.is_set() and not worker.finished.is_set():
                await asyncio.sleep(0.01)
            if not worker.ready.is_set():
                raise RuntimeError(f"the engine thread failed: {worker.load_error!r}")
            yield state

    app.router.lifespan_context = lifespan


class _ReplicaHeader:
    """ASGI middleware: every response names the replica that made it (``x-spec-fast-replica``), so that an
    operator (and the tests) can see how Ray spread the requests; the body is the single server's."""

    def __init__(self, app: ASGIApp, replica: str) -> None:
        self.app = app
        self.header = (REPLICA_HEADER.encode(), replica.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_header(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, send_with_header if scope["type"] == "http" else send)


def build_application(spec: ReplicaSpec, replicas: int | None, autoscale: tuple[int, int] | None) -> Application:
    """The deployment bound to ``spec``: ``replicas`` fixed replicas, or an autoscaling range ``(min, max)``
    that aims at ``max_batch`` requests in flight per replica (a full batch)."""
    threads = int(spec.settings.threads or 1)
    options: dict[str, Any] = {
        "name": DEPLOYMENT_NAME,
        # one Ray CPU per torch thread: Ray places replicas on nodes by free CPUs, one replica per core here
        "ray_actor_options": {"num_cpus": threads},
        # a replica with a full batch counts as busy: Ray's router sends the next request to another replica
        # (it prefers replicas on the proxy's own node until they are busy, so a larger number would keep a
        # cluster's other nodes idle) and holds the overflow in its own queue, --max-queue per replica
        "max_ongoing_requests": spec.max_batch,
        "max_queued_requests": spec.max_queue * (autoscale[1] if autoscale is not None else (replicas or 1)),
        "graceful_shutdown_timeout_s": spec.shutdown_timeout_s,
        "health_check_period_s": _HEALTH_PERIOD_S,
    }
    if autoscale is not None:
        options["autoscaling_config"] = {"min_replicas": autoscale[0], "initial_replicas": autoscale[0],
                                         "max_replicas": autoscale[1], "target_ongoing_requests": spec.max_batch}
    else:
        options["num_replicas"] = replicas or 1
    deployment = serve.deployment(**options)(SpecFastReplica)
    return deployment.bind(spec)
